"""Storing a verified delivery (``store_delivery``) and handing it to processing.

The ingest path does one INSERT for a new event (plus one SELECT for a duplicate); the
event id's unique index is what makes a redelivery harmless. It works on column values, not
on a model instance (``StoreResult.event`` builds one on demand).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property, lru_cache
from itertools import islice
from typing import Any

from django.db import IntegrityError, connections, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field

from ..conf import billing_settings
from ..models import EventState, WebhookEvent
from .envelope import clean_text, parse_json, read_envelope
from .tasks import EVENTS
from .types import normalize_type
from .verification import Verification

logger = logging.getLogger("billing_integration.webhooks")

__all__ = [
    "REDACTED",
    "STORED_HEADERS",
    "StoreResult",
    "enqueue",
    "request_headers",
    "safe_headers",
    "store_delivery",
]

#: Headers stored with their value (lower-case names): the delivery's id and time, the body's
#: type, length and encoding, and what a proxy or the sender adds to trace a request. Every other
#: header (credentials, signatures, cookies, and any name not listed, whatever it holds) is
#: stored with its value replaced by ``REDACTED``, so an operator sees it was sent. An
#: allow-list, not a list of secret-looking names: a header nobody thought of stays hidden.
STORED_HEADERS = frozenset(
    {
        "webhook-id",
        "webhook-timestamp",
        "svix-id",
        "svix-timestamp",
        "content-type",
        "content-length",
        "content-encoding",
        "user-agent",
        "accept",
        "accept-encoding",
        "host",
        "via",
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-real-ip",
        "x-request-id",
        "x-correlation-id",
        "traceparent",
    }
)
#: What a header outside ``STORED_HEADERS`` is stored as.
REDACTED = "[redacted]"
_MAX_HEADERS = 64
_MAX_HEADER_VALUE = 1024


_UNPREFIXED = frozenset({"CONTENT_TYPE", "CONTENT_LENGTH"})


@lru_cache(maxsize=1024)
def _meta_name(key: str) -> str | None:
    """``HTTP_WEBHOOK_ID`` -> ``webhook-id``; None for a WSGI variable that is no header."""
    if key.startswith("HTTP_"):
        key = key[5:]
    elif key not in _UNPREFIXED:
        return None
    return key.replace("_", "-").lower()


def request_headers(meta: Mapping[str, object]) -> dict[str, str]:
    """The request's headers from its WSGI environ (``request.META``) as a plain dict with
    lower-case names: what ``request.headers`` holds, without its case-insensitive mapping
    (built and then looked up and iterated on every delivery, it cost more than the rest of
    the header work together)."""
    headers: dict[str, str] = {}
    for key, value in meta.items():
        name = _meta_name(key)
        if name is not None:
            headers[name] = value  # type: ignore[assignment]
    return headers


@lru_cache(maxsize=1024)
def _header_key(name: str) -> tuple[str, bool]:
    """A header name as stored (lower-cased, cut) and whether its value is stored."""
    key = clean_text(name.lower(), 128)
    return key, key in STORED_HEADERS


def safe_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The request headers as a plain dict, lower-cased: the values of ``STORED_HEADERS``,
    ``REDACTED`` for every other header."""
    result: dict[str, str] = {}
    for name, value in islice(headers.items(), _MAX_HEADERS):
        key, stored = _header_key(str(name))
        result[key] = clean_text(str(value), _MAX_HEADER_VALUE) if stored else REDACTED
    return result


@dataclass
class StoreResult:
    """What ``store_delivery`` did: ``pk`` and ``event_id`` of the stored row (of the row
    already there, for a duplicate; ``pk`` None if nothing could be identified), ``created``,
    the row's ``state`` and, for a rejected body, ``error``."""

    pk: int | None
    event_id: str
    created: bool
    state: str
    error: str = ""
    #: The column values this delivery was stored with (or would have been).
    values: dict[str, Any] = field(default_factory=dict, repr=False)
    using: str = "default"

    @cached_property
    def event(self) -> WebhookEvent | None:
        """The row as a model instance (built on demand: the view never needs one)."""
        if self.pk is None:
            return None
        event = WebhookEvent(pk=self.pk, **self.values)
        event._state.adding = False
        event._state.db = self.using
        return event


