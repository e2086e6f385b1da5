"""When and how long to wait before retrying a call (DESIGN.md, "retries")."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime


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
