"""Every event type, triggered in the sandbox and delivered over HTTP to a live server."""

from __future__ import annotations

from collections import defaultdict

import pytest

from billing_integration.models import (
    Customer,
    EventState,
    Invoice,
    Payment,
    Refund,
    Subscription,
    WebhookEvent,
)
from billing_integration.timestamps import parse_timestamp
from billing_integration.webhooks import signals
from billing_integration.webhooks.types import CANONICAL_TYPES

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def received():
    """Signals received, by signal name: [(kwargs), ...]."""
    got: dict[str, list[dict]] = defaultdict(list)
    receivers = []
    for name in [t.replace(".", "_") for t in CANONICAL_TYPES] + ["billing_event_received"]:

        def receiver(sender, _name=name, **kwargs):
            got[_name].append(kwargs)

        getattr(signals, name).connect(receiver, weak=False)
        receivers.append((getattr(signals, name), receiver))
    yield got
    for signal, receiver in receivers:
        signal.disconnect(receiver)


@pytest.fixture
def hooked(billing_sandbox, live_server, eager):
    """The sandbox delivering to this test's live server; processing inline."""
    billing_sandbox.set_callback(live_server.url + "/billing/webhooks/")
    return billing_sandbox


@pytest.fixture
def remote_subscription(hooked):
    """A customer with a subscription in the sandbox (not known locally yet)."""
    hooked.seed(customers=1, subscriptions=1)
    sub = hooked.objects("subscription")[0]
    return sub


def deliver(sandbox, event_type: str, obj: str, reason: str | None = None) -> dict:
    envelope = sandbox.trigger(event_type, obj, reason)
    assert sandbox.wait_for_deliveries(timeout=20)
    return envelope


def test_subscription_events(hooked, remote_subscription, received):
    sub_id = remote_subscription["id"]
    before = hooked.object("subscription", sub_id)

    renewal = deliver(hooked, "subscription.renewal", sub_id)
    event = WebhookEvent.objects.get(event_id=renewal["id"])
    assert event.state == EventState.PROCESSED and event.outcome == "applied"
    local = Subscription.objects.get(remote_id=sub_id)
    # Unknown locally before the event: created from the data, its customer pulled once.
    assert local.customer is not None and str(local.customer.remote_id) == before["customer"]
    assert local.cycle_start_date == parse_timestamp(renewal["data"]["cycle_start_date"])
    assert local.cycle_end_date == parse_timestamp(renewal["data"]["cycle_end_date"])
    assert local.next_billing_date == parse_timestamp(renewal["data"]["next_billing_date"])
    assert local.cycle_end_date > parse_timestamp(before["cycle_end_date"])
    assert local.remote_updated == parse_timestamp(renewal["data"]["date_updated"])
    [call] = received["subscription_renewal"]
    assert call["subscription"].pk == local.pk and call["event"].pk == event.pk
    assert call["event_type"] == "subscription.renewal"

    deliver(hooked, "subscription.paused", sub_id)
    local.refresh_from_db()
    assert local.status == "paused"
    assert len(received["subscription_paused"]) == 1

    deliver(hooked, "subscription.canceled", sub_id)
    local.refresh_from_db()
    assert local.status == "canceled" and local.auto_renew is False
    assert len(received["subscription_canceled"]) == 1
    assert len(received["billing_event_received"]) == 3
    # Nothing was pushed back to the service.
    assert hooked.requests("update_subscription") == []


@pytest.mark.parametrize(
    ("event_type", "status"),
    [
        ("payment.completed", "completed"),
        ("payment.failed", "failed"),
        ("payment.canceled", "canceled"),
    ],
)
def test_payment_events(hooked, remote_subscription, received, event_type, status):
    sub_id = remote_subscription["id"]
    envelope = deliver(
        hooked, event_type, sub_id, "insufficient_funds" if status == "failed" else None
    )
    event = WebhookEvent.objects.get(event_id=envelope["id"])
    assert event.state == EventState.PROCESSED, event.error
    payment = Payment.objects.get(remote_id=envelope["data"]["id"])
    assert payment.status == status
    assert payment.amount == 5000 and payment.currency == envelope["data"]["currency"]
    # The subscription was not known locally: pulled (with its customer) through the client.
    assert payment.subscription is not None and str(payment.subscription.remote_id) == sub_id
    assert payment.customer is not None and payment.customer == payment.subscription.customer
    assert payment.product_remote_id is not None
    assert payment.subscription.last_payment_status == status
    if status == "failed":
        assert payment.failure_reason == "insufficient_funds"
    [call] = received[event_type.replace(".", "_")]
    assert call["payment"].pk == payment.pk and call["subscription"].pk == payment.subscription.pk
    assert len(hooked.requests("list_subscriptions")) >= 1


