"""Applying stored events, each in one transaction with its row locked: ``process_event(pk)``
applies one, once; ``process_in_order(pk)`` (the task) the received ones of its object, oldest
first. A handler error marks the event ``failed``; a ``PullRequired`` pulls, then retries."""

from __future__ import annotations

import contextlib
import logging
import traceback as tb
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, IntegrityError, OperationalError, transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from ..conf import shared_cache
from ..exceptions import (
    BillingRateLimitError,
    BillingServerError,
    BillingServiceMismatchError,
    BillingTransportError,
    RemoteDataError,
)
from ..mapping.common import ts
from ..models import Customer, EventState, Subscription, WebhookEvent
from ..service import ensure_service
from ..strictjson import parse_body
from . import tasks
from .handlers import (
    DEFERRED,
    EventContext,
    EventDataError,
    HandlerResult,
    MissingEventData,
    PullRequired,
    get_handler,
)
from .ingest import parse_time, read_envelope
from .signals import SIGNALS, billing_event_received
from .types import normalize_type
from .verification import webhook_header

logger = logging.getLogger("billing_integration.webhooks")

_OUTCOME_FIELDS = ["state", "outcome", "error", "traceback", "attempts", "processed_at", "type"]
#: Seconds during which an object that was pulled is not pulled again for another event.
PULL_ONCE_TTL = 3600
_RETRYABLE = (OperationalError, BillingTransportError, BillingServerError, BillingRateLimitError)
#: The state of an event another worker holds (or an older one of its object): left to it.
BUSY = "busy"


@dataclass
class ProcessResult:
    pk: int
    state: str
    outcome: str = ""
    retryable: bool = False
    error: str = ""


def pull_missing(kind: str, remote_id: uuid.UUID, *, customer: uuid.UUID | None = None) -> None:
    """Pull a ``customer`` or ``subscription`` (and its unknown ``customer``) an event names, at
    most once per ``PULL_ONCE_TTL`` across processes; concurrent asks share one pull."""
    ensure_service()
    with contextlib.suppress(Exception):  # a cache outage must not stop processing
        if not shared_cache().add(f"billing:webhook-pull:{kind}:{remote_id}", 1, PULL_ONCE_TTL):
            return
    from ..sync import pull
    from ..sync.coalesce import coalesced_pull

    def known(model: Any, rid: uuid.UUID) -> Any:
        return lambda: model.objects.filter(remote_id=rid).exists()

    if kind == "customer":
        coalesced_pull("customers", pull.pull_customers, known(Customer, remote_id))
    elif kind == "subscription":
        if customer is not None:
            coalesced_pull("customers", pull.pull_customers, known(Customer, customer))
        coalesced_pull("subscriptions", pull.pull_subscriptions, known(Subscription, remote_id))


def _load_context(
    event: WebhookEvent, event_type: str, pulled: set[tuple[str, uuid.UUID]]
) -> EventContext:
    try:
        payload = parse_body(event.body)
    except ValueError as exc:  # NaN, Infinity, a number out of range: not JSON
        raise EventDataError(f"The body is not strict JSON: {exc}") from exc
    except RecursionError as exc:  # nested deeper than Python reads from this point of the stack
        raise EventDataError(f"The body is nested too deep to be read: {exc}") from exc
    envelope = read_envelope(payload, message_id=None, body=event.body.encode())
    occurred_at = event.occurred_at or envelope.occurred_at
    if occurred_at is None and envelope.occurred_raw not in (None, ""):
        # A time that does not parse never becomes "no time".
        raise RemoteDataError("created_at", envelope.occurred_raw, "not a timestamp")
    data = envelope.data
    dated = ts(data.get("date_updated"), "date_updated")
    dated = dated or ts(data.get("date_created"), "date_created") or occurred_at
    # The webhook-timestamp the verified signature covered.
    headers = event.headers if isinstance(event.headers, dict) else {}
    stamp = webhook_header(headers, "timestamp")
    signed_at = parse_time(stamp) if event.verified_by == "signature" else None
    version = dated or signed_at or event.received_at or timezone.now()
    return EventContext(event, event_type, data, occurred_at, version, dated is None, pulled)


