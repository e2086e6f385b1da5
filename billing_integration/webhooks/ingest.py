"""Storing a verified delivery (``store_delivery``) and handing it to processing.

The ingest path does one INSERT for a new event (plus one SELECT for a duplicate); the
event id's unique index is what makes a redelivery harmless.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from itertools import islice

from django.db import IntegrityError, connections, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field

from ..conf import billing_settings
from ..models import EventState, WebhookEvent
from .envelope import clean_text, read_envelope
from .types import normalize_type
from .verification import Verification

logger = logging.getLogger("billing_integration.webhooks")

__all__ = ["StoreResult", "enqueue", "safe_headers", "store_delivery"]

#: Header names never stored (credentials, signatures, cookies); matched case-insensitively.
_SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "webhook-signature",
        "svix-signature",
        "x-api-key",
    }
)
_SECRET_WORDS = ("secret", "token", "password", "signature", "auth", "api-key", "apikey")
_SECRET_NAME = re.compile("|".join(re.escape(word) for word in _SECRET_WORDS))
_MAX_HEADERS = 64
_MAX_HEADER_VALUE = 1024


def safe_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The request headers as a plain dict, lower-cased, with secrets redacted."""
    result: dict[str, str] = {}
    for name, value in islice(headers.items(), _MAX_HEADERS):
        key = clean_text(str(name).lower(), 128)
        if key in _SECRET_HEADERS or _SECRET_NAME.search(key):
            result[key] = "[redacted]"
        else:
            result[key] = clean_text(str(value), _MAX_HEADER_VALUE)
    return result


@dataclass
class StoreResult:
    event: WebhookEvent | None
    created: bool
    state: str
    error: str = ""


#: How ``_insert`` prepares a column's value: what ``get_db_prep_save`` would return, without
#: its layers of calls where that is known: a str for a plain CharField/TextField is itself; an
#: aware datetime (or None) for a DateTimeField is what the backend's adapter makes of it.
_TEXT, _DATETIME, _OTHER = "text", "datetime", "other"
_KINDS = {models.CharField: _TEXT, models.TextField: _TEXT, models.DateTimeField: _DATETIME}

#: Per database alias: the lean INSERT's SQL and, per column, the field and its kind.
_INSERT_SQL: dict[str, tuple[str, list[tuple[Field, str]]]] = {}


def _lean_insert_sql(conn: BaseDatabaseWrapper) -> tuple[str, list[tuple[Field, str]]] | None:
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
    qn = conn.ops.quote_name
    # Identifiers from the model's metadata, quoted; every value is a parameter.
    sql = (
        f"INSERT INTO {qn(meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "  # noqa: S608
        f"VALUES ({', '.join(['%s'] * len(fields))}) "
        f"ON CONFLICT ({qn(meta.get_field('event_id').column)}) DO NOTHING "
        f"RETURNING {qn(meta.pk.column)}"
    )
    columns = [(f, _KINDS.get(type(f), _OTHER)) for f in fields]
    _INSERT_SQL[conn.alias] = (sql, columns)
    return sql, columns


def _insert(event: WebhookEvent) -> bool:
    """INSERT the row; False if the event id exists already.

    PostgreSQL and SQLite: one ``INSERT ... ON CONFLICT (event_id) DO NOTHING RETURNING id``
    with the values the ORM would write (each field's ``pre_save`` and ``get_db_prep_save``),
    without the ORM's per-save query compilation; a duplicate is no error. Other backends:
    ``save(force_insert=True)``, a duplicate caught as ``IntegrityError``. No
    ``pre_save``/``post_save`` signal is sent on the lean path (nothing here listens to them;
    use ``billing_event_received``). Inside a transaction the statement runs in a savepoint,
    so a failure leaves the caller's transaction usable.
    """
    using = router.db_for_write(WebhookEvent, instance=event)
    conn = connections[using]
    lean = _lean_insert_sql(conn)
    if lean is None:
        try:
            with transaction.atomic(using=using) if conn.in_atomic_block else nullcontext():
                event.save(force_insert=True, using=using)
        except IntegrityError:
            return False
        return True
    sql, columns = lean
    adapt_datetime = conn.ops.adapt_datetimefield_value
    params = []
    for field, kind in columns:
        value = field.pre_save(event, True)
        if kind is _TEXT and type(value) is str:
            pass
        elif kind is _DATETIME and (
            value is None or (type(value) is datetime and value.utcoffset() is not None)
        ):
            value = adapt_datetime(value)
        else:
            value = field.get_db_prep_save(value, conn)
        params.append(value)
    savepoint = transaction.atomic(using=using) if conn.in_atomic_block else nullcontext()
    with savepoint, conn.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:  # the event id exists already
        return False
    event.pk = row[0]
    event._state.adding = False
    event._state.db = using
    return True


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
            payload = json.loads(text)
        except (ValueError, RecursionError) as exc:
            error = f"Malformed JSON: {str(exc)[:200]}"
    if not error and not isinstance(payload, dict):
        error = f"The body is a JSON {type(payload).__name__}, not an object."
    if error:
        digest = hashlib.sha256(body).hexdigest()
        event = WebhookEvent(
            event_id=clean_text(f"invalid:{verification.message_id or 'sha256'}:{digest}", 255),
            body=clean_text(text),
            headers=stored_headers,
            verified_by=verification.method,
            state=EventState.REJECTED,
            error=error,
        )
        created = _insert(event)
        return StoreResult(event if created else None, created, EventState.REJECTED, error)

    assert isinstance(payload, dict)
    envelope = read_envelope(payload, message_id=verification.message_id, body=body)
    event = WebhookEvent(
        event_id=envelope.event_id,
        raw_type=envelope.raw_type,
        type=normalize_type(envelope.raw_type),
        body=clean_text(text),
        headers=stored_headers,
        verified_by=verification.method,
        occurred_at=envelope.occurred_at,
        object_id=envelope.object_id,
    )
    if _insert(event):
        return StoreResult(event, True, EventState.RECEIVED)
    existing = (
        WebhookEvent.objects.filter(event_id=envelope.event_id).values_list("pk", "state").first()
    )
    if existing is None:  # pragma: no cover - the row vanished between the two statements
        return StoreResult(None, False, "")
    event.pk, state = existing
    return StoreResult(event, False, state)


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
                from ..wakeup import kick, pending_locally
                from .tasks import WAKEUP_NAME, kick_window, process_received_events

                if not pending_locally(WAKEUP_NAME):  # else kick() would return at once
                    kick(WAKEUP_NAME, process_received_events, local_window=kick_window())
        except Exception:
            logger.exception("Could not hand event %s to processing; it stays received", event_pk)

    transaction.on_commit(run)
