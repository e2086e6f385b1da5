"""Migration 0008 normalises the statuses stored before the allow-list."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("billing_integration", "0007_service_binding")]
AFTER = [("billing_integration", "0008_normalise_subscription_statuses")]


def test_stored_statuses_are_stripped_and_lower_cased():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    apps = executor.loader.project_state(BEFORE).apps
    Subscription = apps.get_model("billing_integration", "Subscription")
    rows = {
        s: Subscription.objects.create(status=s).pk
        for s in ["Published ", " CANCELED", "paused", ""]
    }
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(AFTER)
    apps = executor.loader.project_state(AFTER).apps
    Subscription = apps.get_model("billing_integration", "Subscription")
    stored = {s: Subscription.objects.get(pk=pk).status for s, pk in rows.items()}
    assert stored == {
        "Published ": "published",
        " CANCELED": "canceled",
        "paused": "paused",
        "": "",
    }
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
