"""Celery tasks of the event callback.

The event drain (``process_received_events``) runs as ``N = WEBHOOK_PROCESS_RUNS``
partitions (``drain``: all the events of one object are in one partition, whose run processes
them in order of reception). Run 0 is woken by the webhook view through ``EVENTS`` (flag
``webhooks``, with the local window ``WEBHOOK_KICK_WINDOW``); run ``p >= 1`` through
``partition_wakeup(p, N)`` (flag ``webhooks:p/N``, no window, the task with arguments
``(p, N)``), which only run 0 kicks: each look of run 0 reads the ``received`` events (to the
end, or until every partition has shown one) and kicks, through the cache, every other
partition it saw. So a burst's partitions start at run 0's first look, on as many workers.

No lost wake-up for ``p >= 1``. Take an event ``e`` of partition ``p``, committed at ``c``;
its delivery kicked ``EVENTS`` after ``c``. By the argument of ``billing_integration.wakeup``
(window and linger included), some run 0 ends on a look that found nothing of its own and
started after ``c`` (a run that stops on its budget re-kicks run 0 first). That look reads
``e`` unless ``e`` is already processed, so it kicks ``p`` at some ``a > c``, through the cache
(a kick with no window is never suppressed locally). By the plain protocol, a run of ``p``
deletes ``p``'s flag after ``a``: the run this kick's message starts, or, if the flag was set,
the run of the message that set it (its delete, its first step, comes after ``a``). Its looks
all start after that delete, hence after ``c``; it ends only on a look that finds no event of
``p``, so it processes ``e``
(a run of ``p`` that stops on its budget kicks ``p`` again first: the same argument). A lost
message, a flag that outlives its message (``KICK_TTL``) or a crashed run are the degraded
cases of ``billing_integration.wakeup``; the periodic ``process_pending_webhook_events``
covers them for every partition alike.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from ..conf import billing_settings
from ..health import record_run
from ..wakeup import Wakeup

#: The wake-up flag of the event drain's run 0 (``billing_integration.wakeup``).
WAKEUP_NAME = "webhooks"

__all__ = [
    "EVENTS",
    "kick_window",
    "partition_wakeup",
    "process_pending_webhook_events",
    "process_received_events",
    "process_runs",
    "process_webhook_event",
    "wakeup_names",
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
def process_received_events(partition: int = 0, runs: int = 0) -> int:
    """The drain the webhook view kicks (``EVENTS``): process the ``received`` events of
    ``partition`` of ``runs`` (0: ``process_runs()``; a message without arguments, as the
    view and earlier releases send, is run 0) in order of reception, in this one task run
    (``drain.process_received``); run 0 also kicks the other partitions that have events.
    The run's wake-up (``EVENTS`` or ``partition_wakeup``) clears its flag first, lingers on
    run 0 (``WEBHOOK_KICK_WINDOW``), and re-kicks the run when it stops past
    ``WEBHOOK_DRAIN_SECONDS``. Returns the events handled."""
    from .drain import process_received

    runs = runs or process_runs()
    wakeup = EVENTS if partition == 0 else partition_wakeup(partition, runs)
    with wakeup.draining(seconds=float(billing_settings.WEBHOOK_DRAIN_SECONDS)) as run:
        return process_received(
            run, partition, runs, kick=lambda other: partition_wakeup(other, runs).kick()
        )


def process_runs() -> int:
    """``BILLING['WEBHOOK_PROCESS_RUNS']``: the number of partitions (at least 1)."""
    return max(1, int(billing_settings.WEBHOOK_PROCESS_RUNS))


#: The coalesced wake-up of the event drain's run 0: the webhook view kicks it
#: (``ingest.enqueue``), ``process_received_events`` drains it; both read the same window
#: (``kick_window``).
EVENTS = Wakeup(WAKEUP_NAME, process_received_events, window=kick_window)

_PARTITIONS: dict[tuple[int, int], Wakeup] = {}


def partition_wakeup(partition: int, runs: int) -> Wakeup:
    """The wake-up of run ``partition`` (>= 1) of ``runs``: flag ``webhooks:<partition>/<runs>``,
    the task with arguments ``(partition, runs)``, no local window (only run 0 kicks it, through
    the cache)."""
    key = (partition, runs)
    if key not in _PARTITIONS:
        _PARTITIONS[key] = Wakeup(
            f"{WAKEUP_NAME}:{partition}/{runs}", process_received_events, args=key
        )
    return _PARTITIONS[key]


def wakeup_names() -> list[str]:
    """The flags of the event drain's runs under the current ``WEBHOOK_PROCESS_RUNS``."""
    runs = process_runs()
    return [WAKEUP_NAME] + [partition_wakeup(k, runs).name for k in range(1, runs)]
