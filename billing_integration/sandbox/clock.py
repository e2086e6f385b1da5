"""The sandbox's clock: real time plus an offset that tests advance, and timestamp helpers.

Timestamps on the wire are ISO 8601 UTC with milliseconds: ``2025-01-31T12:00:00.000Z``.
"""

from __future__ import annotations

import calendar
import re
import threading
from datetime import UTC, datetime, timedelta

_TS = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?$")
CYCLE_UNITS = ("months", "years")


def fmt(dt: datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SS.mmmZ`` in UTC."""
    dt = dt.astimezone(UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def parse(value: str) -> datetime:
    """Parse an ISO 8601 timestamp; naive values are UTC. Raises ``ValueError``."""
    if not isinstance(value, str) or not _TS.match(value.strip()):
        raise ValueError(f"not an ISO 8601 timestamp: {value!r}")
    text = value.strip().replace("Z", "+00:00")
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC)


def add_cycle(dt: datetime, unit: str, frequency: int) -> datetime:
    """``dt`` plus ``frequency`` cycle units (months clamp to the month's last day)."""
    months = frequency * (12 if unit == "years" else 1)
    month_index = dt.month - 1 + months
    year = dt.year + month_index // 12
    month = month_index % 12 + 1
    day = min(dt.day, calendar.monthrange(year, month)[1])
    return dt.replace(year=year, month=month, day=day)


def parse_cycle(code: str) -> tuple[str, int]:
    """``"months-1"`` -> ``("months", 1)``. Raises ``ValueError``."""
    if not isinstance(code, str) or "-" not in code:
        raise ValueError("expected <cycle>-<frequency>, e.g. months-1")
    unit, _, freq = code.rpartition("-")
    if unit not in CYCLE_UNITS or not freq.isdigit() or int(freq) < 1:
        raise ValueError("expected <cycle>-<frequency> with cycle months or years, e.g. months-1")
    return unit, int(freq)


class Clock:
    """Real UTC time shifted by a persisted offset (seconds)."""

    def __init__(self, offset: float = 0.0) -> None:
        self._offset = float(offset)
        self._lock = threading.Lock()

    @property
    def offset(self) -> float:
        return self._offset

    def set_offset(self, offset: float) -> None:
        with self._lock:
            self._offset = float(offset)

    def now(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self._offset)

    def now_str(self) -> str:
        return fmt(self.now())

    def timestamp(self) -> float:
        return self.now().timestamp()
