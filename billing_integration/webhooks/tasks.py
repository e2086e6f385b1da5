"""Celery tasks of the event callback."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from ..conf import billing_settings
from ..health import record_run
from ..wakeup import Wakeup

#: The wake-up flag of the event drain (``billing_integration.wakeup``).
WAKEUP_NAME = "webhooks"

__all__ = [
    "EVENTS",
    "kick_window",
    "process_pending_webhook_events",
    "process_received_events",
    "process_webhook_event",
]


def kick_window() -> float:
    """The local suppression window of the event hand-off (``billing_integration.wakeup``):
    ``BILLING['WEBHOOK_KICK_WINDOW']`` seconds, 0 when tasks run eagerly. The webhook view kicks
    with it and the drain lingers by it: both sides must read the same value."""
    if process_received_events.app.conf.task_always_eager:
        return 0.0
    return max(0.0, float(billing_settings.WEBHOOK_KICK_WINDOW))


@shared_task(bind=True, name="billing_integration.process_webhook_event", acks_late=True)
def process_webhook_event(self: Any, event_pk: int, force: bool = False) -> str:
    """Apply one stored event. Transient failures (database deadlock or outage, the API
    unreachable during a pull) are retried with exponential backoff up to
    ``BILLING['WEBHOOK_MAX_ATTEMPTS']``; the event stays ``failed`` with its error otherwise."""
    from .processing import process_event

    max_attempts = int(billing_settings.WEBHOOK_MAX_ATTEMPTS)
    final = self.request.retries + 1 >= max_attempts
    result = process_event(event_pk, force=force, final=final)
    if result.retryable and not final:
        raise self.retry(countdown=min(2**self.request.retries, 300), max_retries=max_attempts)
    return result.state


@shared_task(name="billing_integration.process_pending_webhook_events")
def process_pending_webhook_events(older_than: float = 60.0) -> int:
    """Safety net for Celery beat: enqueue events still ``received`` after ``older_than`` s."""
    from .processing import process_pending

    record_run("process_pending_webhook_events")  # billing_doctor: beat ran
    return process_pending(older_than=older_than)


@shared_task(name="billing_integration.process_received_events", acks_late=True, ignore_result=True)
def process_received_events() -> int:
    """The drain the webhook view kicks (``EVENTS``, a ``billing_integration.wakeup.Wakeup``):
    process every ``received`` event in order of reception, in this one task run. An event
    failing transiently is handed to ``process_webhook_event`` with a countdown, as that task's
    first retry (so ``WEBHOOK_MAX_ATTEMPTS`` counts the drain's attempt). ``EVENTS.draining``
    clears the flag first, lingers ``WEBHOOK_KICK_WINDOW`` (+ a margin) past the clear before a
    look that finds nothing ends the run, and re-kicks the drain when the run stops past
    ``WEBHOOK_DRAIN_SECONDS``. Returns the events handled."""
    from ..models import EventState, WebhookEvent
    from .processing import process_event

    max_attempts = int(billing_settings.WEBHOOK_MAX_ATTEMPTS)
    seen: set[int] = set()

    def received() -> list[int]:
        return [
            pk
            for pk in WebhookEvent.objects.filter(state=EventState.RECEIVED)
            .order_by("received_at", "pk")
            .values_list("pk", flat=True)[: len(seen) + 100]
            if pk not in seen
        ]

    with EVENTS.draining(seconds=float(billing_settings.WEBHOOK_DRAIN_SECONDS)) as run:
        for pks in run.looks(received):
            for pk in pks:
                if not run.time_left():
                    break
                seen.add(pk)
                result = process_event(pk, final=max_attempts <= 1)
                if result.retryable and max_attempts > 1:
                    process_webhook_event.apply_async((pk,), countdown=1, retries=1)
    return len(seen)


#: The coalesced wake-up of the event drain: the webhook view kicks it (``ingest.enqueue``),
#: ``process_received_events`` drains it; both read the same window (``kick_window``).
EVENTS = Wakeup(WAKEUP_NAME, process_received_events, window=kick_window)
