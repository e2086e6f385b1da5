"""Backing off together: one shared "wait until" in the cache for every worker of a project.

When the service answers 429 or 5xx, or stops answering, retrying on one's own is not enough:
the other processes keep calling. A client that sees a ``Retry-After`` (429, or a 5xx that
sends one), or a run of ``BACKOFF_FAILURE_RUN`` failures in a row, writes
``billing:backoff:until`` (a wall-clock time) to the cache of ``BILLING['BACKOFF_CACHE']``
(default: ``KICK_CACHE``, then ``TOKEN_CACHE``). A call with a deadline (a person waits on it)
that fails to the end extends it to at least ``KNOWN_DOWN_SECONDS``: the service is then
"known down". Before each attempt a client reads it: a background call waits until then, a
call with a deadline fails at once (nothing is sent), and the pages a person waits on ask
``BillingClient.known_down()`` first. The window is only extended, never shortened; it ends
on its own.

Cheap when all is well: each client keeps a local copy of "until" and reads the cache at most
once per ``BACKOFF_REFRESH`` seconds (0.5), so a process learns of another's backoff at most
that late (the staleness bound), and a burst of calls costs one cache read per interval, not
one per call. A window this process published itself is known at once. A cache that fails
(down, unreachable) never blocks a call: the client falls back to its own retries and leaves
the cache alone for one refresh interval.

A 429 also sets a shared *pace* (``billing:backoff:pace``): once the window ends, every worker
together sends at most that many calls a second, so they do not all rush back at the limit
that refused them. The first 429 starts it at half the calls this process had answered in
the last second (at least ``PACE_MIN``); each later 429 halves the pace then in force (at
most once a second: the 429s of calls already in flight count once). Without a 429 the pace
doubles every ``PACE_DOUBLING`` seconds, and stops once past ``PACE_OFF`` calls a second.
Calls take their turn in slots of the cache: a counter per time slot of ``1 / pace`` seconds
(one call each), or of 50 ms when the pace is above 20 a second; a call finding its slot
taken waits for the next one. So a paced call costs one cache increment (and an add for a
slot's first call); a process that has seen no 429, and none of the others has, pays
nothing for it. A cache that cannot count
atomically (the database or file cache) may let two calls share a slot.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..conf import billing_settings

logger = logging.getLogger("billing_integration.client")

KEY = "billing:backoff:until"
PACE_KEY = "billing:backoff:pace"  # (calls a second, wall time it counts from)
SLOT_KEY = "billing:backoff:slot"
PACE_MIN = 1.0  # calls a second: the slowest pace
PACE_OFF = 1000.0  # a pace grown past this many calls a second is over
PACE_TTL = 600  # seconds the cache keeps a pace after the 429 that set it
#: Seconds the window is held open after a call a person waited on failed to the end (its
#: deadline or retries used up on timeouts, refused connections, 5xx, 429): the service is
#: "known down" until then, so the next person is answered at once (from the mirror, or
#: "service unavailable") instead of waiting on it again; background work waits it out.
KNOWN_DOWN_SECONDS = 10.0


class SharedBackoff:
    """The shared backoff window as one client sees it. Thread-safe; ``clock`` is a wall
    clock (``time.time``: the value is compared across processes), injectable for tests."""

    def __init__(
        self,
        alias: str | None,
        *,
        enabled: bool = True,
        refresh: float = 0.5,
        failure_run: int = 3,
        pace_doubling: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.alias = alias
        self.enabled = enabled and alias is not None
        self.refresh = float(refresh)
        self.failure_run = int(failure_run)
        self.clock = clock
        self._lock = threading.Lock()
        self._until = 0.0  # the local copy of the shared "until"
        self._checked_at = -math.inf  # when the cache was last read (or found failing)
        self._failures = 0  # retryable failures in a row, in this client
        self.pace_doubling = float(pace_doubling)  # 0: no pace after a 429
        self._pace: tuple[float, float] | None = None  # the local copy of the shared pace
        self._answered: deque[float] = deque()  # when this client's calls were answered

    @classmethod
    def from_settings(cls, clock: Callable[[], float] = time.time) -> SharedBackoff:
        conf = billing_settings
        return cls(
            backoff_alias(),
            enabled=bool(conf.SHARED_BACKOFF),
            refresh=float(conf.BACKOFF_REFRESH),
            failure_run=int(conf.BACKOFF_FAILURE_RUN),
            pace_doubling=float(conf.PACE_DOUBLING),
            clock=clock,
        )

    def _cache(self) -> Any:
        from django.core.cache import caches

        return caches[self.alias]

    def wait(self) -> float:
        """Seconds left in the shared backoff window (0.0: call now). Reads the cache at most
        once per ``refresh`` seconds; a cache error counts as no window."""
        if not self.enabled:
            return 0.0
        now = self.clock()
        if self._until > now:
            return self._until - now
        if now - self._checked_at < self.refresh:
            return 0.0
        with self._lock:
            self._checked_at = now
        try:
            values = self._cache().get_many([KEY, PACE_KEY])
        except Exception as exc:  # a cache outage never blocks a call
            logger.warning("billing backoff: cache %r unavailable (%s)", self.alias, exc)
            return 0.0
        try:
            until = float(values.get(KEY) or 0.0)
        except (TypeError, ValueError):
            until = 0.0
        with self._lock:
            self._until = max(self._until, until)
            self._pace = _as_pace(values.get(PACE_KEY))
        return max(0.0, self._until - now)

    def succeeded(self) -> None:
        """An answer that is not a retryable failure: the run of failures is over."""
        if self.enabled and self.pace_doubling > 0:
            now = self.clock()
            with self._lock:
                self._answered.append(now)
                while self._answered and self._answered[0] <= now - 1.0:
                    self._answered.popleft()
        if self._failures:
            with self._lock:
                self._failures = 0

    def failed(self, retry_after: float | None, policy: Any, *, rate_limited: bool = False) -> None:
        """A retryable failure (429, 5xx, timeout, connection error): publish the server's
        ``Retry-After`` (capped by ``policy.retry_after_max``), or, once ``failure_run``
        failures came in a row, the policy's backoff for the run's length. A 429
        (``rate_limited``) also slows the shared pace down."""
        if not self.enabled:
            return
        with self._lock:
            self._failures += 1
            failures = self._failures
        wait = None
        if retry_after is not None:
            wait = max(0.0, min(float(retry_after), policy.retry_after_max))
        elif failures >= self.failure_run > 0:
            extra = failures - self.failure_run
            wait = min(policy.backoff_max, policy.backoff_base * (2 ** min(extra, 30)))
        if wait:
            self.publish(wait)
        if rate_limited and self.pace_doubling > 0:
            self._slow_down()

    def publish(self, seconds: float) -> None:
        """Extend the shared window to at least ``seconds`` from now (never shorten it)."""
        if not self.enabled or seconds <= 0:
            return
        now = self.clock()
        until = now + seconds
        with self._lock:
            if self._until >= until:
                return
            self._until = until
        try:
            cache = self._cache()
            current = cache.get(KEY)
            try:
                if current is not None and float(current) >= until:
                    return
            except (TypeError, ValueError):
                pass
            cache.set(KEY, until, timeout=math.ceil(seconds) + 1)
        except Exception as exc:  # the local window still holds in this process
            logger.warning("billing backoff: cache %r unavailable (%s)", self.alias, exc)
            return
        logger.warning("billing: every worker backs off for %.2fs", seconds)

    def pace(self) -> float | None:
        """The calls a second every worker together keeps to now, as this process knows it
        (its copy is as fresh as the window's), or None: no pace."""
        if not self.enabled or self.pace_doubling <= 0 or self._pace is None:
            return None
        rate = _grown(self._pace, self.clock(), self.pace_doubling)
        return rate if rate < PACE_OFF else None

    def slot(self) -> float:
        """Take a turn to call under the shared pace: 0.0 when this call may go now (its slot
        is taken), else the seconds until the next slot, to wait before asking again. No pace,
        or a cache that fails: 0.0."""
        rate = self.pace()
        if rate is None:
            return 0.0
        rate = 2 ** (math.floor(4 * math.log2(rate)) / 4)  # in steps, so slots change rarely
        width = max(1.0 / rate, 0.05)
        allowed = max(1, int(rate * width))
        now = self.clock()
        index = int(now // width)
        key = f"{SLOT_KEY}:{width:.4f}:{index}"
        try:
            cache = self._cache()
            try:
                taken = cache.incr(key)
            except ValueError:  # the slot's first call creates its counter
                taken = 1 if cache.add(key, 1, timeout=math.ceil(width) + 2) else cache.incr(key)
        except Exception as exc:  # a cache outage never blocks a call
            logger.warning("billing backoff: cache %r unavailable (%s)", self.alias, exc)
            return 0.0
        if taken <= allowed:
            return 0.0
        # The next slot, with a little jitter so that the waiters do not all ask at once.
        return (index + 1) * width - now + random.random() * min(width, 1.0) * 0.1

    def _slow_down(self) -> None:
        """A 429: halve the pace in force (none yet: start at half this process's calls
        answered in the last second), counting from the end of the window. Not again within
        a second of the last halving, so the 429s of calls already in flight count once."""
        now = self.clock()
        try:
            current = _as_pace(self._cache().get(PACE_KEY))
        except Exception:
            current = None
        with self._lock:
            pace = current or self._pace
            if pace is not None and now < pace[1] + 1.0:
                self._pace = pace  # halved a moment ago, by this process or another
                return
            rate = _grown(pace, now, self.pace_doubling) if pace is not None else PACE_OFF
            if rate >= PACE_OFF:  # no pace in force: start from what this process saw
                rate = float(sum(1 for t in self._answered if t > now - 1.0))
            new = (max(PACE_MIN, rate / 2), max(now, self._until))
            self._pace = new
        try:
            self._cache().set(PACE_KEY, new, timeout=PACE_TTL)
        except Exception as exc:  # the local pace still holds in this process
            logger.warning("billing backoff: cache %r unavailable (%s)", self.alias, exc)
            return
        logger.warning("billing: every worker keeps to %.1f calls a second (429)", new[0])

    def reset(self) -> None:
        """Forget the local copy and the run of failures (tests; a settings change)."""
        with self._lock:
            self._until = 0.0
            self._checked_at = -math.inf
            self._failures = 0
            self._pace = None
            self._answered.clear()


def _as_pace(value: Any) -> tuple[float, float] | None:
    """A pace read from the cache, or None when there is none (or it is malformed)."""
    try:
        rate, since = (float(v) for v in value)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(rate) and math.isfinite(since)):
        return None
    return (max(PACE_MIN, rate), since)


def _grown(pace: tuple[float, float], now: float, doubling: float) -> float:
    """The pace at ``now``: it doubles every ``doubling`` seconds after its start."""
    rate, since = pace
    return rate * 2 ** (max(0.0, now - since) / doubling)


def backoff_alias() -> str:
    """The cache alias of the shared window: ``BACKOFF_CACHE``, else ``KICK_CACHE``, else
    ``TOKEN_CACHE``."""
    conf = billing_settings
    return conf.BACKOFF_CACHE or conf.KICK_CACHE or conf.TOKEN_CACHE


def clear_shared_backoff() -> None:
    """Delete the shared window and pace (tests; an operator who knows the service is
    back)."""
    from django.core.cache import caches

    caches[backoff_alias()].delete_many([KEY, PACE_KEY])