#: How ``_insert`` prepares a column's value: what ``get_db_prep_save`` would return, without
#: its layers of calls where that is known: a str for a plain CharField/TextField is itself; an
#: aware datetime (or None) for a DateTimeField is what the backend's adapter makes of it.
_TEXT, _DATETIME, _OTHER = "text", "datetime", "other"
_KINDS = {models.CharField: _TEXT, models.TextField: _TEXT, models.DateTimeField: _DATETIME}


@dataclass(frozen=True)
class _Column:
    name: str  # the field's attname: the key in the values dict
    field: Field
    kind: str


_MISSING = object()

#: Per database alias: the lean INSERT's SQL and its columns.
_INSERT_SQL: dict[str, tuple[str, list[_Column]]] = {}

#: The columns ``store_delivery`` sets; every other one gets its field's default.
_SET_BY_INGEST = frozenset(
    {"event_id", "raw_type", "type", "body", "headers", "verified_by", "received_at",
     "occurred_at", "object_id", "state", "error"}
)


def _lean_insert_sql(conn: BaseDatabaseWrapper) -> tuple[str, list[_Column]] | None:
    """``INSERT ... ON CONFLICT (event_id) DO NOTHING RETURNING id`` for every concrete field
    of ``WebhookEvent`` but the primary key, built once per database from the model's
    metadata; None where the backend lacks that syntax (the ORM is used there)."""
    cached = _INSERT_SQL.get(conn.alias)
    if cached is not None:
        return cached
    if conn.vendor not in ("postgresql", "sqlite") or not (
        conn.features.can_return_columns_from_insert
    ):
        return None
    meta = WebhookEvent._meta
    fields = [f for f in meta.concrete_fields if not f.primary_key]
    columns = []
    values = []
    for f in fields:
        literal = None if f.attname in _SET_BY_INGEST else _literal(f)
        if literal is None:
            columns.append(_Column(f.attname, f, _KINDS.get(type(f), _OTHER)))
            values.append("%s")
        else:  # a column no delivery sets, with a constant default: no parameter to bind
            values.append(literal)
    qn = conn.ops.quote_name
    # Identifiers from the model's metadata, quoted; values are parameters or the literals
    # of constant defaults (NULL, an integer, '').
    sql = (
        f"INSERT INTO {qn(meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "  # noqa: S608
        f"VALUES ({', '.join(values)}) "
        f"ON CONFLICT ({qn(meta.get_field('event_id').column)}) DO NOTHING "
        f"RETURNING {qn(meta.pk.column)}"
    )
    _INSERT_SQL[conn.alias] = (sql, columns)
    return sql, columns


def _literal(field: Field) -> str | None:
    """The SQL literal of a field's default when it is a constant with a trivially safe form
    (NULL, an integer, the empty string); None otherwise (the value is bound as a parameter)."""
    if not field.has_default() and not field.null:
        return None
    default = field.default if field.has_default() else None
    if callable(default):
        return None
    if default is None:
        return "NULL"
    if type(default) is int:
        return str(default)
    if default == "" and isinstance(default, str):
        return "''"
    return None


def _insert(values: dict[str, Any]) -> tuple[int | None, str]:
    """INSERT a row of ``WebhookEvent`` with these column values (the others get their
    field's default); returns its primary key, or None if the event id exists already, and
    the database alias used.

    PostgreSQL and SQLite: one ``INSERT ... ON CONFLICT (event_id) DO NOTHING RETURNING id``
    with the values the ORM would write (each field's ``get_db_prep_save``), without building
    a model instance or compiling a query per delivery; a duplicate is no error. Other
    backends: ``save(force_insert=True)``, a duplicate caught as ``IntegrityError``. No model
    signal is sent on the lean path (nothing here listens to them; use
    ``billing_event_received``). Inside a transaction the statement runs in a savepoint, so a
    failure leaves the caller's transaction usable.
    """
    using = router.db_for_write(WebhookEvent)
    conn = connections[using]
    lean = _lean_insert_sql(conn)
    if lean is None:
        event = WebhookEvent(**values)
        try:
            with transaction.atomic(using=using) if conn.in_atomic_block else nullcontext():
                event.save(force_insert=True, using=using)
        except IntegrityError:
            return None, using
        for f in WebhookEvent._meta.concrete_fields:  # what save() filled in (received_at)
            if not f.primary_key:
                values.setdefault(f.attname, getattr(event, f.attname))
        return event.pk, using
    sql, columns = lean
    adapt_datetime = conn.ops.adapt_datetimefield_value
    params = []
    for column in columns:
        kind = column.kind
        value = values.get(column.name, _MISSING)
        if value is _MISSING:
            value = values[column.name] = column.field.get_default()
        if kind is _TEXT and type(value) is str:
            pass
        elif kind is _DATETIME and (
            value is None or (type(value) is datetime and value.utcoffset() is not None)
        ):
            value = adapt_datetime(value)
        else:
            value = column.field.get_db_prep_save(value, conn)
        params.append(value)
    savepoint = transaction.atomic(using=using) if conn.in_atomic_block else nullcontext()
    with savepoint, conn.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return (row[0] if row is not None else None), using



