"""Celery tasks of the outbox and the periodic pull.

Safety settings the host must keep (the example project sets them):

- ``CELERY_TASK_ACKS_LATE = True`` and ``CELERY_TASK_REJECT_ON_WORKER_LOST = True``: a task
  killed mid-push is redelivered, and the redelivery sends the same idempotency key;
- ``CELERY_WORKER_PREFETCH_MULTIPLIER = 1``;
- Redis/SQS: ``broker_transport_options['visibility_timeout']`` above
  ``BILLING['OUTBOX_RETRY_MAX']`` (the longest countdown of a retry) and above
  ``BILLING['OUTBOX_LEASE']``.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.utils import timezone

from ..conf import billing_settings
from ..health import record_run
from ..wakeup import PUBLISH_RETRY_POLICY as _PUBLISH_RETRY_POLICY

logger = logging.getLogger("billing_integration.outbox")

__all__ = ["drain_outbox", "enqueue", "push_entry", "push_pending", "sync_all"]

#: Publishing must not hang a web request when the broker is down: the periodic drain
#: (or ``billing_sync --drain``) picks the entry up later.
PUBLISH_RETRY_POLICY = _PUBLISH_RETRY_POLICY
#: How many times a push that waits behind another is re-scheduled before the drain takes over.
MAX_DEFERRALS = 60


def wakeup_name() -> str:
    """The wake-up flag of the push drain (one per outbox queue)."""
    return f"outbox:{billing_settings.OUTBOX_QUEUE or 'default'}"


def enqueue(entry_id: int, countdown: float | None = None) -> bool:
    """Make sure ``entry_id`` is pushed soon: kick the ``push_pending`` drain (one message per
    burst, see ``billing_integration.wakeup``), or, with ``countdown``, a drain timer.

    Returns False when nothing was sent (a wake-up already pending, or the broker refused; the
    entry stays pending for that drain or the periodic one)."""
    from ..wakeup import kick, schedule

    if countdown:
        return schedule(wakeup_name(), push_pending, countdown, **_queue())
    return kick(wakeup_name(), push_pending, **_queue())


def _queue() -> dict[str, Any]:
    queue = billing_settings.OUTBOX_QUEUE
    return {"queue": queue} if queue else {}


@shared_task(
    bind=True,
    name="billing_integration.push_entry",
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=None,
    ignore_result=True,
)
def push_entry(self: Any, entry_id: int, deferrals: int = 0) -> str:
    """Push one outbox entry; retries (same entry, same key) until done or failed."""
    from .push import BUSY, RETRY, push_entry_now

    result = push_entry_now(entry_id)
    if result.status == RETRY:
        raise self.retry(
            countdown=result.retry_in, args=(entry_id, deferrals), max_retries=None, **_queue()
        )
    if result.status == BUSY:
        if deferrals >= MAX_DEFERRALS:
            return "left to the drain"
        raise self.retry(
            countdown=result.retry_in or billing_settings.OUTBOX_DEFER_DELAY,
            args=(entry_id, deferrals + 1),
            max_retries=None,
            **_queue(),
        )
    return result.status


@shared_task(
    name="billing_integration.push_pending",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def push_pending() -> int:
    """The drain woken by ``enqueue`` (a kick): clear the wake-up flag FIRST, then push every
    due entry (``drain.push_due``) in this one task run, re-using the DB connection and the
    HTTP session. Past ``OUTBOX_DRAIN_SECONDS`` / ``OUTBOX_DRAIN_BATCH`` entries it kicks
    itself again; entries due later (retry backoff, waiting behind another) get a timer.
    Returns the number of entries handled."""
    from ..wakeup import clear, kick, schedule
    from .drain import push_due

    name = wakeup_name()
    clear(name)  # before looking: a change committed after this kicks a new run
    report = push_due(
        seconds=float(billing_settings.OUTBOX_DRAIN_SECONDS),
        max_entries=int(billing_settings.OUTBOX_DRAIN_BATCH),
    )
    if report.more:
        kick(name, push_pending, **_queue())
    elif report.next_in is not None:
        schedule(name, push_pending, report.next_in, **_queue())
    return report.handled


@shared_task(name="billing_integration.drain_outbox", ignore_result=True)
def drain_outbox(inline: bool = False) -> int:
    """Re-enqueue (or push, ``inline=True``) entries whose message was lost: pending ones
    older than ``OUTBOX_STALE_AFTER`` that are due, and in-progress ones whose lease expired.
    Returns how many entries were handled."""
    from ..models.outbox import OutboxEntry
    from .push import push_entry_now

    record_run("drain_outbox")  # billing_doctor: beat ran
    if inline:  # which service (billing_integration.service): refuse before pushing any
        from ..service import ensure_service

        ensure_service()
    entries = list(
        OutboxEntry.objects.due(
            float(billing_settings.OUTBOX_STALE_AFTER), float(billing_settings.OUTBOX_LEASE)
        )
        .order_by("pk")
        .values_list("pk", flat=True)[: int(billing_settings.OUTBOX_DRAIN_BATCH)]
    )
    if not entries:
        return 0
    # Touch them, so the next run waits OUTBOX_STALE_AFTER again before re-enqueueing.
    OutboxEntry.objects.filter(pk__in=entries).update(updated_at=timezone.now())
    for pk in entries:
        if inline:
            push_entry_now(pk)
        else:
            enqueue(pk)
    logger.info("outbox drain: %s entr%s %s", len(entries), "y" if len(entries) == 1 else "ies",
                "pushed" if inline else "re-enqueued")
    return len(entries)


@shared_task(name="billing_integration.sync_all", ignore_result=True)
def sync_all() -> dict[str, dict[str, int]]:
    """Reconcile: pull products, customers and subscriptions (see ``billing_sync``)."""
    from ..sync.pull import pull_customers, pull_products, pull_subscriptions

    record_run("sync_all")  # billing_doctor: beat ran
    return {
        "products": pull_products().as_dict(),
        "customers": pull_customers().as_dict(),
        "subscriptions": pull_subscriptions().as_dict(),
    }


