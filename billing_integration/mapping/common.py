"""Helpers shared by the per-resource mappings."""

from __future__ import annotations

import logging
import re
import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import models

from ..exceptions import RemoteDataError
from ..timestamps import format_timestamp, parse_timestamp

logger = logging.getLogger("billing_integration.mapping")

#: The ``RemoteObject`` fields every resource fills the same way.
META_FIELDS: tuple[str, ...] = (
    "remote_id",
    "remote_created",
    "remote_updated",
    "remote_user_created",
)
META_FIELDS += ("remote_user_updated", "remote_data")
#: Characters PostgreSQL's ``jsonb`` refuses (a NUL, a lone surrogate such as the JSON escape
#: ``"\ud800"`` gives): a JSON column keeps U+FFFD instead, on every database.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def as_uuid(value: Any) -> uuid.UUID | None:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def ts(value: Any, field: str = "timestamp") -> datetime | None:
    """A wire timestamp as an aware UTC datetime (None for null), else ``RemoteDataError``."""
    if isinstance(value, datetime):
        return value
    try:
        return parse_timestamp(value)
    except (ValueError, OverflowError):
        raise RemoteDataError(field, value, "not a timestamp") from None


def wire_ts(value: datetime | None) -> str | None:
    return None if value is None else format_timestamp(value)


def wire_amount(value: Decimal | float | int) -> int | float:
    """A JSON number: an integer when the amount is whole, else a float."""
    dec = Decimal(str(value))
    return int(dec) if dec == dec.to_integral_value() else float(dec)


def as_decimal(value: Any) -> Decimal:
    return Decimal(str(value)).quantize(Decimal("0.01"))


def lenient_ts(value: Any, field: str = "timestamp") -> datetime | None:
    """``ts``, with None for a value that does not parse."""
    try:
        return ts(value, field)
    except RemoteDataError:
        return None


def _storable(value: Any) -> tuple[Any, bool]:
    """``(value as a JSON column stores it, whether a character was replaced)``."""
    if isinstance(value, str):
        cleaned, count = _UNSTORABLE.subn("\ufffd", value)
        return cleaned, count > 0
    if isinstance(value, dict):
        items = [(_storable(k), _storable(v)) for k, v in value.items()]
        if not any(k[1] or v[1] for k, v in items):
            return value, False
        return {k[0]: v[0] for k, v in items}, True
    if isinstance(value, list):
        elements = [_storable(v) for v in value]
        if not any(changed for _, changed in elements):
            return value, False
        return [v for v, _ in elements], True
    return value, False


def storable(value: Any, what: str = "answer") -> Any:
    """A JSON value (an answer as received) as every database stores it in a JSON column: a
    NUL character or a lone surrogate, in a string or a key, becomes U+FFFD (logged with
    ``what``); the rest as it is."""
    stored, replaced = _storable(value)
    if replaced:
        logger.warning(
            "%s: a NUL character or a lone surrogate is stored as U+FFFD (PostgreSQL's "
            "jsonb refuses it)",
            what,
        )
    return stored


def remote_meta(data: dict[str, Any], *, strict: bool = True) -> dict[str, Any]:
    """The ``RemoteObject`` field values of any resource (``strict=False``: a date that does
    not parse is None, not an error); ``remote_data`` as ``storable`` keeps it."""
    stamp = ts if strict else lenient_ts
    return {
        "remote_id": as_uuid(data.get("id")),
        "remote_created": stamp(data.get("date_created"), "date_created"),
        "remote_updated": stamp(data.get("date_updated"), "date_updated"),
        "remote_user_created": as_uuid(data.get("user_created")),
        "remote_user_updated": as_uuid(data.get("user_updated")),
        "remote_data": storable(data, f"remote_data of {str(data.get('id'))[:64]}"),
    }


def text(model: type[models.Model], name: str, value: Any, field: str | None = None) -> str:
    """A string the column ``name`` of ``model`` stores as it is (``""`` for null, a number as
    its text: a phone may come as one), else ``RemoteDataError`` naming the resource ``field``
    (default ``name``): not a string or a number, longer than the column, or with a NUL or a
    lone surrogate (a JSON escape such as ``"\\ud800"``: no database takes it)."""
    field = field or name
    if value is None:
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise RemoteDataError(field, value, "not a string")
    limit = getattr(model._meta.get_field(name), "max_length", None)
    if limit and len(value) > limit:
        raise RemoteDataError(field, value, f"longer than {limit} characters ({len(value)})")
    if "\x00" in value:
        raise RemoteDataError(field, value, "contains a NUL character")
    if _UNSTORABLE.search(value):
        raise RemoteDataError(field, value, "contains a lone surrogate")
    return value
