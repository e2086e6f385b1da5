"""Coalesced wake-ups of drain tasks: one Celery message for a burst of work, not one per item.

A :class:`Wakeup` ties a name, the drain task and the local window together, so producers and
the consumer cannot disagree on them. Producers (the outbox after a change commits, the webhook
view after an event is stored) call ``.kick()`` / ``.kick_on_commit()``; the drain task is a
plain loop inside ``with wakeup.draining(seconds=...) as run:``, which clears the flag first,
lingers on a look that found nothing (``run.looks(fetch)``), and on exit re-kicks when the run
stopped on its budget (``run.stop()``) or sets a timer (``run.retry_in(seconds)``). The module
functions below are the protocol's steps; only :class:`Wakeup` and :class:`DrainRun` call them
in order.

Protocol, with ``F`` the cache flag ``billing_integration:kick:<name>``:

- ``kick(name, task)`` (after the item's transaction committed): ``cache.add(F)``; only the
  caller whose ``add`` succeeded sends ``task``. While ``F`` is set, further kicks send nothing.
- The drain task calls :func:`clear` (deletes ``F``) **first**, **then** loops claiming due
  items until none is left.

No lost wake-up: take an item committed at time ``c`` and kicked just after. If its ``add``
succeeds, a message is sent and the drain it starts deletes ``F`` and then queries, after ``c``:
it sees the item. If its ``add`` fails, ``F`` was present at that moment, so some kick set it
and sent a message whose drain has not yet deleted it (the delete is the drain's first step, so
a drain that deleted ``F`` before the failed ``add`` is not the one that set it). That drain's
delete - and its whole loop - comes after the failed ``add``, hence after ``c``: it sees the
item. A drain that stops early (its time or size budget) kicks again before returning.

Degraded cases, all covered by the periodic beat drains (the safety net): a message lost by the
broker leaves ``F`` set for at most ``KICK_TTL`` seconds (kicks are suppressed meanwhile); a
broker refusing the publish deletes ``F`` again so the next commit retries; a cache outage makes
every kick send (no coalescing, nothing lost). Coalescing needs a cache shared by web and
worker processes: with a process-local one (``LocMemCache``, ``DummyCache``) a worker's drain
could never delete the flag a web process set, so kicks would be suppressed for ``KICK_TTL``;
every kick through such a cache sends its message instead (and a system check warns).

Local suppression window (opt-in per kick: ``kick(..., local_window=W)``; the webhook view uses
``BILLING['WEBHOOK_KICK_WINDOW']``). Under load every kick but about one per drain run finds
``F`` set, and each such failed ``add`` is a cache round trip per item. With a window, a process
whose ``add`` showed a wake-up pending (it failed, or it succeeded and the message went out)
skips the cache for its later kicks of that name until ``s + W``, where ``s`` is its monotonic
clock read just *before* that ``add``. The drain obeys one more rule in exchange: it may return
on a look that found nothing only if that look *started* at least ``W + LINGER_MARGIN`` after
its :func:`clear` returned; otherwise it sleeps the rest and looks again (:func:`linger`).

No lost wake-up with the window. Take an item committed at ``c`` whose kick was suppressed
locally: the check ran at ``t >= c`` with ``t < s + W``. The ``add`` that opened the window ran
at ``k >= s`` and found (or set) a flag instance ``F_k`` that then exists; ``F_k`` ends after
``k``, in one of three ways. (a) A drain deletes it, at ``d > k``: that drain's ``clear``
returned after ``d``, so a look that ends it on nothing started after ``d + W > s + W > c``
and saw the item (a query started after the commit). (b) That drain stops early on its time or
size budget, at ``e > d``: it kicks again *through the cache* (a drain's own kick is never
suppressed locally), so some drain clears after ``e`` (the one its message starts, or the one
deleting the flag its ``add`` found): the same two cases again, with a clear later than
``d``; by induction the drain run that finally ends on nothing started its last look more than
``W`` after a clear later than ``d``, hence after ``c``. (c) ``F_k`` expires (``KICK_TTL``: a
lost message) or a refused publish deletes it, or the drain crashes: the degraded cases above,
which the beat drain covers (``process_pending_webhook_events``: events still ``received``
after a minute), exactly as an unsuppressed kick that met the same ``F_k`` would have been.
Only elapsed times are used, each measured on one machine's monotonic clock (never compared
across machines); the margin covers clock-rate differences. A cache error or a refused publish
opens no window; :func:`clear` forgets the local window of its own process. The kicking web
process and the drain read ``W`` through the same :class:`Wakeup` (its ``window``); it is 0
(no window, no linger) when tasks run eagerly (the drain then runs inside the kick). The
cost: a drain run that runs out of work idles at most ``W + LINGER_MARGIN`` before
returning; a drain kept busy never lingers.

Timers (:func:`schedule`) are separate: a drain whose items are due later (retry backoff) sends
itself with a ``countdown``; timers for the same second are deduplicated.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from django.core.cache import caches
from django.core.cache.backends.dummy import DummyCache
from django.core.cache.backends.locmem import LocMemCache
from django.db import transaction

from .conf import billing_settings

logger = logging.getLogger("billing_integration.wakeup")

__all__ = [
    "LINGER_MARGIN",
    "PROCESS_LOCAL_BACKENDS",
    "DrainRun",
    "Wakeup",
    "clear",
    "flag_key",
    "kick",
    "linger",
    "on_commit_once",
    "schedule",
]

#: Publishing must not hang a web request when the broker is down.
PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}

#: Seconds a drain lingers beyond the producers' local window (clock-rate differences between
#: machines, scheduling): far more than the drift of two monotonic clocks over a window.
LINGER_MARGIN = 0.05

#: Cache backends not shared between processes: kicks through them never coalesce.
PROCESS_LOCAL_BACKENDS = (LocMemCache, DummyCache)

#: name -> ``time.monotonic()`` until which this process knows a wake-up of ``name`` is pending
#: (the local suppression window). Plain dict operations: safe with threaded workers, and a
#: stale entry only ever costs one more cache round trip.
_pending_until: dict[str, float] = {}


def flag_key(name: str) -> str:
    return f"billing_integration:kick:{name}"


def _cache() -> Any:
    return caches[billing_settings.KICK_CACHE or billing_settings.TOKEN_CACHE]


def _send(
    task: Any, countdown: float | None, options: dict[str, Any], args: tuple[Any, ...] = ()
) -> None:
    task.apply_async(
        args=args, countdown=countdown, retry=True, retry_policy=PUBLISH_RETRY_POLICY, **options
    )


def kick(
    name: str,
    task: Any,
    *,
    local_window: float = 0.0,
    args: tuple[Any, ...] = (),
    **options: Any,
) -> bool:
    """Wake the drain ``task`` unless a wake-up is already pending; call after commit. Through
    a process-local cache (``PROCESS_LOCAL_BACKENDS``) every kick sends.

    With ``local_window`` > 0, a process that saw a wake-up pending skips the cache for that
    many seconds (the drain must :func:`linger` by the same window; see the module docstring).
    ``args``: the task's positional arguments. Returns True if a message was sent. Never
    raises: a broker refusing the message is logged and the item waits for the periodic drain
    (or the next kick).
    """
    started = time.monotonic()
    if local_window > 0 and _pending_until.get(name, 0.0) > started:
        return False
    key = flag_key(name)
    cache_ok = True
    try:
        cache = _cache()
        if isinstance(cache, PROCESS_LOCAL_BACKENDS):  # a drain could not clear it: always send
            first, cache_ok = True, False
        else:
            first = cache.add(key, 1, timeout=float(billing_settings.KICK_TTL))
    except Exception as exc:  # cache down: send anyway (no coalescing, nothing lost)
        logger.warning("wake-up %s: cache unavailable (%s), sending anyway", name, exc)
        first, cache_ok = True, False
    if not first:
        if local_window > 0:  # F was present: its deleting drain lingers past started + W
            _pending_until[name] = started + local_window
        return False
    try:
        _send(task, None, options, args)
    except Exception as exc:
        with contextlib.suppress(Exception):  # let the next commit try again
            _cache().delete(key)
        logger.warning("wake-up %s not sent (%s); the periodic drain will pick it up", name, exc)
        return False
    if local_window > 0 and cache_ok:  # the drain of this message clears F after started
        _pending_until[name] = started + local_window
    return True


class _Once:
    """The calls :func:`on_commit_once` registered for one commit: the first that runs calls
    ``func``, the others do nothing."""

    __slots__ = ("fired", "func")

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        self.fired = False

    def __call__(self, *args: Any) -> None:
        if not self.fired:
            self.fired = True
            self.func(*args)


def on_commit_once(func: Callable[..., Any], *args: Any, using: str | None = None) -> None:
    """Call ``func(*args)`` after the current transaction commits (at once in autocommit), once
    for every call of this with the same ``func`` in that transaction: with the ``args`` of the
    first whose callback survives (a rolled-back savepoint drops its own). A transaction that
    writes a thousand items sends one wake-up, not a thousand cache round trips.

    Each call still registers its own (cheap) ``on_commit`` callback, so a savepoint rollback
    drops exactly what it should, and the callbacks a test captures
    (``captureOnCommitCallbacks``) hold the wake-up. The callbacks of one transaction share one
    :class:`_Once` per connection and ``func``; it is replaced once it has fired (a transaction
    that rolls back leaves it unfired, and the next transaction shares it)."""
    connection = transaction.get_connection(using)
    shared: dict[Any, _Once] = connection.__dict__.setdefault("_billing_on_commit_once", {})
    once = shared.get(func)
    if once is None or once.fired:
        once = shared[func] = _Once(func)
    transaction.on_commit(lambda: once(*args), using=using, robust=True)


def clear(name: str) -> float:
    """The first step of a drain task: drop the flag, so any later commit kicks again.

    Returns ``time.monotonic()`` read after the delete, for :func:`linger`. Also forgets this
    process's own suppression window for ``name`` (forgetting one only costs a round trip).
    """
    _pending_until.pop(name, None)
    try:
        _cache().delete(flag_key(name))
    except Exception as exc:  # cache down: kicks send anyway meanwhile
        logger.warning("wake-up %s: could not clear the flag (%s)", name, exc)
    return time.monotonic()


def linger(cleared_at: float, local_window: float, looked_at: float) -> float:
    """Seconds a drain must still wait before returning, when its look that started at
    ``looked_at`` (``time.monotonic()``) found nothing: 0 if it may return now. ``cleared_at``
    is what :func:`clear` returned; ``local_window`` the producers' window (0: never wait)."""
    if local_window <= 0:
        return 0.0
    return max(0.0, cleared_at + local_window + LINGER_MARGIN - looked_at)


