"""With Celery's ``task_always_eager`` the event is processed in the request, right after it is
stored: no wait for a commit (a plain ``django_db`` test never commits); otherwise processing
is handed off after commit."""

from __future__ import annotations

import uuid

import pytest

from billing_integration.models import EventState, Subscription, WebhookEvent
from billing_integration.webhooks import signals

from .conftest import envelope, post_signed, subscription_data

pytestmark = pytest.mark.django_db  # one transaction per test, never committed


def canceled(m) -> dict:
    return envelope(
        "subscription.canceled",
        subscription_data(
            m.subscription.remote_id,
            customer=m.customer.remote_id,
            product=m.product.remote_id,
            status="canceled",
        ),
    )


def test_inline_processing_happens_in_the_request(client, mirror, webhook_settings):
    response = post_signed(client, canceled(mirror))

    assert response.status_code == 200 and response.json()["status"] == "received"
    event = WebhookEvent.objects.get()
    assert event.state == EventState.PROCESSED and event.outcome == "applied"
    assert Subscription.objects.get(pk=mirror.subscription.pk).status == "canceled"


def test_inline_signals_still_wait_for_the_commit(
    client, mirror, webhook_settings, django_capture_on_commit_callbacks
):
    calls = []

    def receiver(sender, **kwargs):
        calls.append(kwargs["event"].event_id)

    signals.subscription_canceled.connect(receiver, dispatch_uid="inline-test")
    try:
        with django_capture_on_commit_callbacks(execute=True):
            post_signed(client, canceled(mirror))
            assert calls == []  # applied, not yet committed: no signal
        assert len(calls) == 1
    finally:
        signals.subscription_canceled.disconnect(dispatch_uid="inline-test")


def test_without_inline_nothing_is_processed_before_the_commit(client, mirror, settings):
    from .conftest import SECRET

    settings.BILLING = {
        **settings.BILLING,
        "WEBHOOK_SECRET": SECRET,
    }
    response = post_signed(client, canceled(mirror), msg_id=str(uuid.uuid4()))
    assert response.status_code == 200
    assert WebhookEvent.objects.get().state == EventState.RECEIVED
