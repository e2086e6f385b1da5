"""A pull is the service's present: against the sandbox over real HTTP, a version of our own
clock never makes a pulled row stale, and a resource whose pull fails never keeps the others
from being pulled (``billing_sync``, ``sync_all``)."""

from __future__ import annotations

import io
import json
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from billing_integration.models import Customer, EventState, Subscription, WebhookEvent
from billing_integration.sync.pull import pull_customers, pull_products, pull_subscriptions
from billing_integration.sync.tasks import sync_all

from ..webhooks.conftest import as_meta, sign

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sandbox(billing_sandbox, eager):
    from billing_integration.client import reset_client

    reset_client()
    return billing_sandbox


def test_a_version_of_our_clock_never_makes_a_pulled_row_stale(sandbox, client):
    sandbox.seed(customers=1, subscriptions=1)
    pull_products(), pull_customers(), pull_subscriptions()
    sub = Subscription.objects.get()
    assert sub.status == "published" and not sub.remote_updated_ours
    # An event without any date of its own, signed by a delivery clock 30 s ahead of the
    # service's: its version is that signed timestamp, a time of ours.
    body = json.dumps(
        {"id": "evt-undated", "type": "subscription.renewal", "data": {"id": str(sub.remote_id)}}
    ).encode()
    headers = sign(body, sandbox.webhook_secret, timestamp=int(time.time()) + 30)
    response = client.post(
        reverse("billing_integration:webhook"),
        data=body,
        content_type="application/json",
        **as_meta(headers),
    )
    assert response.status_code == 200
    event = WebhookEvent.objects.get(event_id="evt-undated")
    assert (event.state, event.outcome) == (EventState.PROCESSED, "applied")
    sub.refresh_from_db()
    assert sub.remote_updated_ours
    # Then the service pauses it: its date_updated is a few seconds behind our clock.
    sandbox.trigger("subscription.paused", str(sub.remote_id))
    remote = sandbox.object("subscription", str(sub.remote_id))
    assert remote["status"] == "paused"
    counts = pull_subscriptions()
    assert (counts.updated, counts.stale) == (1, 0)
    sub.refresh_from_db()
    assert sub.status == "paused" and not sub.remote_updated_ours
    assert sub.remote_updated.isoformat().startswith(remote["date_updated"][:19])
    # Now the stored version is the service's own: an older pulled row is stale again.
    assert pull_subscriptions().unchanged == 1


def fail_products(sandbox) -> None:
    sandbox.faults(operation="list_products", error_rate=1.0, status=400)


def test_billing_sync_pulls_the_other_resources_when_one_fails(sandbox):
    sandbox.seed(customers=2, subscriptions=1)
    pull_products()  # the subscription's product, so it links
    fail_products(sandbox)
    sandbox.clear_requests()
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError, match="pull failed for products"):
        call_command("billing_sync", "--no-progress", stdout=out, stderr=err)
    assert "products: failed:" in err.getvalue()
    assert "customers: 2 created" in out.getvalue()
    assert "subscriptions: 1 created" in out.getvalue()
    asked = {r["operation"] for r in sandbox.requests()}
    assert {"list_products", "list_customers", "list_subscriptions"} <= asked
    assert Customer.objects.count() == 2 and Subscription.objects.count() == 1


def test_sync_all_pulls_the_other_resources_then_raises(sandbox):
    from billing_integration.exceptions import BillingError

    sandbox.seed(customers=2)
    fail_products(sandbox)
    with pytest.raises(BillingError):
        sync_all()
    assert Customer.objects.count() == 2
