"""An event naming an object unknown locally, while the settings point at another service
than the mirror's (``billing_integration.service``): the pull is refused before any request,
the event is marked failed with the reason (not applied half-way), and replays after a
relink."""

from __future__ import annotations

import json
import uuid
from io import StringIO

import pytest
from django.core.management import call_command

from billing_integration.models import EventState, Payment, Subscription, WebhookEvent
from billing_integration.webhooks.ingest import store_delivery
from billing_integration.webhooks.processing import process_event, replay_events
from billing_integration.webhooks.verification import Verification

from .conftest import envelope, payment_data

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_pull_of_an_unknown_subscription_is_refused_then_replayed_after_relink(
    billing_sandbox, settings
):
    from billing_integration.sync.pull import pull_products

    billing_sandbox.seed(customers=1, subscriptions=1)
    remote = billing_sandbox.objects("subscription")[0]
    pull_products()  # the mirror now belongs to the sandbox
    moved = billing_sandbox.base_url.replace("127.0.0.1", "localhost")
    settings.BILLING = {**settings.BILLING, "BASE_URL": moved}
    billing_sandbox.clear_requests()

    data = payment_data(
        uuid.uuid4(),
        status="completed",
        subscription=remote["id"],
        customer=remote["customer"],
        product=remote["product"],
    )
    payload = envelope("payment.completed", data)
    stored = store_delivery(
        json.dumps(payload).encode(), {}, Verification("signature", payload["id"])
    )
    result = process_event(stored.event.pk)

    event = WebhookEvent.objects.get(pk=stored.event.pk)
    assert result.state == event.state == EventState.FAILED and not result.retryable
    assert "billing_service relink" in event.error and moved in event.error
    assert billing_sandbox.requests() == []
    assert not Payment.objects.exists() and not Subscription.objects.exists()

    call_command("billing_service", "relink", "--yes", stdout=StringIO())
    assert replay_events(WebhookEvent.objects.filter(state=EventState.FAILED)) == {"processed": 1}
    payment = Payment.objects.get()
    assert payment.subscription is not None
    assert str(payment.subscription.remote_id) == remote["id"]
    assert billing_sandbox.requests("list_subscriptions")