def _older_pending(event: WebhookEvent) -> bool:
    """An older event of the same object is still ``received``."""
    older = Q(received_at__lt=event.received_at) | Q(received_at=event.received_at, pk__lt=event.pk)
    pending = WebhookEvent.objects.filter(object_id=event.object_id, state=EventState.RECEIVED)
    return pending.filter(older).exists()


def _apply(
    pk: int, pulled: set[tuple[str, uuid.UUID]], force: bool, in_order: bool = False
) -> ProcessResult:
    with transaction.atomic():
        # In order: leave an event another worker holds, or an older one of its object, to it.
        event = WebhookEvent.objects.select_for_update(skip_locked=in_order).filter(pk=pk).first()
        if event is None:
            if in_order and WebhookEvent.objects.filter(pk=pk).exists():
                return ProcessResult(pk, BUSY)
            raise WebhookEvent.DoesNotExist
        state = event.state
        done = state == EventState.REJECTED or (state == EventState.PROCESSED and not force)
        if done or (in_order and state != EventState.RECEIVED):
            return ProcessResult(pk, state, event.outcome)
        if in_order and _older_pending(event):
            return ProcessResult(pk, BUSY)
        event.type = normalize_type(event.raw_type) or event.type
        handler = get_handler(event.type)
        event.attempts += 1
        event.processed_at = timezone.now()
        event.error = event.traceback = event.outcome = ""
        if handler is None:
            event.state = EventState.UNRECOGNISED
            event.error = f"No handler for event type {event.raw_type[:100]!r}."
        else:
            ctx = _load_context(event, event.type, pulled)
            result = handler.handle(ctx)
            # a deferred event waits, received, for its object's create answer
            event.state = (
                EventState.RECEIVED if result.outcome == DEFERRED else EventState.PROCESSED
            )
            event.outcome = result.outcome
            if result.outcome == "applied":
                transaction.on_commit(lambda: send_signals(event, ctx, result))
        event.save(update_fields=_OUTCOME_FIELDS)
        return ProcessResult(pk, event.state, event.outcome, retryable=event.outcome == DEFERRED)


def _mark(pk: int, state: str, error: str, traceback: str = "") -> None:
    """Record an attempt that applied nothing (never over an event processed meanwhile)."""
    WebhookEvent.objects.filter(pk=pk).exclude(state=EventState.PROCESSED).update(
        state=state,
        attempts=F("attempts") + 1,
        error=error,
        traceback=traceback,
        processed_at=timezone.now(),
    )


def _record_failure(pk: int, exc: BaseException, *, final: bool) -> ProcessResult:
    retryable = isinstance(exc, _RETRYABLE)
    message = f"{type(exc).__name__}: {exc}"[:2000]
    try:
        _mark(pk, EventState.FAILED, message, "".join(tb.format_exception(exc))[-20000:])
    except DatabaseError:
        logger.exception("Could not record the failure of event %s", pk)
    level = logging.WARNING if retryable and not final else logging.ERROR
    logger.log(level, "Event %s failed: %s", pk, message)
    return ProcessResult(pk, EventState.FAILED, retryable=retryable, error=message)


def _record_unrecognised(pk: int, exc: MissingEventData) -> ProcessResult:
    """The data lacks what the handler needs: kept ``unrecognised`` (what it did rolled back),
    not retried, until a replay after a fix (an alias, a handler of one's own)."""
    message = str(exc)[:2000]
    _mark(pk, EventState.UNRECOGNISED, message)
    logger.warning("Event %s unrecognised: %s", pk, message)
    return ProcessResult(pk, EventState.UNRECOGNISED, error=message)


