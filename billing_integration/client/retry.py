"""When and how long to wait before retrying a call, and the deadline of a call a person
waits on."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from urllib3.util import Timeout


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 4
    backoff_base: float = 0.5
    backoff_max: float = 20.0
    retry_after_max: float = 60.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based).

        A server's ``Retry-After`` is honoured (capped at ``retry_after_max``); otherwise
        exponential backoff with full jitter, capped at ``backoff_max``.
        """
        if retry_after is not None:
            return max(0.0, min(retry_after, self.retry_after_max))
        ceiling = min(self.backoff_max, self.backoff_base * (2**attempt))
        return random.uniform(0, ceiling)

    def wait_before_retry(
        self,
        attempt: int,
        retry_after: float | None = None,
        deadline: Deadline | None = None,
    ) -> float | None:
        """Seconds to wait before retry number ``attempt``, or ``None``: give up now.

        Gives up once ``max_retries`` retries were made and, with a ``deadline``, when the wait
        would leave less than ``MIN_ATTEMPT`` seconds for the next attempt; a server's
        ``Retry-After`` beyond the deadline also means giving up at once (asking sooner than
        the server said is pointless and impolite).
        """
        if attempt >= self.max_retries:
            return None
        wait = self.delay(attempt, retry_after)
        if deadline is not None:
            asked = wait if retry_after is None else max(wait, retry_after)
            if asked + MIN_ATTEMPT > deadline.remaining():
                return None
        return wait


#: Seconds an attempt needs at least; with less time left before a deadline none is started.
MIN_ATTEMPT = 0.25
#: Seconds of a person's deadline kept for the page after its last call (the error or result
#: page, the database work around the calls): the calls get ``INTERACTIVE_DEADLINE`` minus this,
#: so the whole request, not only its calls, ends by the deadline.
PAGE_MARGIN = 0.25


class Deadline:
    """A point in time (monotonic clock) by which a call, all its retries and the waits
    between them must be over: the bound of a request a person waits on.

    One ``Deadline`` may be shared by several calls (the checkout view's customer push and
    session creation), so the person's total wait is bounded, not each call's. ``clock`` is
    injectable for tests.
    """

    __slots__ = ("_clock", "at", "seconds")

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.seconds = float(seconds)
        self.at = clock() + self.seconds

    def remaining(self) -> float:
        """Seconds left (never negative)."""
        return max(0.0, self.at - self._clock())

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0.0

    def timeout(self, connect: float, read: float) -> Timeout:
        """A transport timeout that does not outlast the deadline: connect and read each cut
        to the time left, and ``total`` (connect and read together) the time left, so a slow
        connect leaves the read only what remains."""
        left = self.remaining()
        return Timeout(connect=min(connect, left), read=min(read, left), total=left)

    def __repr__(self) -> str:
        return f"Deadline({self.seconds:g}s, {self.remaining():.2f}s left)"


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds: either delta-seconds or an HTTP date. ``None`` if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
