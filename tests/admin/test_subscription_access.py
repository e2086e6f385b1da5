"""Subscriptions with a status the app does not know: stored as received (normalised), logged
once, flagged in the admin (a marker and a filter), and granting no access."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from billing_integration.models import Customer, Subscription
from billing_integration.sync.pull import upsert_subscriptions
from billing_integration.timestamps import format_timestamp

from .conftest import make_product, make_subscription

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:billing_integration_subscription_changelist")


def resource(status: str | None, customer: Customer) -> dict:
    data = {
        "id": str(uuid.uuid4()),
        "customer": str(customer.remote_id),
        "cycle_end_date": format_timestamp(timezone.now() + timedelta(days=30)),
        "selected_currency": "XOF",
        "selected_billing_cycle": "months-1",
    }
    if status is not None:
        data["status"] = status
    return data


@pytest.fixture
def customer(db) -> Customer:
    return Customer.objects.create(identifier="c-1", remote_id=uuid.uuid4(), sync_state="synced")


def test_an_unknown_status_is_stored_normalised_and_logged_once(customer, caplog, settings):
    from billing_integration.mapping.common import log_once

    log_once.cache_clear()  # a fresh process: nothing logged yet
    with caplog.at_level(logging.WARNING, logger="billing_integration.mapping"):
        counts = upsert_subscriptions(
            [
                resource(" Past_Due ", customer),
                resource("PAST_DUE", customer),
                resource("published", customer),
                resource("Canceled", customer),
            ]
        )
        upsert_subscriptions([resource("past_due", customer)])
    assert counts.created == 4
    assert sorted(Subscription.objects.values_list("status", flat=True)) == [
        "canceled",
        "past_due",
        "past_due",
        "past_due",
        "published",
    ]
    unknown = [r for r in caplog.records if "Unknown subscription status" in r.getMessage()]
    assert len(unknown) == 1 and "'past_due'" in unknown[0].getMessage()
    # canceled with its cycle not over: the grace period (ACCESS_AFTER_CANCEL "period_end")
    active = Subscription.objects.active().values_list("status", flat=True)
    assert sorted(active) == ["canceled", "published"]
    settings.BILLING = {**settings.BILLING, "ACCESS_AFTER_CANCEL": "immediately"}
    assert list(Subscription.objects.active().values_list("status", flat=True)) == ["published"]
    assert set(Subscription.objects.unknown_status().values_list("status", flat=True)) == {
        "past_due"
    }


def test_the_admin_marks_unknown_statuses_and_filters_by_access(admin_client):
    product = make_product(remote=True, status="published")
    live = make_subscription(product)
    canceled = make_subscription(product, status="canceled")
    odd = make_subscription(product, status="pending")
    blank = make_subscription(product, status="")

    html = admin_client.get(CHANGELIST).content.decode()
    assert html.count("unknown status — no access") == 1
    assert html.count("no status — no access") == 1
    assert html.count("billing-badge-unknown-status") == 2

    def listed(query: str) -> set[int]:
        response = admin_client.get(CHANGELIST + query)
        assert response.status_code == 200
        return {s.pk for s in response.context["cl"].result_list}

    assert listed("?access=active") == {live.pk}
    assert listed("?access=inactive") == {canceled.pk, odd.pk, blank.pk}
    assert listed("?access=unknown") == {odd.pk, blank.pk}

    page = admin_client.get(
        reverse("admin:billing_integration_subscription_change", args=[odd.pk])
    ).content.decode()
    assert "unknown status — no access" in page
    page = admin_client.get(
        reverse("admin:billing_integration_subscription_change", args=[live.pk])
    ).content.decode()
    assert "no access" not in page


def test_the_product_list_counts_subscriptions_by_the_active_rule(admin_client):
    product = make_product(remote=True, status="published")
    make_subscription(product)
    for status in ("canceled", "pending", "past_due", "", "PUBLISHED"):
        make_subscription(product, status=status)
    lapsed = make_subscription(product)
    Subscription.objects.filter(pk=lapsed.pk).update(
        cycle_end_date=timezone.now() - timedelta(days=1)
    )
    response = admin_client.get(reverse("admin:billing_integration_product_changelist"))
    (row,) = response.context["cl"].result_list
    assert row._subscriber_count == 1
