"""Storing a verified delivery (``store_delivery``) and handing it to processing (``enqueue``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from django.db import IntegrityError, router, transaction

from ..exceptions import WebhookVerificationError
from ..health import record_refused
from ..models import EventState, WebhookEvent
from .envelope import clean_text, read_envelope
from .types import normalize_type
from .verification import MissingHeadersError, StaleTimestampError, Verification

logger = logging.getLogger("billing_integration.webhooks")

#: Headers stored with their value; every other one is stored as ``REDACTED`` (an allow-list:
#: a header nobody thought of stays hidden).
_STORED = """webhook-id webhook-timestamp svix-id svix-timestamp content-type content-length
    content-encoding user-agent accept accept-encoding host via forwarded x-forwarded-for
    x-forwarded-host x-forwarded-proto x-real-ip x-request-id x-correlation-id traceparent"""
STORED_HEADERS = frozenset(_STORED.split())
REDACTED = "[redacted]"
#: Headers stored at most, and characters of each value.
MAX_HEADERS, MAX_HEADER_VALUE = 64, 1024


def safe_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers, names in lower case, values of the others than ``STORED_HEADERS`` hidden."""
    result: dict[str, str] = {}
    for name, value in list(headers.items())[:MAX_HEADERS]:
        key = clean_text(str(name).lower(), 128)
        result[key] = (
            clean_text(str(value), MAX_HEADER_VALUE) if key in STORED_HEADERS else REDACTED
        )
    return result


@dataclass
class StoreResult:
    """The stored ``event`` (for a duplicate, the row already there, if any), ``created``, its
    ``state``, and ``error`` for a rejected body."""

    event: WebhookEvent | None
    event_id: str
    created: bool
    state: str
    error: str = ""

    @property
    def pk(self) -> int | None:
        return self.event.pk if self.event is not None else None


def _read(body: bytes) -> tuple[str, object, str]:
    """The body as text, its JSON value, and why it cannot be stored as an event ("" if it can)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return body.decode("utf-8", "replace"), None, "The body is not UTF-8."
    try:
        # Python's reading takes NaN and Infinity: processing refuses them (strict JSON).
        payload = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return text, None, f"Malformed JSON: {str(exc)[:200]}"
    if not isinstance(payload, dict):
        return text, payload, f"The body is a JSON {type(payload).__name__}, not an object."
    return text, payload, ""


def store_delivery(
    body: bytes, headers: Mapping[str, str], verification: Verification
) -> StoreResult:
    """Store one verified delivery (``DatabaseError`` if it cannot be). A body that is not a
    JSON object is stored ``rejected``; a redelivery (same event id) gives ``created=False``."""
    text, payload, error = _read(body)
    event = WebhookEvent(
        body=clean_text(text),
        headers=safe_headers(headers),
        verified_by=verification.method,
    )
    if error:
        digest = hashlib.sha256(body).hexdigest()
        event.event_id = clean_text(f"invalid:{verification.message_id or 'sha256'}:{digest}", 255)
        event.state, event.error = EventState.REJECTED, error
    else:
        assert isinstance(payload, dict)
        envelope = read_envelope(payload, message_id=verification.message_id, body=body)
        event.event_id = envelope.event_id
        event.raw_type = envelope.raw_type
        event.type = normalize_type(envelope.raw_type)
        event.occurred_at = envelope.occurred_at
        event.object_id = envelope.object_id
    using = router.db_for_write(WebhookEvent)
    # The view runs in autocommit: one INSERT. Inside a caller's transaction, a savepoint
    # keeps that transaction usable when the event id is already stored.
    in_transaction = transaction.get_connection(using).in_atomic_block
    try:
        with transaction.atomic(using=using) if in_transaction else contextlib.nullcontext():
            event.save(force_insert=True, using=using)
    except IntegrityError:
        existing = WebhookEvent.objects.using(using).filter(event_id=event.event_id).first()
        state = existing.state if existing is not None else ""
        return StoreResult(existing, event.event_id, False, state, error)
    return StoreResult(event, event.event_id, True, event.state, error)


def count_refusal(exc: WebhookVerificationError) -> None:
    """Count a refused delivery by reason, for ``billing_doctor`` and the Health page."""
    if isinstance(exc, StaleTimestampError):
        record_refused("stale_timestamp")
    elif isinstance(exc, MissingHeadersError):
        record_refused("missing_headers")
    else:
        record_refused("bad_signature")


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
