"""Migrate the team project's database, make a team a billing customer, print what happened.

    TEAM_PROJECT_DB=/tmp/x.sqlite3 DJANGO_SETTINGS_MODULE=tests.team_project.settings \
        python -m tests.team_project.check

The last line of stdout is a JSON object of observed facts; the test asserts on them (this
script checks nothing itself, so a wrong fact shows up as a wrong value, not a crash here).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import django


def facts() -> dict[str, Any]:
    from django.apps import apps
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)

    from billing_integration.customers import customer_identifier, get_or_create_customer
    from billing_integration.models import Customer, OutboxEntry, Subscription
    from billing_integration.outbox import from_remote

    team_model = apps.get_model("teams", "Team")
    team = team_model.objects.create(name="Acme", email="billing@acme.test")
    other = team_model.objects.create(name="Other", email="other@acme.test")

    customer, created = get_or_create_customer(team)
    again, created_again = get_or_create_customer(team)
    customer = Customer.objects.select_related("subscriber").get(pk=customer.pk)

    with from_remote():  # as a pull or an event would store it: no outbox entry
        sub = Subscription.objects.create(
            customer=customer, remote_id=uuid.uuid4(), status="published"
        )

    table = Customer._meta.db_table
    column = Customer._meta.get_field("subscriber").column
    with connection.cursor() as cursor:
        relations = connection.introspection.get_relations(cursor, table)
    referenced = relations.get(column)

    # a user passed where the subscriber is a team: refused before anything is written
    from django.contrib.auth import get_user_model

    from billing_integration.billing import checkout_url

    user = get_user_model().objects.create_user("alice")
    customers = Customer.objects.count()
    try:
        checkout_url(user, "Pro", "months-1", "XOF")
        user_refused = "not refused"
    except Exception as exc:  # the kind of error is a fact too
        user_refused = f"{type(exc).__name__}: {exc}"

    return {
        "user_refused": user_refused,
        "customers_after_refusal": Customer.objects.count() - customers,
        "subscriber_setting": settings.BILLING["SUBSCRIBER_MODEL"],
        "field_target": Customer._meta.get_field("subscriber").related_model._meta.label,
        "fk_column": column,
        "fk_referenced_table": referenced[1] if referenced else None,
        "fk_referenced_column": referenced[0] if referenced else None,
        "team_table": team_model._meta.db_table,
        "team_pk": team.pk,
        "created": created,
        "created_again": created_again,
        "same_customer": again.pk == customer.pk,
        "subscriber_is_team": isinstance(customer.subscriber, team_model)
        and customer.subscriber.pk == team.pk,
        "reverse_accessor": team_model.objects.get(pk=team.pk).billing_customer.pk == customer.pk,
        "identifier": customer.identifier,
        "identifier_rule": customer_identifier(team),
        "first_name": customer.first_name,
        "email": customer.email,
        "outbox_entries": OutboxEntry.objects.count(),
        "for_subscriber": [s.pk for s in Subscription.objects.for_subscriber(team)],
        "for_other_team": [s.pk for s in Subscription.objects.for_subscriber(other)],
        "subscription_pk": sub.pk,
    }


def main() -> None:
    django.setup()
    print(json.dumps(facts()))


if __name__ == "__main__":
    main()
