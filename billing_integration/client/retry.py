"""How long to wait before a retry, and the deadline of a call a person waits on."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from urllib3.util import Timeout

MAX_RETRIES = 4  # retries after the first attempt (background calls)
BACKOFF_BASE = 0.5  # seconds: retry n waits a random time up to BACKOFF_BASE * 2**n
BACKOFF_MAX = 20.0  # seconds: the cap of one computed wait
RETRY_AFTER_MAX = 60.0  # seconds: the cap of an honoured Retry-After
MIN_ATTEMPT = 0.25  # seconds an attempt needs at least; with less left none starts
PAGE_MARGIN = 0.25  # seconds of a person's deadline kept for the page after the last call


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = MAX_RETRIES
    backoff_base: float = BACKOFF_BASE
    backoff_max: float = BACKOFF_MAX
    retry_after_max: float = RETRY_AFTER_MAX

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds before retry ``attempt`` (0-based): the server's ``Retry-After`` (capped),
        else exponential backoff with full jitter."""
        if retry_after is not None:
            return max(0.0, min(retry_after, self.retry_after_max))
        return random.uniform(0, min(self.backoff_max, self.backoff_base * 2**attempt))

    def wait_before_retry(
        self, attempt: int, retry_after: float | None = None, deadline: Deadline | None = None
    ) -> float | None:
        """Seconds before retry ``attempt``, or ``None`` to give up: the retries are used up,
        or the wait (or the server's ``Retry-After``) leaves the deadline no time to try."""
        if attempt >= self.max_retries:
            return None
        wait = self.delay(attempt, retry_after)
        asked = wait if retry_after is None else max(wait, retry_after)
        if deadline is not None and asked + MIN_ATTEMPT > deadline.remaining():
            return None
        return wait


def default_policy() -> RetryPolicy:
    """The policy of the module constants, read now."""
    return RetryPolicy(MAX_RETRIES, BACKOFF_BASE, BACKOFF_MAX, RETRY_AFTER_MAX)


class Deadline:
    """A moment (monotonic clock) by which a call, its retries and the waits between them are
    over. One deadline may be shared by several calls of one request."""

    __slots__ = ("_clock", "at", "seconds")

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.seconds = float(seconds)
        self.at = clock() + self.seconds

    def remaining(self) -> float:
        return max(0.0, self.at - self._clock())

    def timeout(self, connect: float, read: float) -> Timeout:
        """Connect and read timeouts cut to the time left, and their total the time left."""
        left = self.remaining()
        return Timeout(connect=min(connect, left), read=min(read, left), total=left)

    def __repr__(self) -> str:
        return f"Deadline({self.seconds:g}s, {self.remaining():.2f}s left)"


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date); ``None`` if absent or bad."""
    if not value:
        return None
    with suppress(ValueError):
        return max(0.0, float(value.strip()))
    try:
        when = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
