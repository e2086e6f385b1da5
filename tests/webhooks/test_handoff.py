"""The hand-off of stored events to Celery: a coalesced kick of the
``process_received_events`` drain (``billing_integration.wakeup``), one message per burst."""

from __future__ import annotations

import uuid
from unittest import mock

import pytest

from billing_integration import wakeup
from billing_integration.models import EventState, WebhookEvent
from billing_integration.webhooks import processing
from billing_integration.webhooks.tasks import (
    WAKEUP_NAME,
    process_received_events,
    process_webhook_event,
)

from .conftest import SECRET, envelope, post_signed

pytestmark = pytest.mark.django_db


@pytest.fixture
def kicked(settings):
    settings.BILLING = {**settings.BILLING, "WEBHOOK_SECRET": SECRET}
    wakeup.clear(WAKEUP_NAME)
    with mock.patch.object(process_received_events, "apply_async") as apply_async:
        yield apply_async
    wakeup.clear(WAKEUP_NAME)


def deliver(client, n: int, capture) -> list[str]:
    ids = []
    for _ in range(n):
        payload = envelope("thing.happened", {"id": str(uuid.uuid4())})  # no handler: ignored
        with capture(execute=True):
            assert post_signed(client, payload).status_code == 200
        ids.append(payload["id"])
    return ids


def test_a_burst_of_deliveries_sends_one_message_and_the_drain_takes_all_in_order(
    client, kicked, django_capture_on_commit_callbacks
):
    deliver(client, 30, django_capture_on_commit_callbacks)
    assert kicked.call_count == 1
    order: list[int] = []
    real = processing.process_event

    def spy(pk: int, **kw):
        order.append(pk)
        return real(pk, **kw)

    with mock.patch.object(processing, "process_event", side_effect=spy):
        assert process_received_events() == 30
    expected = list(WebhookEvent.objects.order_by("received_at", "pk").values_list("pk", flat=True))
    assert order == expected
    assert not WebhookEvent.objects.filter(state=EventState.RECEIVED).exists()
    deliver(client, 1, django_capture_on_commit_callbacks)  # flag cleared by the drain
    assert kicked.call_count == 2


def test_an_event_stored_while_the_flag_is_set_is_seen_by_the_pending_drain(
    client, kicked, django_capture_on_commit_callbacks
):
    deliver(client, 1, django_capture_on_commit_callbacks)
    deliver(client, 1, django_capture_on_commit_callbacks)  # kick suppressed
    assert kicked.call_count == 1
    assert process_received_events() == 2


def test_a_transient_failure_goes_to_the_per_event_task_as_its_first_retry(
    client, kicked, django_capture_on_commit_callbacks
):
    deliver(client, 2, django_capture_on_commit_callbacks)
    first = WebhookEvent.objects.order_by("pk").first()
    real = processing.process_event

    def flaky(pk: int, **kw):
        if pk == first.pk:
            return processing.ProcessResult(pk, EventState.FAILED, retryable=True, error="x")
        return real(pk, **kw)

    with (
        mock.patch.object(processing, "process_event", side_effect=flaky),
        mock.patch.object(process_webhook_event, "apply_async") as retry,
    ):
        assert process_received_events() == 2
    retry.assert_called_once_with((first.pk,), countdown=1, retries=1)


def test_inline_mode_is_unchanged(client, kicked, settings, django_capture_on_commit_callbacks):
    settings.BILLING = {**settings.BILLING, "WEBHOOK_PROCESS_INLINE": True}
    deliver(client, 2, django_capture_on_commit_callbacks)
    kicked.assert_not_called()
    assert not WebhookEvent.objects.filter(state=EventState.RECEIVED).exists()
