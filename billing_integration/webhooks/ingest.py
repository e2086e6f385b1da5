"""Storing a verified delivery and handing it to processing. The envelope ``{"id", "type",
"created_at", "data"}`` is read tolerantly: odd values give empty fields, never an error."""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from django.db import IntegrityError, router, transaction

from ..mapping.common import as_uuid
from ..models import EventState, WebhookEvent
from ..timestamps import parse_timestamp
from .types import normalize_type
from .verification import Verification

logger = logging.getLogger("billing_integration.webhooks")

_ID_KEYS = ("id", "event_id", "eventId", "uuid")
_TYPE_KEYS = ("type", "event_type", "eventType", "event", "name")
_TIME_KEYS = ("created_at", "createdAt", "timestamp", "occurred_at", "date_created", "created")
_DATA_KEYS = ("data", "payload", "object", "resource")
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(value: str, limit: int | None = None) -> str:
    """A string the database accepts (no NUL character, no lone surrogate as a JSON escape
    such as ``"\\ud800"`` gives: U+FFFD for each), optionally cut to ``limit``."""
    value = value.replace("\x00", "\ufffd")
    if not value.isascii():
        value = _SURROGATE.sub("\ufffd", value)
    return value if limit is None else value[:limit]


def parse_time(value: Any) -> datetime | None:
    """A datetime from an ISO string or a unix timestamp (seconds or milliseconds)."""
    try:
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return datetime.fromtimestamp(value / 1000 if value > 1e11 else value, tz=UTC)
        return parse_timestamp(value.strip()) if isinstance(value, str) else None
    except (ValueError, OverflowError, OSError):
        return None


def _first(mapping: dict[str, Any], keys: tuple[str, ...]) -> Any:
    return next((mapping[key] for key in keys if key in mapping), None)


def _one(value: Any) -> Any:
    """The element of a list of one (as an API answer may be), else the value."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


@dataclass
class Envelope:
    event_id: str
    raw_type: str
    occurred_at: datetime | None
    data: dict[str, Any]
    #: The time as sent: set while ``occurred_at`` is None, it did not parse.
    occurred_raw: Any = None

    @property
    def object_id(self) -> str:
        """The data's id; a UUID in one spelling (capitals, braces: one object's events)."""
        value = self.data.get("id")
        if not isinstance(value, (str, int)):
            return ""
        found = as_uuid(value)
        return str(found) if found else clean_text(str(value), 64)


def _short_id(event_id: str) -> str:
    """An event id as stored: one longer than the column, hashed."""
    if len(event_id) > 255:
        return "sha256:" + hashlib.sha256(event_id.encode("utf-8", "replace")).hexdigest()
    return event_id


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
    event_id = _short_id(event_id)
    raw_type = _first(payload, _TYPE_KEYS)
    raw_type = raw_type if isinstance(raw_type, str) else ""
    data = _one(_first(payload, _DATA_KEYS))
    if isinstance(data, dict) and "id" not in data:  # wrapped once more: {"data": {"data": ...}}
        inner = _one(_first(data, ("data", "object")))
        data = inner if isinstance(inner, dict) else data
    raw_time = _first(payload, _TIME_KEYS)
    return Envelope(
        event_id=clean_text(event_id),
        raw_type=clean_text(raw_type, 255),
        occurred_at=parse_time(raw_time),
        data=data if isinstance(data, dict) else {},
        occurred_raw=raw_time,
    )


#: Headers stored with their value; any other is stored ``REDACTED`` (an allow-list).
_STORED = """webhook-id webhook-timestamp svix-id svix-timestamp content-type content-length
    content-encoding user-agent accept accept-encoding host via forwarded x-forwarded-for
    x-forwarded-host x-forwarded-proto x-real-ip x-request-id x-correlation-id traceparent"""
STORED_HEADERS = frozenset(_STORED.split())
REDACTED = "[redacted]"
#: Headers stored at most (and characters of a value: 1024).
MAX_HEADERS = 64


def safe_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers, names in lower case, values of the others than ``STORED_HEADERS`` hidden."""
    result: dict[str, str] = {}
    for name, value in list(headers.items())[:MAX_HEADERS]:
        key = clean_text(str(name).lower(), 128)
        result[key] = REDACTED if key not in STORED_HEADERS else clean_text(str(value), 1024)
    return result


