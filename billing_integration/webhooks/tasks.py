"""Celery tasks of the event callback."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from ..conf import billing_settings

__all__ = ["process_pending_webhook_events", "process_webhook_event"]


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

    return process_pending(older_than=older_than)
