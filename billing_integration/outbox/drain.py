"""One push run: push every due outbox entry, in primary-key order, in this process.

Used by the ``push_due_entries`` task (woken by a coalesced kick: ``tasks.OUTBOX``, a
``billing_integration.wakeup.Wakeup``). Entries go through ``push.push_entries`` a batch at
a time - the one claim / call / record path, so several runs and synchronous pushes may run
at once: an entry another one holds is skipped here (``held``), and that one finishes it.

A batch is ``OUTBOX_CLAIM_BATCH`` entries, or more when the service answers fast: after each
batch the run claims what it calls in ``CLAIM_SECONDS`` at the batch's pace (``claim_size``,
at most ``CLAIM_MAX``). A batch's claim and record cost about the same whatever its calls
take, so against a fast service fewer, larger batches spend less per entry; against a slow
one the batches stay at ``OUTBOX_CLAIM_BATCH``, and no entry waits claimed for much longer
than ``CLAIM_SECONDS`` of calls.

Each look fetches the due *heads* (``OutboxEntry.objects.due().heads()``: entries with no
older open entry of their object), in primary-key order, leaving out those this run already
handled. An entry behind another push of its object is therefore fetched only once that push
is over, by whichever run looks next: the pushes of one object stay in order whatever the
number of runs. A run that fetches a full batch calls ``spread`` once (the task wakes one
more run, on another worker: ``OUTBOX_PUSH_RUNS``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..conf import billing_settings
from ..models.outbox import OutboxEntry
from ..wakeup import DrainRun
from .push import PushOutcome, PushResult, push_entries

__all__ = ["CLAIM_MAX", "CLAIM_SECONDS", "DrainReport", "claim_size", "push_due", "push_open"]

#: Seconds of calls a push run claims at a time, at its last batch's pace (see the module
#: docstring), and the most entries one batch claims that way.
CLAIM_SECONDS = 0.5
CLAIM_MAX = 1000


@dataclass
class DrainReport:
    handled: int = 0  # entries attempted (any outcome)
    pushed: int = 0  # entries done
    failed: int = 0
    more: bool = False  # the budget ran out with due entries left: run again at once
    next_in: float | None = None  # seconds until the earliest entry left waiting is due
    refused: bool = False  # the mirror belongs to another service: stopped, nothing sent


def claim_size(least: int, entries: int, seconds: float) -> int:
    """The next batch of a push run whose last batch took ``seconds`` for ``entries`` calls:
    what it pushes in ``CLAIM_SECONDS`` at that pace, between ``least``
    (``OUTBOX_CLAIM_BATCH``) and ``CLAIM_MAX`` (or ``least``, if larger)."""
    if entries <= 0 or seconds <= 0:
        return least
    return max(least, min(CLAIM_MAX, int(entries / seconds * CLAIM_SECONDS)))


def _wait_of(result: PushResult) -> float | None:
    """Seconds after which this entry should be looked at again by a push run, or None."""
    if result.status == PushOutcome.RETRY:
        return result.retry_in or float(billing_settings.OUTBOX_DEFER_DELAY)
    if result.status == PushOutcome.BUSY and not result.held:  # behind an older entry
        return result.retry_in or float(billing_settings.OUTBOX_DEFER_DELAY)
    return None


def push_due(
    run: DrainRun | None = None,
    *,
    seconds: float = 20.0,
    max_entries: int = 1000,
    spread: Callable[[], Any] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> DrainReport:
    """Push due entries in batches, in primary-key order, until none is left or the budget
    (the ``run``'s time, else ``seconds`` of wall time; ``max_entries`` attempts) is spent;
    then ``more`` says whether some were left (the run is stopped: it re-kicks), and
    ``next_in`` when the earliest entry left waiting is due (the run's timer). ``spread`` is
    called once, when a look finds a full batch (more may be due than this run can push
    soon). ``clock`` times the batches (``claim_size``)."""
    if run is None:
        run = DrainRun(seconds)
    report = DrainReport()
    least = max(1, int(billing_settings.OUTBOX_CLAIM_BATCH))
    batch = least
    lease = float(billing_settings.OUTBOX_LEASE)
    seen: set[int] = set()
    waits: list[float] = []

    def due() -> list[int]:
        ids = (
            OutboxEntry.objects.due(lease=lease)
            .heads()
            .order_by("pk")
            .values_list("pk", flat=True)[: batch + len(seen)]
        )
        return [pk for pk in ids if pk not in seen][:batch]

    for ids in run.looks(due):
        room = max_entries - report.handled
        if room <= 0 or not run.time_left():
            run.stop()
            break
        if spread is not None and len(ids) >= batch:
            spread()
            spread = None
        ids = ids[:room]
        seen.update(ids)
        started = clock()
        results = push_entries(ids, deadline=run.deadline)
        # The pace of the calls: entries settled without one (held elsewhere, nothing to
        # send) would make a batch look faster than the service is.
        batch = claim_size(least, sum(r.calls for r in results), clock() - started)
        for result in results:
            if result.status == PushOutcome.REFUSED:  # another service (service.py)
                report.refused = True
                break
            if result.released:  # the deadline came before its call: next run
                run.stop()
                continue
            report.handled += 1
            if result.status == PushOutcome.DONE:
                report.pushed += 1
            elif result.status == PushOutcome.FAILED:
                report.failed += 1
            wait = _wait_of(result)
            if wait is not None:
                waits.append(wait)
        if report.refused:
            break
    report.more = run.more
    if waits and not report.more:
        report.next_in = min(waits)
        run.retry_in(report.next_in)
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