@dataclass
class StoreResult:
    """The stored ``event`` (for a duplicate, the one already there), and what became of it."""

    event: WebhookEvent | None
    event_id: str
    created: bool
    state: str
    error: str = ""
    #: The event id was stored before with another body: this one is kept ``failed``.
    conflict: bool = False

    @property
    def pk(self) -> int | None:
        return self.event.pk if self.event is not None else None

    @property
    def status(self) -> str:
        """What the answer says: ``received``, ``duplicate`` or ``conflict``."""
        return "conflict" if self.conflict else "received" if self.created else "duplicate"


def _read(body: bytes, charset: str | None = None) -> tuple[str, object, str]:
    """The body as text (UTF-8, without a leading byte order mark; else in the ``charset`` its
    Content-Type names, when it reads as JSON in that one), its JSON value, and why it cannot be
    stored as an event ("" if it can)."""
    text, payload, error = _parse(body, "utf-8-sig")
    try:
        other = charset if charset and codecs.lookup(charset).name != "utf-8" else None
    except LookupError:  # a charset Python does not know: UTF-8 only
        other = None
    if error and other:
        alternative = _parse(body, other)
        if text is None or not alternative[2]:
            text, payload, error = alternative
    if text is None:
        names = f"neither UTF-8 nor {other[:40]}" if other else "not UTF-8"
        return body.decode("utf-8", "replace"), None, f"The body is {names}."
    if isinstance(payload, list):
        return text, payload, f"The body is a JSON list, not 1 to {MAX_BATCH} objects."
    if not error and not isinstance(payload, dict):
        return text, payload, f"The body is a JSON {type(payload).__name__}, not an object."
    return text, payload, error


def _parse(body: bytes, encoding: str) -> tuple[str | None, object, str]:
    """The body decoded (None if it is not in ``encoding``), its JSON value, and why it is no
    JSON ("" if it is)."""
    try:
        text = body.decode(encoding)
    except (UnicodeError, LookupError):  # LookupError: no text encoding (hex, zlib)
        return None, None, "not decoded"
    try:
        # Python's reading takes NaN and Infinity: processing refuses them (strict JSON).
        return text, json.loads(text), ""
    except (ValueError, RecursionError) as exc:
        return text, None, f"Malformed JSON: {str(exc)[:200]}"


#: Events one delivery may carry as a JSON array (a longer array is rejected whole).
MAX_BATCH = 1000


def split_batch(
    body: bytes, verification: Verification, charset: str | None = None
) -> list[tuple[bytes, Verification]] | None:
    """Each event of a body that is a JSON array of 1 to ``MAX_BATCH`` objects (several events
    in one delivery), as its own body (``charset``: as ``store_delivery`` reads it); one
    without an id takes ``<webhook-id>#<index>`` (the same on the service's retry). None for
    any other body (an array in UTF-16 or UTF-32 too)."""
    if body.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] != b"[":
        return None
    payload = _read(body, charset)[1]
    if not isinstance(payload, list) or not 0 < len(payload) <= MAX_BATCH:
        return None
    if not all(isinstance(element, dict) for element in payload):
        return None
    message_id = verification.message_id
    try:
        return [
            (
                json.dumps(element).encode(),  # NaN stays NaN: processing fails it, as for one
                replace(verification, message_id=message_id and f"{message_id}#{index}"),
            )
            for index, element in enumerate(payload)
        ]
    except RecursionError:  # nested too deep to write back: rejected whole
        return None


