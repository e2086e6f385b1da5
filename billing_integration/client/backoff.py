"""Backing off together: one shared "wait until" in the cache for every worker of a project.

When the service answers 429 or 5xx, or stops answering, retrying on one's own is not enough:
the other processes keep calling. A client that sees a ``Retry-After`` (429, or a 5xx that
sends one), or a run of ``BACKOFF_FAILURE_RUN`` failures in a row, writes
``billing:backoff:until`` (a wall-clock time) to the cache of ``BILLING['BACKOFF_CACHE']``
(default: ``KICK_CACHE``, then ``TOKEN_CACHE``). Before each attempt a client reads it: a
background call waits until then, a call with a deadline that ends first fails at once (nothing
is sent). The window is only extended, never shortened; it ends on its own.

Cheap when all is well: each client keeps a local copy of "until" and reads the cache at most
once per ``BACKOFF_REFRESH`` seconds (0.5), so a process learns of another's backoff at most
that late (the staleness bound), and a burst of calls costs one cache read per interval, not
one per call. A window this process published itself is known at once. A cache that fails
(down, unreachable) never blocks a call: the client falls back to its own retries and leaves
the cache alone for one refresh interval.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from ..conf import billing_settings

logger = logging.getLogger("billing_integration.client")

KEY = "billing:backoff:until"


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

    @classmethod
    def from_settings(cls, clock: Callable[[], float] = time.time) -> SharedBackoff:
        conf = billing_settings
        return cls(
            backoff_alias(),
            enabled=bool(conf.SHARED_BACKOFF),
            refresh=float(conf.BACKOFF_REFRESH),
            failure_run=int(conf.BACKOFF_FAILURE_RUN),
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
            value = self._cache().get(KEY)
        except Exception as exc:  # a cache outage never blocks a call
            logger.warning("billing backoff: cache %r unavailable (%s)", self.alias, exc)
            return 0.0
        try:
            until = float(value) if value is not None else 0.0
        except (TypeError, ValueError):
            until = 0.0
        with self._lock:
            self._until = max(self._until, until)
        return max(0.0, self._until - now)

    def succeeded(self) -> None:
        """An answer that is not a retryable failure: the run of failures is over."""
        if self._failures:
            with self._lock:
                self._failures = 0

    def failed(self, retry_after: float | None, policy: Any) -> None:
        """A retryable failure (429, 5xx, timeout, connection error): publish the server's
        ``Retry-After`` (capped by ``policy.retry_after_max``), or, once ``failure_run``
        failures came in a row, the policy's backoff for the run's length."""
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

    def reset(self) -> None:
        """Forget the local copy and the run of failures (tests; a settings change)."""
        with self._lock:
            self._until = 0.0
            self._checked_at = -math.inf
            self._failures = 0


def backoff_alias() -> str:
    """The cache alias of the shared window: ``BACKOFF_CACHE``, else ``KICK_CACHE``, else
    ``TOKEN_CACHE``."""
    conf = billing_settings
    return conf.BACKOFF_CACHE or conf.KICK_CACHE or conf.TOKEN_CACHE


def clear_shared_backoff() -> None:
    """Delete the shared window (tests; an operator who knows the service is back)."""
    from django.core.cache import caches

    caches[backoff_alias()].delete(KEY)