def schedule(
    name: str, task: Any, countdown: float, *, args: tuple[Any, ...] = (), **options: Any
) -> bool:
    """Send ``task`` in ``countdown`` seconds (a timer for work due later); one timer per
    second per name. Returns True if a message was sent."""
    countdown = max(0.0, float(countdown))
    due = int(time.time() + countdown)
    try:
        first = _cache().add(f"{flag_key(name)}:at:{due}", 1, timeout=countdown + 60)
    except Exception:
        first = True
    if not first:
        return False
    try:
        _send(task, countdown, options, args)
    except Exception as exc:
        logger.warning("timer %s not sent (%s); the periodic drain will pick it up", name, exc)
        return False
    return True


T = TypeVar("T")


class DrainRun:
    """One run of a drain task (see :meth:`Wakeup.draining`): the run's budget, its looks for
    work, and what to do when it ends (re-kick, timer). Without a wake-up (``wakeup=None``: a
    direct call, e.g. a management command) it only keeps the budget."""

    def __init__(
        self,
        seconds: float,
        *,
        wakeup: Wakeup | None = None,
        cleared_at: float = 0.0,
        window: float = 0.0,
    ) -> None:
        self.wakeup = wakeup
        self.cleared_at = cleared_at
        self.window = window
        #: ``time.monotonic()`` after which no further item is started.
        self.deadline = time.monotonic() + seconds
        #: The run stopped with work left (budget spent): re-kick on exit.
        self.more = False
        #: Seconds until the earliest item left waiting is due: a timer on exit.
        self.next_in: float | None = None

    def looks(self, fetch: Callable[[], T]) -> Iterator[T]:
        """Yield what each call of ``fetch`` finds, until the run is stopped or a look finds
        nothing late enough after the clear (the linger of the module docstring: a look that
        found nothing too soon is followed by a sleep and another look)."""
        while not self.more:
            looked_at = time.monotonic()
            found = fetch()
            if found:
                yield found
                continue
            wait = linger(self.cleared_at, self.window, looked_at)
            if wait <= 0:
                return
            time.sleep(wait)

    def time_left(self) -> bool:
        """False once the time budget is spent; the run is then stopped (:meth:`stop`)."""
        if time.monotonic() < self.deadline:
            return True
        self.stop()
        return False

    def stop(self) -> None:
        """End the run with work left: it kicks the drain again when it exits."""
        self.more = True

    def retry_in(self, seconds: float) -> None:
        """Items become due in ``seconds``: a timer on exit (the earliest wins)."""
        if self.next_in is None or seconds < self.next_in:
            self.next_in = seconds


