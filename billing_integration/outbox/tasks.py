"""The outbox's tasks: ``push_outbox_entry`` (enqueued when a change commits; a retry comes
back after its backoff) and ``sweep_outbox`` (beat: re-enqueues what a lost message left)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import transaction
from django.utils import timezone

from ..health import record_run
from ..models.outbox import OutboxEntry
from .push import PushOutcome, push_entry

logger = logging.getLogger("billing_integration.outbox")

STALE_AFTER = 60.0  # seconds: the sweep re-enqueues pending entries untouched for this long
SWEEP_BATCH = 1000  # entries one sweep re-enqueues at most
#: Publishing must not hang a web request when the broker is down (the sweep covers it).
PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2}


def enqueue(entry_id: int, countdown: float | None = None) -> bool:
    """Send ``push_outbox_entry(entry_id)``; False when the broker refused or Celery is eager
    with a countdown (it would ignore it): the sweep finds the entry."""
    if countdown and push_outbox_entry.app.conf.task_always_eager:
        return False
    try:
        push_outbox_entry.apply_async(
            (entry_id,), countdown=countdown, retry_policy=PUBLISH_RETRY_POLICY
        )
    except Exception as exc:
        logger.warning("outbox entry %s: could not enqueue its push (%s)", entry_id, exc)
        return False
    return True


def enqueue_on_commit(entry_id: int, *, using: str | None = None) -> None:
    transaction.on_commit(lambda: enqueue(entry_id), using=using)


def enqueue_open(using: str | None = None) -> int:
    """Enqueue, on commit, the push of every pending entry not waiting behind another."""
    heads = OutboxEntry.objects.using(using).pending().heads().order_by("pk")
    ids = list(heads.values_list("pk", flat=True))
    for pk in ids:
        enqueue_on_commit(pk, using=using)
    return len(ids)


@shared_task(  # type: ignore[untyped-decorator]  # Celery ships no type hints
    name="billing_integration.push_entry",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def push_outbox_entry(entry_id: int) -> str:
    """Push one entry (a retry comes back after its backoff); a task whose entry is already
    done, or held by another worker, exits at once."""
    result = push_entry(entry_id)
    if result.status == PushOutcome.RETRY:
        enqueue(result.entry_id, countdown=result.retry_in)
    return str(result.status)


@shared_task(name="billing_integration.drain_outbox", ignore_result=True)  # type: ignore[untyped-decorator]
def sweep_outbox() -> int:
    """Re-enqueue due entries whose message was lost (pending and untouched for
    ``STALE_AFTER``, or in progress past their lease). Returns how many."""
    record_run("drain_outbox")  # billing_doctor: beat ran
    due = OutboxEntry.objects.due(stale_after=STALE_AFTER).heads().order_by("pk")
    ids = list(due.values_list("pk", flat=True)[:SWEEP_BATCH])
    if ids:  # touched, so the next sweep waits STALE_AFTER again
        OutboxEntry.objects.filter(pk__in=ids).update(updated_at=timezone.now())
        for pk in ids:
            enqueue(pk)
        logger.info("outbox sweep: %s entries re-enqueued", len(ids))
    return len(ids)