def process_event(
    pk: int, *, force: bool = False, final: bool = True, in_order: bool = False
) -> ProcessResult:
    """Apply one stored event once (never raises for a handler error); ``force``: a processed
    one again; ``final``: no retry left; ``in_order``: ``BUSY`` when another worker has it."""
    pulled: set[tuple[str, uuid.UUID]] = set()
    last_exc: BaseException = RuntimeError("Too many processing rounds.")
    for _ in range(4):
        try:
            return _apply(pk, pulled, force, in_order)
        except WebhookEvent.DoesNotExist:
            return ProcessResult(pk, "missing", error="No such event.")
        except PullRequired as need:
            pulled.add((need.kind, need.remote_id))
            try:
                pull_missing(need.kind, need.remote_id, customer=need.customer)
            except BillingServiceMismatchError as exc:  # failed, replayed after a relink
                return _record_failure(pk, exc, final=final)
            except Exception as exc:
                # The event is still applied without the object (the raw ids are kept).
                logger.warning("Pulling %s %s failed: %s", need.kind, need.remote_id, exc)
        except MissingEventData as exc:
            return _record_unrecognised(pk, exc)
        except IntegrityError as exc:
            # Two events inserted the same new record concurrently; the retry finds the row.
            last_exc = exc
        except Exception as exc:
            return _record_failure(pk, exc, final=final)
    return _record_failure(pk, last_exc, final=final)


def send_signals(event: WebhookEvent, ctx: EventContext, result: HandlerResult) -> None:
    """Send the type's signal and ``billing_event_received``; a receiver's error is logged."""
    kwargs = {k: v for k, v in result.objects.items() if k not in ("event", "data", "sender")}
    kwargs.update(event=event, event_type=ctx.event_type, data=ctx.data, objects=result.objects)
    kwargs.update(previous_status=result.previous_status)
    for signal in filter(None, (SIGNALS.get(ctx.event_type), billing_event_received)):
        for receiver, response in signal.send_robust(WebhookEvent, **kwargs):
            if isinstance(response, Exception):
                info = (type(response), response, response.__traceback__)
                logger.error("Receiver %r of %s raised", receiver, ctx.event_type, exc_info=info)


def replay_events(
    queryset: QuerySet[WebhookEvent], *, inline: bool = True, force: bool = False
) -> dict[str, int]:
    """Process events again in order of reception, here (``inline``) or on Celery; never
    rejected ones, processed ones only with ``force``. Returns counts by resulting state."""
    events = queryset.exclude(state=EventState.REJECTED)
    if not force:
        events = events.exclude(state=EventState.PROCESSED)
    counts: dict[str, int] = {}
    for pk in list(events.order_by("received_at", "pk").values_list("pk", flat=True)):
        if not inline:
            tasks.send(pk, force=force)
        state = process_event(pk, force=force).state if inline else "enqueued"
        counts[state] = counts.get(state, 0) + 1
    return counts


def process_in_order(pk: int, *, final: bool = True) -> ProcessResult:
    """Apply event ``pk`` and the other ``received`` events of its object, oldest first, one
    transaction each; stop at one another worker holds (it goes on). Returns ``pk``'s result."""
    row = WebhookEvent.objects.filter(pk=pk).values_list("object_id", "state").first()
    if row is None:
        return ProcessResult(pk, "missing", error="No such event.")
    object_id, state = row
    if not object_id or state != EventState.RECEIVED:
        return process_event(pk, final=final)
    pending = (
        WebhookEvent.objects.filter(object_id=object_id, state=EventState.RECEIVED)
        .order_by("received_at", "pk")
        .values_list("pk", flat=True)
    )
    result = ProcessResult(pk, state)
    seen: set[int] = set()
    while (next_pk := pending.first()) is not None and next_pk not in seen:
        seen.add(next_pk)
        step = process_event(next_pk, final=final or next_pk != pk, in_order=True)
        if step.state == BUSY:
            # Left to its holder; if it only glanced at it, this message spares the sweep.
            if len(seen) > 1:  # this run applied some
                tasks.send(next_pk, countdown=1)
            break
        if next_pk == pk:
            result = step
        elif step.retryable:
            tasks.send(next_pk, countdown=1)  # its retry, as its own task would
    if result.state == EventState.RECEIVED and not result.retryable:  # processed meanwhile
        current = WebhookEvent.objects.filter(pk=pk).values_list("state", flat=True).first()
        result = ProcessResult(pk, current or "missing")
    return result
