"""Reading the envelope ``{"id", "type", "created_at", "data"}`` tolerantly (other common key
names too): odd values give empty fields, never an error."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..timestamps import parse_timestamp

_ID_KEYS = ("id", "event_id", "eventId", "uuid")
_TYPE_KEYS = ("type", "event_type", "eventType", "event", "name")
_TIME_KEYS = ("created_at", "createdAt", "timestamp", "occurred_at", "date_created", "created")
_DATA_KEYS = ("data", "payload", "object", "resource")


def clean_text(value: str, limit: int | None = None) -> str:
    """A string PostgreSQL accepts (no NUL characters), optionally cut to ``limit``."""
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    return value[:limit] if limit is not None else value


def parse_time(value: Any) -> datetime | None:
    """A datetime from an ISO string or a unix timestamp (seconds or milliseconds)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        if isinstance(value, (int, float)):
            seconds = value / 1000 if value > 1e11 else value
            return datetime.fromtimestamp(seconds, tz=UTC)
        if isinstance(value, str):
            text = value.strip()
            if text.isdigit():
                return parse_time(int(text))
            return parse_timestamp(text)
    except (ValueError, OverflowError, OSError):
        return None
    return None


def _first(mapping: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        if key in mapping:
            return mapping[key]
    return None


@dataclass
class Envelope:
    event_id: str
    raw_type: str
    occurred_at: datetime | None
    data: dict[str, Any] = field(default_factory=dict)
    #: The time as sent: set while ``occurred_at`` is None, it did not parse.
    occurred_raw: Any = None

    @property
    def object_id(self) -> str:
        value = self.data.get("id")
        return clean_text(str(value), 64) if isinstance(value, (str, int)) else ""


def read_envelope(payload: dict[str, Any], *, message_id: str | None, body: bytes) -> Envelope:
    """Id, type, time and data of an envelope. The id is the envelope's ``id``, else the
    ``webhook-id`` header, else a hash of the body (an identical redelivery is recognised)."""
    raw_id = _first(payload, _ID_KEYS)
    if isinstance(raw_id, (str, int)) and not isinstance(raw_id, bool) and str(raw_id).strip():
        event_id = str(raw_id).strip()
    elif message_id:
        event_id = message_id
    else:
        event_id = "sha256:" + hashlib.sha256(body).hexdigest()
    if len(event_id) > 255:
        event_id = "sha256:" + hashlib.sha256(event_id.encode("utf-8", "replace")).hexdigest()
    raw_type = _first(payload, _TYPE_KEYS)
    raw_type = raw_type if isinstance(raw_type, str) else ""
    data = _first(payload, _DATA_KEYS)
    if isinstance(data, dict) and isinstance(data.get("object"), dict) and "id" not in data:
        data = data["object"]
    raw_time = _first(payload, _TIME_KEYS)
    return Envelope(
        event_id=clean_text(event_id),
        raw_type=clean_text(raw_type, 255),
        occurred_at=parse_time(raw_time),
        data=data if isinstance(data, dict) else {},
        occurred_raw=raw_time,
    )
