"""Celery tasks of the outbox (the periodic pull is ``billing_integration.sync.tasks``).

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
from ..wakeup import Wakeup, on_commit_once

logger = logging.getLogger("billing_integration.outbox")

__all__ = [
    "OUTBOX",
    "enqueue",
    "enqueue_on_commit",
    "push_due_entries",
    "push_run",
    "requeue_stale_entries",
]


def wakeup_name() -> str:
    """The wake-up flag of the push run (one per outbox queue)."""
    return f"outbox:{billing_settings.OUTBOX_QUEUE or 'default'}"


def _queue() -> dict[str, Any]:
    queue = billing_settings.OUTBOX_QUEUE
    return {"queue": queue} if queue else {}


def enqueue(entry_id: int, countdown: float | None = None) -> bool:
    """Make sure ``entry_id`` is pushed soon: kick the push run (``OUTBOX``: one message per
    burst), or, with ``countdown``, a timer of it.

    Returns False when nothing was sent (a wake-up already pending, or the broker refused; the
    entry stays pending for that run or the periodic sweep)."""
    if countdown:
        return OUTBOX.schedule(countdown)
    return OUTBOX.kick()


def enqueue_on_commit(entry_id: int, *, using: str | None = None) -> None:
    """``enqueue(entry_id)`` once the current transaction commits (at once in autocommit):
    one wake-up for the whole transaction, however many entries it writes
    (``wakeup.on_commit_once``; the run it wakes pushes every due entry)."""
    on_commit_once(_enqueue_now, entry_id, using=using)


def _enqueue_now(entry_id: int) -> None:
    enqueue(entry_id)  # looked up when called: a test's replacement of ``enqueue`` applies


# The Celery task names (``name=``) are those of earlier releases: deployments' beat
# schedules and queued messages name them.
@shared_task(
    name="billing_integration.push_pending",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def push_due_entries(slot: int = 0) -> int:
    """The push run ``enqueue`` kicks: push every due entry (``drain.push_due``) in this one
    task run, re-using the DB connection and the HTTP session, ``OUTBOX_PUSH_CONCURRENCY``
    calls at a time. ``OUTBOX.draining`` clears the wake-up flag first, and kicks the run
    again when it stops past ``OUTBOX_DRAIN_SECONDS`` / ``OUTBOX_PUSH_MAX_ENTRIES`` entries,
    or sets a timer for entries due later (retry backoff, waiting behind another).

    ``slot``: 0 for the run commits kick; a run that finds a full batch wakes the run of the
    next slot (``push_run(slot + 1)``, coalesced like ``OUTBOX``), up to
    ``OUTBOX_PUSH_RUNS`` slots, so a burst spreads over the workers. Returns the number of
    entries handled."""
    from .drain import push_due

    runs = max(1, int(billing_settings.OUTBOX_PUSH_RUNS))
    spread = None
    if slot + 1 < runs and not push_due_entries.app.conf.task_always_eager:
        spread = push_run(slot + 1).kick  # eager: the next run would run inside this one
    with push_run(slot).draining(seconds=float(billing_settings.OUTBOX_DRAIN_SECONDS)) as run:
        report = push_due(
            run, max_entries=int(billing_settings.OUTBOX_PUSH_MAX_ENTRIES), spread=spread
        )
    if report.handled:
        logger.info(
            "push run %s: %s entries handled, %s pushed, %s failed",
            slot,
            report.handled,
            report.pushed,
            report.failed,
        )
    return report.handled


#: The coalesced wake-up of the push run: commits kick it (``enqueue``), ``push_due_entries``
#: drains it. No local window: every kick asks the cache.
OUTBOX = Wakeup(wakeup_name, push_due_entries, options=_queue)


_RUNS: dict[int, Wakeup] = {}


def push_run(slot: int) -> Wakeup:
    """The wake-up of push run ``slot``: ``OUTBOX`` for 0, else one of its own (flag
    ``outbox:<queue>:<slot>``) sending ``push_due_entries(slot)``, made once per slot."""
    if slot <= 0:
        return OUTBOX
    if slot not in _RUNS:
        _RUNS[slot] = Wakeup(
            lambda: f"{wakeup_name()}:{slot}", push_due_entries, options=_queue, args=(slot,)
        )
    return _RUNS[slot]


@shared_task(name="billing_integration.drain_outbox", ignore_result=True)
def requeue_stale_entries(inline: bool = False) -> int:
    """The periodic sweep (beat): re-enqueue (or push, ``inline=True``) entries whose wake-up
    was lost: pending ones due and untouched for ``OUTBOX_STALE_AFTER``, and in-progress ones
    whose lease expired; at most ``OUTBOX_REQUEUE_BATCH``. Returns how many were handled."""
    from ..models.outbox import OutboxEntry
    from .push import push_entry_now

    record_run("drain_outbox")  # billing_doctor: beat ran
    if inline:  # which service (billing_integration.service): refuse before pushing any
        from ..service import ensure_service

        ensure_service()
    entries = list(
        OutboxEntry.objects.due(
            lease=float(billing_settings.OUTBOX_LEASE),
            stale_after=float(billing_settings.OUTBOX_STALE_AFTER),
        )
        .order_by("pk")
        .values_list("pk", flat=True)[: int(billing_settings.OUTBOX_REQUEUE_BATCH)]
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
    logger.info(
        "outbox drain: %s entr%s %s",
        len(entries),
        "y" if len(entries) == 1 else "ies",
        "pushed" if inline else "re-enqueued",
    )
    return len(entries)
