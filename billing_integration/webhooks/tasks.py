"""Celery tasks of the event callback: ``process_webhook_event`` (one delivery's message, sent
after commit) and ``process_pending_webhook_events`` (the periodic sweep of lost messages)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery import shared_task
from django.utils import timezone

from ..health import record_run
from ..models import EventState, WebhookEvent

#: Processing attempts of an event failing transiently (database, API) before it stays failed.
MAX_ATTEMPTS = 5


# Celery ships no type hints: its decorators are untyped.
@shared_task(bind=True, name="billing_integration.process_webhook_event", acks_late=True)  # type: ignore[untyped-decorator]
def process_webhook_event(self: Any, event_pk: int, force: bool = False) -> str:
    """Process a stored event after the older ones of its object; a transient failure is
    retried with exponential backoff, ``MAX_ATTEMPTS`` attempts in all."""
    from .processing import process_event, process_in_order

    final = self.request.retries + 1 >= MAX_ATTEMPTS
    if force:
        result = process_event(event_pk, force=True, final=final)
    else:
        result = process_in_order(event_pk, final=final)
    if result.retryable and not final:
        raise self.retry(countdown=min(2**self.request.retries, 300), max_retries=MAX_ATTEMPTS)
    return result.state


def send(event_pk: int, *, force: bool = False, countdown: float | None = None) -> None:
    """Send ``process_webhook_event`` for one event (Celery's routing picks the queue)."""
    process_webhook_event.apply_async((event_pk,), {"force": force}, countdown=countdown)


@shared_task(name="billing_integration.process_pending_webhook_events")  # type: ignore[untyped-decorator]
def process_pending_webhook_events(older_than: float = 60.0) -> int:
    """For Celery beat: enqueue the events still ``received`` after ``older_than`` seconds."""
    record_run("process_pending_webhook_events")  # billing_doctor: beat ran
    cutoff = timezone.now() - timedelta(seconds=older_than)
    pending = WebhookEvent.objects.filter(state=EventState.RECEIVED, received_at__lt=cutoff)
    pks = list(pending.order_by("received_at").values_list("pk", flat=True)[:1000])
    for pk in pks:
        send(pk)
    return len(pks)
