"""Helpers shared by the per-resource mappings."""

from __future__ import annotations

import logging
import math
import re
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import lru_cache
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
#: Levels of objects and lists a JSON column keeps (the answer itself is the first).
MAX_JSON_DEPTH = 100
#: The dates a time zone can show (no UTC offset reaches a day): one nearer the calendar's ends
#: (year 1, the year 9999 "forever") is stored as this bound, the same answer at any time.
EARLIEST = datetime.min.replace(tzinfo=UTC) + timedelta(days=1)
LATEST = datetime.max.replace(tzinfo=UTC) - timedelta(days=1)


@lru_cache(maxsize=1000)
def log_once(message: str, value: str) -> None:
    """A warning about ``value`` logged once per process (a value the settings do not know)."""
    logger.warning(message, value)


def as_uuid(value: Any) -> uuid.UUID | None:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def reference(value: Any, field: str) -> uuid.UUID | None:
    """The UUID another resource is named by (any spelling ``uuid.UUID`` reads: capitals,
    braces; or the ``id`` of the resource given whole), None for null or ``""``, else
    ``RemoteDataError`` naming ``field``."""
    if isinstance(value, dict) and "id" in value:  # an expanded reference
        value = value["id"]
    if value is None or value == "":
        return None
    found = as_uuid(value) if isinstance(value, str) else None
    if found is None:
        raise RemoteDataError(field, value, "not a UUID")
    return found


def ts(value: Any, field: str = "timestamp") -> datetime | None:
    """A wire timestamp as an aware UTC datetime (None for null; within ``EARLIEST`` and
    ``LATEST``), else ``RemoteDataError``."""
    if isinstance(value, datetime):
        return value
    try:
        parsed = parse_timestamp(value)
    except (ValueError, OverflowError):
        raise RemoteDataError(field, value, "not a timestamp") from None
    return None if parsed is None else min(max(parsed, EARLIEST), LATEST)


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


def _storable(value: Any, depth: int, problems: set[str]) -> Any:
    if isinstance(value, str):
        cleaned, count = _UNSTORABLE.subn("\ufffd", value)
        if count:
            problems.add("a NUL character or a lone surrogate is stored as U+FFFD")
        return cleaned
    if isinstance(value, float) and not math.isfinite(value):
        problems.add("NaN or a number beyond a float's range (1e400) is stored as null")
        return None
    if isinstance(value, (dict, list)) and depth > MAX_JSON_DEPTH:
        problems.add(f"a value nested deeper than {MAX_JSON_DEPTH} levels is stored as null")
        return None
    if isinstance(value, dict):
        return {
            _storable(k, depth, problems): _storable(v, depth + 1, problems)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_storable(v, depth + 1, problems) for v in value]
    return value


def storable(value: Any, what: str = "answer") -> Any:
    """A JSON value (an answer as received) as every database stores it in a JSON column: a
    NUL character or a lone surrogate, in a string or a key, becomes U+FFFD (PostgreSQL's
    ``jsonb`` refuses both); NaN and infinity (the client reads ``1e400`` so), which no JSON
    column takes, and an object or a list nested deeper than ``MAX_JSON_DEPTH`` levels
    (writing it would exceed Python's recursion limit) become null; each logged with
    ``what``. The rest as it is."""
    problems: set[str] = set()
    stored = _storable(value, 1, problems)
    if problems:
        logger.warning("%s: %s", what, "; ".join(sorted(problems)))
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


def normal_status(model: type[models.Model], value: Any) -> str:
    """A status as the interface spells them, stripped and lower-cased (``" Published "`` is
    ``published``); ``""`` for null; ``RemoteDataError`` as ``text`` gives."""
    return text(model, "status", value).strip().lower()


def carried(data: dict[str, Any], source: dict[str, str], name: str) -> bool:
    """Whether an event's data or a pulled resource carries a value for the field ``name``
    (read from the key ``source`` names, else from ``name``): present, and for a status, a
    name, a record's amount or currency, a subscription's ``auto_renew``, cycle or currency, a
    product's ``selected_currencies`` or the id of another object, neither null nor empty. A
    field left out, or one of those sent as null, keeps what is stored: the service never takes
    those away (an empty list of currencies applies)."""
    key = source.get(name, name)
    if key not in data:
        return False
    kept: tuple[str, ...] = ("status", "name", "amount", "currency", "auto_renew")
    kept += ("selected_billing_cycle", "selected_currency", "selected_currencies")
    kept_when_null = name in kept or name.endswith("_remote_id")
    return not (kept_when_null and data[key] in (None, ""))
