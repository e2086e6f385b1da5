"""The service "known down until T" (``billing:backoff:until`` in ``shared_cache()``), set by a
capped ``Retry-After`` or by a call that failed on retryable errors until its retries or its
deadline ran out; the window only grows. A background call waits it out; a call a person waits
on fails at once, sending nothing. Each process rereads it at most every ``REFRESH`` seconds;
a failing cache counts as no window."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from ..conf import shared_cache

logger = logging.getLogger("billing_integration.client")

KEY = "billing:backoff:until"
KNOWN_DOWN_SECONDS = 10.0  # seconds the service is known down after a call failed to the end
REFRESH = 0.5  # seconds a process trusts its copy of the window


class SharedBackoff:
    """The shared window as one client sees it. ``clock`` is a wall clock (compared across
    processes); ``alias`` names another cache than ``BILLING['CACHE']`` (tests)."""

    def __init__(self, alias: str | None = None, *, clock: Callable[[], float] = time.time):
        self.alias = alias
        self.clock = clock
        self._until = 0.0  # the local copy
        self._checked_at = -math.inf

    def _cache(self) -> Any:
        if self.alias is None:
            return shared_cache()
        from django.core.cache import caches

        return caches[self.alias]

    def wait(self) -> float:
        """Seconds left in the window (0.0: call now)."""
        now = self.clock()
        if self._until <= now and now - self._checked_at >= REFRESH:
            self._checked_at = now
            try:
                self._until = max(self._until, float(self._cache().get(KEY) or 0.0))
            except Exception as exc:  # a cache outage never blocks a call
                logger.warning("billing backoff: cache unavailable (%s)", exc)
        return max(0.0, self._until - now)

    def publish(self, seconds: float) -> None:
        """Extend the window to at least ``seconds`` from now."""
        until = self.clock() + seconds
        if seconds <= 0 or self._until >= until:
            return
        self._until = until
        try:
            cache = self._cache()
            if float(cache.get(KEY) or 0.0) < until:
                cache.set(KEY, until, timeout=math.ceil(seconds) + 1)
        except Exception as exc:  # the local copy still holds in this process
            logger.warning("billing backoff: cache unavailable (%s)", exc)
            return
        logger.warning("billing: every worker backs off for %.2fs", seconds)

    def reset(self) -> None:
        self._until, self._checked_at = 0.0, -math.inf


def clear_shared_backoff() -> None:
    """End the window (tests; an operator who knows the service is back)."""
    shared_cache().delete(KEY)