def test_refund_events(hooked, remote_subscription, received):
    sub_id = remote_subscription["id"]
    paid = deliver(hooked, "payment.completed", sub_id)
    initiated = deliver(hooked, "refund.initiated", paid["data"]["id"])
    refund = Refund.objects.get(remote_id=initiated["data"]["id"])
    assert refund.status == "initiated"
    assert refund.payment == Payment.objects.get(remote_id=paid["data"]["id"])
    assert refund.subscription == refund.payment.subscription
    assert refund.customer == refund.payment.customer
    approved = deliver(hooked, "refund.approved", refund.remote_id.__str__())
    refund.refresh_from_db()
    assert refund.status == "approved" and approved["data"]["id"] == str(refund.remote_id)
    assert [c["refund"].pk for c in received["refund_approved"]] == [refund.pk]

    second = deliver(hooked, "refund.initiated", paid["data"]["id"])
    rejected = deliver(hooked, "refund.rejected", second["data"]["id"])
    other = Refund.objects.get(remote_id=rejected["data"]["id"])
    assert other.status == "rejected" and other.pk != refund.pk
    assert len(received["refund_initiated"]) == 2 and len(received["refund_rejected"]) == 1


@pytest.mark.parametrize(
    ("event_type", "status"),
    [
        ("invoice.paid", "paid"),
        ("invoice.voided", "void"),
        ("invoice.marked_uncollectable", "uncollectable"),
        ("invoice.deleted", "deleted"),
    ],
)
def test_invoice_events(hooked, remote_subscription, received, event_type, status):
    sub_id = remote_subscription["id"]
    deliver(hooked, "subscription.renewal", sub_id)  # makes the subscription known locally
    envelope = deliver(hooked, event_type, sub_id)
    invoice = Invoice.objects.get(remote_id=envelope["data"]["id"])
    assert invoice.status == status
    assert invoice.subscription == Subscription.objects.get(remote_id=sub_id)
    assert invoice.customer == invoice.subscription.customer
    assert invoice.product == invoice.subscription.product or invoice.product is None
    assert invoice.period_end is not None and invoice.amount is not None
    [call] = received[event_type.replace(".", "_")]
    assert call["invoice"].pk == invoice.pk


def test_redelivered_event_is_applied_once(hooked, remote_subscription, received, client):
    """The sandbox's own retry after a lost answer: same event id, applied once."""
    import json

    from billing_integration.testing import sign_webhook

    envelope = deliver(hooked, "payment.completed", remote_subscription["id"])
    body = json.dumps(envelope).encode()
    headers = sign_webhook(body, hooked.webhook_secret, msg_id=envelope["id"])
    response = client.post(
        "/billing/webhooks/",
        data=body,
        content_type="application/json",
        **{"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()},
    )
    assert response.status_code == 200 and response.json()["status"] == "duplicate"
    assert WebhookEvent.objects.filter(event_id=envelope["id"]).count() == 1
    assert Payment.objects.count() == 1
    assert len(received["payment_completed"]) == 1


def test_every_canonical_type_is_covered_by_the_sandbox(billing_sandbox):
    from billing_integration.sandbox.events import EVENT_TYPES

    assert set(EVENT_TYPES) == set(CANONICAL_TYPES)


def test_customer_pulled_once(hooked, remote_subscription):
    sub_id = remote_subscription["id"]
    deliver(hooked, "subscription.renewal", sub_id)
    deliver(hooked, "subscription.renewal", sub_id)
    assert Customer.objects.count() == 1
    pulls = [r for r in hooked.requests("list_customers") if r["query"].get("offset") == "0"]
    assert len(pulls) == 1  # one pull (its pages: the customer's, then the empty one)
