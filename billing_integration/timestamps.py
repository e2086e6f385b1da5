"""The service's timestamp form: ISO 8601 UTC with milliseconds (``2025-01-31T12:00:00.000Z``)."""

from __future__ import annotations

from datetime import UTC, datetime

#: Seconds a time of the service's may be off ours: a delivery's ``webhook-timestamp`` (either
#: way, the Standard Webhooks default); a stored version ahead (``models.base.trusted_until``).
TOLERANCE = 300


def format_timestamp(value: datetime) -> str:
    """Render an aware (or UTC-naive) datetime in the service's form."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def parse_timestamp(value: str | None) -> datetime | None:
    """A timestamp from the service (any ISO 8601 variant, ``t`` and ``z`` in any case) in UTC;
    None for none."""
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise ValueError(f"Not a timestamp: {value!r}")
    parsed = datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)