def store_delivery(
    body: bytes, headers: Mapping[str, str], verification: Verification
) -> StoreResult:
    """Store one verified delivery; raises ``DatabaseError`` only if it could not be stored.

    A body that is not a JSON object is stored in state ``rejected`` (for inspection, never
    processed) and reported with ``error``; a redelivery of a stored event is recognised by
    its event id and reported with ``created=False``.
    """
    stored_headers = safe_headers(headers)
    payload: object = None
    error = ""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = body.decode("utf-8", "replace")
        error = "The body is not UTF-8."
    else:
        try:
            payload = parse_json(text)
        except (ValueError, RecursionError) as exc:
            error = f"Malformed JSON: {str(exc)[:200]}"
    if not error and not isinstance(payload, dict):
        error = f"The body is a JSON {type(payload).__name__}, not an object."
    if error:
        digest = hashlib.sha256(body).hexdigest()
        values: dict[str, Any] = {
            "event_id": clean_text(
                f"invalid:{verification.message_id or 'sha256'}:{digest}", 255
            ),
            "body": clean_text(text),
            "headers": stored_headers,
            "verified_by": verification.method,
            "state": EventState.REJECTED.value,
            "error": error,
        }
        pk, using = _insert(values)
        return StoreResult(
            pk, values["event_id"], pk is not None, EventState.REJECTED, error, values, using
        )

    assert isinstance(payload, dict)
    envelope = read_envelope(payload, message_id=verification.message_id, body=body)
    values = {
        "event_id": envelope.event_id,
        "raw_type": envelope.raw_type,
        "type": normalize_type(envelope.raw_type),
        "body": clean_text(text),
        "headers": stored_headers,
        "verified_by": verification.method,
        "occurred_at": envelope.occurred_at,
        "object_id": envelope.object_id,
        "state": EventState.RECEIVED.value,
    }
    pk, using = _insert(values)
    if pk is not None:
        return StoreResult(pk, envelope.event_id, True, EventState.RECEIVED, "", values, using)
    existing = (
        WebhookEvent.objects.using(using)
        .filter(event_id=envelope.event_id)
        .values_list("pk", "state")
        .first()
    )
    if existing is None:  # pragma: no cover - the row vanished between the two statements
        return StoreResult(None, envelope.event_id, False, "", values, using)
    return StoreResult(existing[0], envelope.event_id, False, existing[1], "", values, using)


def enqueue(event_pk: int) -> None:
    """Hand a stored event to processing: inline, or (after commit) a coalesced kick of the
    ``process_received_events`` drain: one Celery message per burst of deliveries, not one per
    event, and within ``WEBHOOK_KICK_WINDOW`` of a wake-up this process saw pending, not even a
    cache round trip (see ``billing_integration.wakeup``).

    Never raises: the event is stored, and a failure to enqueue leaves it ``received`` for
    ``process_pending`` (or a redelivery) to pick up.
    """

    def run() -> None:
        try:
            if billing_settings.WEBHOOK_PROCESS_INLINE:
                from .processing import process_event

                process_event(event_pk)
            else:
                EVENTS.kick()
        except Exception:
            logger.exception("Could not hand event %s to processing; it stays received", event_pk)

    transaction.on_commit(run)
