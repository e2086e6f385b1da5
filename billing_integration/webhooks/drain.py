"""The event drain's loop: process the ``received`` events of one partition, in order of
reception, inside a drain run (``billing_integration.wakeup.DrainRun``).

Partitions spread a burst over workers while keeping each object's events in order. With
``runs`` partitions (``BILLING['WEBHOOK_PROCESS_RUNS']``), an event belongs to partition
``crc32(object_id) % runs`` (:func:`partition_of`: a stable hash, the same in every process;
an event with no object id belongs to partition 0), so all the events of one object belong to
one partition, and a partition's run walks its events in order of reception. Run 0 is the one
the webhook view wakes; each of its looks also wakes (``kick``) the other partitions that have
received events (the hand-off and why no wake-up is lost: ``webhooks.tasks``).

What keeps each object's events in order is that every run walks *its* events in order of
reception and each event is processed under its row lock, once (``processing.process_event``):
two runs that share events (two runs of one partition, or of processes configured with
different ``runs``) meet on the first shared event's lock, and the later one leaves it, as
it is no longer ``received`` (``process_event(..., received_only=True)``). The partitions
only decide who does the work.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

from django.db.models import Q

from ..conf import billing_settings
from ..models import EventState, WebhookEvent
from ..wakeup import DrainRun

__all__ = ["LOOK_BATCH", "partition_of", "process_received", "received_events"]

#: Events of its own partition a look returns at most.
LOOK_BATCH = 100
#: Rows of ``received`` events a look reads per query.
_CHUNK = 500


def partition_of(object_id: str, runs: int) -> int:
    """The partition (``0 <= p < runs``) of an event about ``object_id``: a CRC-32 of the id
    (stable across processes and releases, unlike ``hash()``), 0 for an empty id."""
    if runs <= 1 or not object_id:
        return 0
    return zlib.crc32(object_id.encode("utf-8")) % runs


def received_events(
    partition: int, runs: int, *, skip: set[int] | frozenset[int] = frozenset()
) -> tuple[list[int], set[int]]:
    """One look: the first ``LOOK_BATCH`` ``received`` events of ``partition`` in order of
    reception (primary keys, those in ``skip`` left out), and, for partition 0, the other
    partitions that have ``received`` events.

    It reads the ``received`` events in order of reception, ``(received_at, pk)``, a chunk
    per query, each chunk after the last row of the one before (so rows processed meanwhile
    shift nothing). It stops when its batch is full and, for partition 0, every other
    partition has been seen, or at the end. Any event committed before the look started and
    still ``received`` when its chunk is read is therefore seen.
    """
    mine: list[int] = []
    others: set[int] = set()
    rows = WebhookEvent.objects.filter(state=EventState.RECEIVED).order_by("received_at", "pk")
    after: tuple | None = None
    while True:
        chunk = rows
        if after is not None:
            chunk = rows.filter(
                Q(received_at__gt=after[0]) | Q(received_at=after[0], pk__gt=after[1])
            )
        found = list(chunk.values_list("received_at", "pk", "object_id")[:_CHUNK])
        for _at, pk, object_id in found:
            owner = partition_of(object_id, runs)
            if owner == partition:
                if len(mine) < LOOK_BATCH and pk not in skip:
                    mine.append(pk)
            elif partition == 0:
                others.add(owner)
        if len(found) < _CHUNK:
            return mine, others
        if len(mine) >= LOOK_BATCH and (partition != 0 or len(others) >= runs - 1):
            return mine, others
        after = found[-1][:2]


def process_received(
    run: DrainRun, partition: int, runs: int, kick: Callable[[int], object]
) -> int:
    """Process the ``received`` events of ``partition`` (of ``runs``) in order of reception
    until a look finds none (``run.looks``: the linger) or the run's budget is spent; on
    partition 0, each look also calls ``kick(p)`` for every other partition ``p`` that has
    ``received`` events. An event failing transiently is handed to ``process_webhook_event``
    with a countdown, as that task's first retry (so ``WEBHOOK_MAX_ATTEMPTS`` counts this
    attempt). Returns the events handled."""
    from .processing import process_event
    from .tasks import process_webhook_event

    max_attempts = int(billing_settings.WEBHOOK_MAX_ATTEMPTS)
    seen: set[int] = set()

    def look() -> list[int]:
        mine, others = received_events(partition, runs, skip=seen)
        for other in sorted(others):
            kick(other)
        return mine

    for pks in run.looks(look):
        for pk in pks:
            if not run.time_left():
                break
            seen.add(pk)
            result = process_event(pk, final=max_attempts <= 1, received_only=True)
            if result.retryable and max_attempts > 1:
                process_webhook_event.apply_async((pk,), countdown=1, retries=1)
    return len(seen)