class Wakeup:
    """A coalesced wake-up: ``name`` (its cache flag; a string or a callable giving one),
    ``task`` (the drain it sends), ``window`` (a callable giving the local suppression window
    in seconds, read by the producers' kicks and the drain's linger alike: 0, the default,
    for no window), ``options`` (a callable giving ``apply_async`` options, e.g. the queue)
    and ``args`` (the task's positional arguments, sent with every kick and timer)."""

    def __init__(
        self,
        name: str | Callable[[], str],
        task: Any,
        *,
        window: Callable[[], float] | None = None,
        options: Callable[[], dict[str, Any]] | None = None,
        args: tuple[Any, ...] = (),
    ) -> None:
        self._name = name
        self._fixed_name = name if isinstance(name, str) else ""
        self.task = task
        self._window = window
        self._options = options
        self.args = tuple(args)

    @property
    def name(self) -> str:
        return self._fixed_name or self._name()  # type: ignore[operator]

    def window(self) -> float:
        return self._window() if self._window is not None else 0.0

    def options(self) -> dict[str, Any]:
        return self._options() if self._options is not None else {}

    def kick(self) -> bool:
        """For producers, after the item's transaction committed: wake the drain unless a
        wake-up is pending (within this process's window, not even a cache round trip).
        Returns True if a message was sent; never raises."""
        name = self._fixed_name or self._name()  # type: ignore[operator]
        if _pending_until.get(name, 0.0) > time.monotonic():  # the hot path: nothing to do
            return False
        return kick(name, self.task, local_window=self.window(), args=self.args, **self.options())

    def kick_on_commit(self, *, using: str | None = None) -> None:
        """:meth:`kick` once the current transaction commits (at once in autocommit): once
        for the whole transaction, however many items it writes (:func:`on_commit_once`)."""
        on_commit_once(self.kick, using=using)

    def schedule(self, countdown: float) -> bool:
        """A timer: send the drain in ``countdown`` seconds (see :func:`schedule`)."""
        return schedule(self.name, self.task, countdown, args=self.args, **self.options())

    @contextlib.contextmanager
    def draining(self, *, seconds: float) -> Iterator[DrainRun]:
        """For the drain task: clear the flag (first, before any look), run the body, then
        re-kick through the cache (never suppressed locally) if the run stopped with work
        left, else set a timer for the earliest item left waiting. An exception leaves both
        to the redelivery and the periodic sweep."""
        name = self.name
        window = self.window()
        cleared_at = clear(name)
        run = DrainRun(seconds, wakeup=self, cleared_at=cleared_at, window=window)
        yield run
        if run.more:
            kick(name, self.task, args=self.args, **self.options())
        elif run.next_in is not None:
            schedule(name, self.task, run.next_in, args=self.args, **self.options())
