"""Storing a verified delivery (``store_delivery``) and handing it to processing.

The ingest path does one INSERT for a new event (plus one SELECT for a duplicate), through
``models.bulk.insert_ignoring_conflict``; the event id's unique index is what makes a
redelivery harmless. It works on column values, not on a model instance
(``StoreResult.event`` builds one on demand).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from itertools import islice
from typing import Any

from django.db import router, transaction

from ..conf import billing_settings
from ..exceptions import WebhookVerificationError
from ..health import record_refused
from ..models import EventState, WebhookEvent
from ..models.bulk import insert_ignoring_conflict
from .envelope import clean_text, read_envelope
from .tasks import EVENTS
from .types import normalize_type
from .verification import MissingHeadersError, StaleTimestampError, Verification

logger = logging.getLogger("billing_integration.webhooks")

__all__ = [
    "REDACTED",
    "STORED_HEADERS",
    "StoreResult",
    "count_refusal",
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
            # Python's reading, which takes NaN and Infinity: such a signed delivery is stored
            # and then failed by processing (strict JSON there), never lost at the door.
            payload = json.loads(text)
        except (ValueError, RecursionError) as exc:
            error = f"Malformed JSON: {str(exc)[:200]}"
    if not error and not isinstance(payload, dict):
        error = f"The body is a JSON {type(payload).__name__}, not an object."
    if error:
        digest = hashlib.sha256(body).hexdigest()
        values: dict[str, Any] = {
            "event_id": clean_text(f"invalid:{verification.message_id or 'sha256'}:{digest}", 255),
            "body": clean_text(text),
            "headers": stored_headers,
            "verified_by": verification.method,
            "state": EventState.REJECTED.value,
            "error": error,
        }
        using = router.db_for_write(WebhookEvent)
        pk = insert_ignoring_conflict(WebhookEvent, values, conflict="event_id", using=using)
        return StoreResult(
            pk=pk,
            event_id=values["event_id"],
            created=pk is not None,
            state=EventState.REJECTED,
            error=error,
            values=values,
            using=using,
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
    using = router.db_for_write(WebhookEvent)
    pk = insert_ignoring_conflict(WebhookEvent, values, conflict="event_id", using=using)
    if pk is not None:
        return StoreResult(
            pk=pk,
            event_id=envelope.event_id,
            created=True,
            state=EventState.RECEIVED,
            values=values,
            using=using,
        )
    existing = (
        WebhookEvent.objects.using(using)
        .filter(event_id=envelope.event_id)
        .values_list("pk", "state")
        .first()
    )
    # The row is gone if it was deleted between the two statements: nothing to identify.
    return StoreResult(
        pk=existing[0] if existing else None,
        event_id=envelope.event_id,
        created=False,
        state=existing[1] if existing else "",
        values=values,
        using=using,
    )


def count_refusal(exc: WebhookVerificationError) -> None:
    """Count a refused delivery for ``billing_doctor`` and the admin's Health page
    (``health.record_refused``), by reason: the exception's type, never its request."""
    if isinstance(exc, StaleTimestampError):
        record_refused("stale_timestamp")
    elif isinstance(exc, MissingHeadersError):
        record_refused("missing_headers")
    else:
        record_refused("bad_signature")


def enqueue(event_pk: int) -> None:
    """Hand a stored event to processing.

    With ``WEBHOOK_PROCESS_INLINE``: processed here, in the request, now. The row is already
    stored: the webhook view runs in autocommit, so its INSERT is committed; a caller inside a
    transaction (a test's, say) gets the processing in that same transaction, so the event and
    its effects commit or roll back together. The signals still wait for the commit.

    Otherwise, after commit, a coalesced kick of the ``process_received_events`` drain: one
    Celery message per burst of deliveries, not one per event, and within
    ``WEBHOOK_KICK_WINDOW`` of a wake-up this process saw pending, not even a cache round trip
    (see ``billing_integration.wakeup``).

    Never raises: the event is stored, and a failure to process or enqueue leaves it
    ``received`` (or ``failed``) for ``process_pending`` (or a redelivery, or a replay).
    """
    if billing_settings.WEBHOOK_PROCESS_INLINE:
        try:
            from .processing import process_event

            process_event(event_pk)
        except Exception:
            logger.exception("Could not process event %s inline; it stays stored", event_pk)
        return

    def run() -> None:
        try:
            EVENTS.kick()  # within this process's window of a pending wake-up: returns at once
        except Exception:
            logger.exception("Could not hand event %s to processing; it stays received", event_pk)

    transaction.on_commit(run)
