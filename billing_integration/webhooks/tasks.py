"""Celery tasks of the event callback."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from ..conf import billing_settings
from ..health import record_run

#: The wake-up flag of the event drain (``billing_integration.wakeup``).
WAKEUP_NAME = "webhooks"

__all__ = [
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


@shared_task(name="billing_integration.process_received_events", acks_late=True,
             ignore_result=True)
def process_received_events() -> int:
    """The drain the webhook view kicks (``billing_integration.wakeup``): clear the wake-up
    flag FIRST, then process every ``received`` event in order of reception, in this one task
    run. An event failing transiently is handed to ``process_webhook_event`` with a countdown,
    as that task's first retry (so ``WEBHOOK_MAX_ATTEMPTS`` counts the drain's attempt). Past
    ``WEBHOOK_DRAIN_SECONDS`` the drain kicks itself again (through the cache, never locally
    suppressed). A look that finds nothing ends the run only if it started
    ``WEBHOOK_KICK_WINDOW`` (+ a margin) after the clear: an event whose kick a web process
    suppressed locally meanwhile is seen (``wakeup.linger``). Returns the events handled."""
    import time

    from ..models import EventState, WebhookEvent
    from ..wakeup import clear, kick, linger
    from .processing import process_event

    window = kick_window()
    cleared_at = clear(WAKEUP_NAME)  # before looking: an event stored after this kicks a new run
    max_attempts = int(billing_settings.WEBHOOK_MAX_ATTEMPTS)
    deadline = time.monotonic() + float(billing_settings.WEBHOOK_DRAIN_SECONDS)
    seen: set[int] = set()
    while True:
        looked_at = time.monotonic()
        pks = [
            pk
            for pk in WebhookEvent.objects.filter(state=EventState.RECEIVED)
            .order_by("received_at", "pk")
            .values_list("pk", flat=True)[: len(seen) + 100]
            if pk not in seen
        ]
        if not pks:
            wait = linger(cleared_at, window, looked_at)
            if wait <= 0:
                return len(seen)
            time.sleep(wait)
            continue
        for pk in pks:
            if time.monotonic() >= deadline:
                kick(WAKEUP_NAME, process_received_events)
                return len(seen)
            seen.add(pk)
            result = process_event(pk, final=max_attempts <= 1)
            if result.retryable and max_attempts > 1:
                process_webhook_event.apply_async((pk,), countdown=1, retries=1)