def store_delivery(
    body: bytes,
    headers: Mapping[str, str],
    verification: Verification,
    charset: str | None = None,
) -> StoreResult:
    """Store one verified delivery (``DatabaseError`` if it cannot be), read as UTF-8, else in
    ``charset`` (the one its Content-Type names). A body that is not a JSON object is stored
    ``rejected``; a redelivery (same event id) gives ``created=False``."""
    text, payload, error = _read(body, charset)
    event = WebhookEvent(
        body=clean_text(text),
        headers=safe_headers(headers),
        verified_by=verification.method,
    )
    if error:
        digest = hashlib.sha256(body).hexdigest()
        # The webhook-id is cut so that the id keeps the whole digest within 255 characters.
        source = (verification.message_id or "sha256")[: 255 - len(f"invalid::{digest}")]
        event.event_id = clean_text(f"invalid:{source}:{digest}")
        event.state, event.error = EventState.REJECTED, error
    else:
        assert isinstance(payload, dict)
        envelope = read_envelope(payload, message_id=verification.message_id, body=body)
        event.event_id = envelope.event_id
        event.raw_type = envelope.raw_type
        event.type = normalize_type(envelope.raw_type)
        event.occurred_at = envelope.occurred_at
        event.object_id = envelope.object_id
    created, existing = _insert(event)
    if existing is not None and not error and _says_otherwise(existing.body, event.body):
        # The id of a stored event, another body: kept, applied only when replayed.
        first_id = event.event_id
        event.event_id = _short_id(f"{first_id}:sha256:{hashlib.sha256(body).hexdigest()}")
        event.state = EventState.FAILED
        event.error = (
            f"The event id {first_id[:100]!r} was stored before with another body: this one "
            "is not applied (replay it if it is another event)."
        )
        logger.warning("Event id %r delivered again with another body: kept failed", first_id)
        created, existing = _insert(event)
        if created:
            return StoreResult(event, event.event_id, True, event.state, conflict=True)
    if not created:
        state = existing.state if existing is not None else ""
        return StoreResult(existing, event.event_id, False, state, error)
    return StoreResult(event, event.event_id, True, event.state, error)


def _insert(event: WebhookEvent) -> tuple[bool, WebhookEvent | None]:
    """Insert ``event``: (True, None); if its id is stored already, (False, the stored one,
    None if it vanished meanwhile)."""
    using = router.db_for_write(WebhookEvent)
    # A savepoint only inside a caller's transaction (kept usable on a duplicate).
    in_transaction = transaction.get_connection(using).in_atomic_block
    try:
        with transaction.atomic(using=using) if in_transaction else contextlib.nullcontext():
            event.save(force_insert=True, using=using)
    except IntegrityError:
        return False, WebhookEvent.objects.using(using).filter(event_id=event.event_id).first()
    return True, None


def _says_otherwise(stored: str, body: str) -> bool:
    """Two bodies of one event id hold different JSON (key order and spacing aside), and not
    the same type and data in an envelope written again (a retry's other time or attempt)."""
    if stored == body:
        return False
    try:  # NaN read as text: NaN is never equal to itself
        before, after = json.loads(stored, parse_constant=str), json.loads(body, parse_constant=str)
    except (ValueError, RecursionError):
        return True
    if before == after:
        return False
    if not isinstance(before, dict) or not isinstance(after, dict):
        return True
    data = _first(before, _DATA_KEYS)
    same_event = data is not None and data == _first(after, _DATA_KEYS)
    return not (same_event and _first(before, _TYPE_KEYS) == _first(after, _TYPE_KEYS))


def enqueue(event_pk: int) -> None:
    """Hand a stored event to processing: a Celery task on commit, or here and now with
    ``task_always_eager``. Never raises: a failure leaves it ``received`` for the sweep."""
    from .processing import process_in_order
    from .tasks import process_webhook_event, send

    if process_webhook_event.app.conf.task_always_eager:
        try:
            process_in_order(event_pk)
        except Exception:
            logger.exception("Could not process event %s inline; it stays stored", event_pk)
        return
    transaction.on_commit(lambda: send(event_pk), robust=True)
