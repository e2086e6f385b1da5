"""One drain run: push every due outbox entry, in primary-key order, in this process.

Used by the ``push_pending`` task (woken by a coalesced kick, see
``billing_integration.wakeup``). Entries go through ``batch.push_batch``, ``OUTBOX_CLAIM_BATCH``
at a time: the same claim as ``push.push_entry_now`` (``SELECT ... FOR UPDATE SKIP LOCKED``,
lease, per-object ordering), the same stored body and idempotency key, with one claim and
one record transaction per batch - so several drains, ``push_entry`` tasks and synchronous
pushes may run at once: an entry another one holds is skipped here (``held``), and that one
finishes it.

The run sweeps the due entries once with a primary-key cursor. A later entry of an object
(higher pk) therefore comes after its older one, in the same run. Entries created during the
run have higher pks and are reached too; anything else that becomes due behind the cursor
kicks a new run (which starts from the beginning) or is covered by the returned timer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Q, QuerySet
from django.utils import timezone

from ..conf import billing_settings
from ..models.outbox import OutboxEntry, OutboxState
from .batch import push_batch
from .push import BUSY, DONE, FAILED, REFUSED, RETRY, PushResult

__all__ = ["DrainReport", "due_entries", "push_due", "push_open"]


@dataclass
class DrainReport:
    handled: int = 0  # entries attempted (any outcome)
    pushed: int = 0  # entries done
    failed: int = 0
    more: bool = False  # the budget ran out with due entries left: run again at once
    next_in: float | None = None  # seconds until the earliest entry left waiting is due
    refused: bool = False  # the mirror belongs to another service: stopped, nothing sent


def due_entries() -> QuerySet:
    """Entries a drain may claim now: pending ones whose retry time has come, and in-progress
    ones whose worker's lease expired (a killed worker)."""
    now = timezone.now()
    lease = float(billing_settings.OUTBOX_LEASE)
    return OutboxEntry.objects.filter(
        Q(state=OutboxState.PENDING)
        & (Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
        | Q(state=OutboxState.IN_PROGRESS, started_at__lte=now - timedelta(seconds=lease))
    )


def _wait_of(result: PushResult) -> float | None:
    """Seconds after which this entry should be looked at again by a drain, or None."""
    if result.status == RETRY:
        return result.retry_in or float(billing_settings.OUTBOX_DEFER_DELAY)
    if result.status == BUSY and not result.held:  # waits behind an older entry of the object
        return result.retry_in or float(billing_settings.OUTBOX_DEFER_DELAY)
    return None


def push_due(*, seconds: float = 20.0, max_entries: int = 1000) -> DrainReport:
    """Push due entries in batches, in primary-key order, until none is left or the budget
    (``seconds`` of wall time, ``max_entries`` attempts) is spent; then ``more`` says whether
    some were left."""
    report = DrainReport()
    deadline = time.monotonic() + seconds
    batch = max(1, int(billing_settings.OUTBOX_CLAIM_BATCH))
    cursor = 0
    waits: list[float] = []
    while True:
        ids = list(
            due_entries().filter(pk__gt=cursor).order_by("pk").values_list("pk", flat=True)[:batch]
        )
        if not ids:
            break
        room = max_entries - report.handled
        if room <= 0 or time.monotonic() >= deadline:
            report.more = True
            break
        cursor = ids[min(room, len(ids)) - 1]
        for result in push_batch(ids[:room], deadline=deadline):
            if result.status == REFUSED:  # another service (billing_integration.service)
                report.refused = True
                break
            if result.released:  # the deadline came before its call: next run
                report.more = True
                continue
            report.handled += 1
            if result.status == DONE:
                report.pushed += 1
            elif result.status == FAILED:
                report.failed += 1
            wait = _wait_of(result)
            if wait is not None:
                waits.append(wait)
        if report.more or report.refused:
            break
    if waits and not report.more:
        report.next_in = min(waits)
    return report


def push_open() -> list[tuple[OutboxEntry, PushResult]]:
    """Push every open outbox entry now, in this process, in primary-key order: fresh ones,
    ones waiting for their retry time and ones whose worker's lease expired (an entry a
    worker holds is left to it). One attempt each (the client's own retries included); a
    retryable failure goes back to ``pending`` with its next retry time, as in a worker.

    ``billing_sync --push``: the way to push without a worker. Returns each entry (as loaded
    before its push) with the push's result."""
    from .push import push_entry_now

    entries = list(OutboxEntry.objects.open().select_related("content_type").order_by("pk"))
    return [(entry, push_entry_now(entry.pk)) for entry in entries]
