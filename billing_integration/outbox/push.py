"""The one push of an outbox entry: claim it, call the service (no transaction held), record
the outcome. Every attempt sends the entry's stored body with its idempotency key."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any

from django.db import IntegrityError, connections, router, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from ..client import BillingClient, get_client
from ..context import from_remote
from ..exceptions import (
    BillingError,
    BillingIdempotencyConflict,
    BillingServiceMismatchError,
    RemoteDataError,
)
from ..mapping import customers as customer_map
from ..mapping import products as product_map
from ..mapping import subscriptions as subscription_map
from ..mapping.common import META_FIELDS, remote_meta
from ..models.base import SyncState, older_than_stored
from ..models.customers import Customer
from ..models.outbox import (
    BLOCKING,
    LEASE,
    OPEN_STATES,
    OutboxEntry,
    OutboxOperation,
    OutboxState,
)
from ..models.products import BillingCycle, Product
from ..models.records import link_waiting
from ..models.subscriptions import Subscription
from ..service import ensure_service

logger = logging.getLogger("billing_integration.outbox")

MAX_ATTEMPTS = 8  # retryable failures before an entry fails
RETRY_BASE = 2.0  # seconds: retry n waits RETRY_BASE * 2**(n-1), with jitter
RETRY_MAX = 300.0  # seconds: below the broker's visibility timeout
Client = BillingClient | None


class PushOutcome(StrEnum):
    DONE = "done"  # pushed (or nothing to send)
    SKIPPED = "skipped"  # already done / failed / gone
    BUSY = "busy"  # another worker holds it, or an older entry of the object comes first
    RETRY = "retry"  # retryable error: pending again, due after ``retry_in``
    FAILED = "failed"  # given up: marked failed
    REFUSED = "refused"  # the mirror belongs to another service: nothing sent


@dataclass
class PushResult:
    status: PushOutcome
    entry_id: int
    retry_in: float | None = None
    error: BaseException | None = None


def backoff(attempt: int) -> float:
    """Seconds before retry ``attempt`` (1-based), with jitter, at most ``RETRY_MAX``."""
    wait = min(RETRY_MAX, RETRY_BASE * 2.0 ** max(0, attempt - 1))
    return min(RETRY_MAX, wait * (0.75 + random.random() * 0.5))


def push_entry(entry_id: int, *, client: Client = None) -> PushResult:
    """Push entry ``entry_id``; safe from any number of processes. ``client``: e.g. one with a
    deadline for a person waiting."""
    try:
        ensure_service()
    except BillingServiceMismatchError as exc:
        message = str(exc)[:2000]
        pending = OutboxEntry.objects.filter(state=OutboxState.PENDING)
        pending.exclude(last_error=message).update(last_error=message)
        logger.error("outbox push refused: %s", message)
        return PushResult(PushOutcome.REFUSED, entry_id, error=exc)
    return _push(entry_id, client, depth=0)


def _push(entry_id: int, client: Client, depth: int) -> PushResult:
    claimed = _claim(entry_id)
    if isinstance(claimed, PushResult):
        return claimed
    entry, obj, deps = claimed
    if deps:  # a subscription whose customer/product is not pushed yet
        return _after_dependencies(entry.pk, deps, client, depth)
    try:
        data = _call(entry, obj, client or get_client())
    except BillingError as exc:
        return _record_failure(entry, obj, exc)
    # Anything else leaves the entry in progress: the sweep takes it again after its lease.
    return _record(entry, obj, data if isinstance(data, dict) else {})


def _after_dependencies(pk: int, deps: list[Any], client: Client, depth: int) -> PushResult:
    """Push what the entry's object refers to first (each through its own entry and key)."""
    for dep in deps:
        result = _push(open_entry_for(dep).pk, client, 0)
        if result.status not in (PushOutcome.DONE, PushOutcome.SKIPPED):
            status = PushOutcome.BUSY if result.status == PushOutcome.FAILED else result.status
            return PushResult(status, pk, retry_in=result.retry_in, error=result.error)
    if depth >= 2:
        return PushResult(PushOutcome.BUSY, pk)
    return _push(pk, client, depth + 1)


def _claim(entry_id: int) -> PushResult | tuple[OutboxEntry, Any, list[Any]]:
    """Lock the entry (``SKIP LOCKED``) and mark it in progress (with what to push first)."""
    now = timezone.now()
    with transaction.atomic():
        locked = OutboxEntry.objects.select_for_update(skip_locked=True)
        older = _blocking(OuterRef("content_type_id"), OuterRef("object_id"))
        waits = Exists(older.filter(pk__lt=entry_id))
        entry: OutboxEntry | None = locked.filter(pk=entry_id).annotate(waits=waits).first()
        if entry is None:  # another worker holds it, or it is gone
            held = OutboxEntry.objects.filter(pk=entry_id).exists()
            return PushResult(PushOutcome.BUSY if held else PushOutcome.SKIPPED, entry_id)
        if entry.state in (OutboxState.DONE, OutboxState.FAILED):
            return PushResult(PushOutcome.SKIPPED, entry_id)
        if entry.state == OutboxState.IN_PROGRESS and entry.started_at:
            left = LEASE - (now - entry.started_at).total_seconds()
            if left > 0:
                return PushResult(PushOutcome.BUSY, entry_id, retry_in=left)
            if entry.attempts >= MAX_ATTEMPTS:  # its pushes never finished: a worker died, or
                n = entry.attempts  # raised other than a BillingError each time
                error = f"The push never finished in {n} attempts (see the worker's log)."
                return _failed_in_doubt(entry, error)
        if entry.waits:  # type: ignore[attr-defined]  # (annotated above)
            return PushResult(PushOutcome.BUSY, entry_id)  # the older one enqueues it when over
        obj = entry.target
        if obj is None:
            _done(entry, "The object no longer exists locally.")
            return PushResult(PushOutcome.SKIPPED, entry_id)
        if entry.payload is None:
            if deps := _dependencies_missing(obj):
                return entry, obj, deps
            try:
                entry.operation, body, note = _build(entry, obj)
            except BillingError as exc:  # no body to send (a setting lacks a value): failed
                return _record_failure(entry, obj, exc)
            if body is None:
                _lock(obj)  # as in ``_record``
                state = settled_state(note, not _done(entry, note))
                _rows(obj).update(sync_state=state, sync_error=note)
                return PushResult(PushOutcome.DONE, entry_id)
            entry.payload = body
        elif entry.operation == OutboxOperation.CREATE and obj.remote_id is not None:
            _done(entry)  # created meanwhile through this same entry
            return PushResult(PushOutcome.DONE, entry_id)
        # Conditional: of two processes that read the row (SQLite has no row locks), one wins.
        n = entry.attempts
        same = OutboxEntry.objects.filter(pk=entry.pk, state=entry.state, attempts=n)
        claim = {"state": OutboxState.IN_PROGRESS, "started_at": now, "updated_at": now}
        claim.update(attempts=n + 1, payload=entry.payload, operation=entry.operation)
        # Its last push never finished (the worker died): that call's outcome is unknown.
        claim["in_doubt"] = entry.in_doubt or entry.state == OutboxState.IN_PROGRESS
        if not same.update(**claim):
            return PushResult(PushOutcome.BUSY, entry_id)
        for field, value in claim.items():
            setattr(entry, field, value)
    return entry, obj, []


def _failed_in_doubt(entry: OutboxEntry, error: str) -> PushResult:
    """Failed in doubt (it may have reached the service; later entries of its object wait),
    shown in the admin and by ``billing_doctor``, retried only by staff, with the same key."""
    now = timezone.now()
    OutboxEntry.objects.filter(pk=entry.pk).update(
        state=OutboxState.FAILED,
        in_doubt=True,
        last_error=error[:2000],
        started_at=None,
        completed_at=now,
        updated_at=now,
    )
    if (obj := entry.target) is not None:
        _rows(obj).update(sync_state=SyncState.FAILED, sync_error=error)
    logger.error("outbox entry %s: %s", entry.pk, error)
    return PushResult(PushOutcome.FAILED, entry.pk)


def _blocking(content_type_id: Any, object_id: Any) -> QuerySet[OutboxEntry]:
    return OutboxEntry.objects.filter(
        BLOCKING, content_type_id=content_type_id, object_id=object_id
    )


def _done(entry: OutboxEntry, note: str = "", **fields: Any) -> bool:
    """Mark ``entry`` done; see ``_enqueue_next``."""
    now = timezone.now()
    rows = OutboxEntry.objects.filter(pk=entry.pk)
    rows.update(state=OutboxState.DONE, completed_at=now, updated_at=now, last_error=note, **fields)
    return _enqueue_next(entry)


def _enqueue_next(entry: OutboxEntry) -> bool:
    """Once ``entry`` is settled, enqueue (on commit) the next entry of its object: order per
    object. True while other entries of the object are open."""
    from .tasks import enqueue_on_commit

    others = (
        _blocking(entry.content_type_id, entry.object_id)
        .exclude(pk=entry.pk)
        .order_by("pk")
        .values_list("pk", "state")
    )
    later = [pk for pk, _state in others if pk > entry.pk]
    if later:
        enqueue_on_commit(later[0])
    return any(state in OPEN_STATES for _pk, state in others)


def _record(entry: OutboxEntry, obj: Any, data: dict[str, Any]) -> PushResult:
    try:
        with transaction.atomic():
            _lock(obj)  # an edit saved meanwhile waits: its entry is seen, or comes after
            others_open = _done(entry, in_doubt=False)
            _apply_response(obj, data, not others_open, entry.changed_fields, entry.started_at)
            if isinstance(obj, Product):
                _confirm_cycles(obj, entry.payload or {})
    except IntegrityError as exc:  # no id, or a remote id already taken
        return _failed_in_doubt(entry, f"Pushed, but the answer could not be stored: {exc}")
    name = f"{entry.operation} {type(obj).__name__}#{obj.pk}"
    logger.info("outbox entry %s: %s done (attempt %s)", entry.pk, name, entry.attempts)
    return PushResult(PushOutcome.DONE, entry.pk)


def _record_failure(entry: OutboxEntry, obj: Any, exc: BillingError) -> PushResult:
    """Back to pending after a backoff if retryable, else failed. An unknown outcome (timeout,
    5xx, idempotency conflict, a write redirected, an error after such an attempt of the call)
    puts the entry in doubt for good: retries keep key and body."""
    retryable = bool(getattr(exc, "retryable", False))
    in_doubt = retryable or exc.in_doubt or isinstance(exc, BillingIdempotencyConflict)
    now = timezone.now()
    with transaction.atomic():
        current = OutboxEntry.objects.select_for_update().get(pk=entry.pk)
        error = current.last_error = str(exc)[:2000]
        current.in_doubt = in_doubt or current.in_doubt
        current.started_at = None
        wait = backoff(current.attempts) if retryable and current.attempts < MAX_ATTEMPTS else None
        if wait is not None:
            current.state = OutboxState.PENDING
            current.next_attempt_at = now + timedelta(seconds=wait)
        else:
            current.state, current.completed_at = OutboxState.FAILED, now
        current.save()
        attempted: dict[str, Any] = {"sync_error": error}
        if entry.started_at is not None:  # else no call was made (its body could not be built)
            attempted["last_attempt_at"] = entry.started_at
        if wait is not None:
            _rows(obj).update(**attempted)
            logger.warning("outbox entry %s failed (%s); retry in %.1fs", entry.pk, exc, wait)
            return PushResult(PushOutcome.RETRY, entry.pk, retry_in=wait, error=exc)
        _rows(obj).update(sync_state=SyncState.FAILED, **attempted)
        _enqueue_next(current)
    logger.error("outbox entry %s failed after %s attempt(s): %s", entry.pk, entry.attempts, exc)
    return PushResult(PushOutcome.FAILED, entry.pk, error=exc)


def _build(entry: OutboxEntry, obj: Any) -> tuple[str, dict[str, Any] | None, str]:
    """(operation, body or None when there is nothing to send, note)."""
    if isinstance(obj, Product):
        if obj.remote_id is None:
            return OutboxOperation.CREATE, product_map.to_remote(obj), ""
        body = product_map.diff_for_patch(obj, entry.changed_fields)
        note = product_map.not_carried(obj, None, entry.changed_fields)
        return OutboxOperation.UPDATE, (body or None), note
    if isinstance(obj, Customer):
        if obj.remote_id is None:
            return OutboxOperation.CREATE, customer_map.to_remote(obj), ""
        changed = customer_map.differs(obj)
        note = f"Not pushed: the service has no customer update operation (changed: {changed})."
        return OutboxOperation.UPDATE, None, note if changed else ""
    if isinstance(obj, Subscription):
        if obj.remote_id is None:
            return OutboxOperation.CREATE, subscription_map.to_remote(obj), ""
        return OutboxOperation.UPDATE, None, ""
    return entry.operation, None, f"No push defined for {type(obj).__name__}."


def _dependencies_missing(obj: Any) -> list[Any]:
    """Objects that must exist remotely before ``obj`` can be created."""
    if isinstance(obj, Subscription) and obj.remote_id is None:
        return [d for d in (obj.customer, obj.product) if d is not None and d.remote_id is None]
    return []


def _call(entry: OutboxEntry, obj: Any, client: BillingClient) -> dict[str, Any]:
    key = str(entry.idempotency_key)
    body = entry.payload or {}
    if isinstance(obj, Product):
        if entry.operation == OutboxOperation.CREATE:
            return client.create_product(body, idempotency_key=key)
        return client.update_product(str(obj.remote_id), body, idempotency_key=key)
    if isinstance(obj, Customer):
        if entry.in_doubt:
            # An earlier attempt may have created it: look it up (the identifier is ours).
            found = client.find_customer(str(body.get("identifier") or obj.identifier))
            if found is not None:
                logger.info("outbox entry %s: customer found on the service", entry.pk)
                return found
        return client.create_customer(body, idempotency_key=key)
    if isinstance(obj, Subscription):
        return client.create_subscription(body, idempotency_key=key)
    raise TypeError(f"No push defined for {type(obj).__name__}")


def _rows(obj: Any) -> QuerySet[Any]:
    rows: QuerySet[Any] = type(obj)._default_manager.filter(pk=obj.pk)
    return rows


def _lock(obj: Any) -> None:
    """Lock ``obj``'s row until the transaction ends, before reading whether other entries of
    it are open. An edit saved meanwhile writes its entry and sets the row pending in one
    transaction (``signals.record_change``): committed before, its entry is seen here;
    otherwise its row update waits for this lock and sets the row pending after this."""
    list(_rows(obj).select_for_update().values_list("pk", flat=True))


def settled_state(note: str, synced: bool) -> str:
    """``pending`` while other entries are open, else ``not_sent`` (with a note) or ``synced``."""
    if not synced:
        return SyncState.PENDING
    return SyncState.NOT_SENT if note else SyncState.SYNCED


def _apply_response(
    obj: Any, data: dict[str, Any], synced: bool, changed: Any, attempted: Any
) -> None:
    """Store the answer without signals (nothing is pushed back). An answer the mapping refuses
    keeps only its remote id (never created twice) and the error; with no id on either side,
    ``IntegrityError``."""
    error = note = ""
    try:
        fields = _answer_fields(obj, data)
    except RemoteDataError as exc:
        error = f"The answer could not be stored: {exc}"
        logger.error("%s#%s: %s", type(obj).__name__, obj.pk, error)
        meta = remote_meta(data, strict=False)
        fields = {name: meta[name] for name in ("remote_id", "remote_data")}
    if isinstance(obj, Product):
        note = product_map.not_carried(obj, data, changed)
    fields = _versioned(obj, fields)
    if fields.get("remote_id") is None:
        fields.pop("remote_id", None)
        if obj.remote_id is None:
            raise IntegrityError("The service's answer carries no id.")
    fields.update(last_synced_at=timezone.now(), sync_error="\n".join(filter(None, (note, error))))
    fields["last_attempt_at"] = attempted
    if synced:
        fields["sync_state"] = settled_state(note, synced)
    arrived = obj.remote_id is None
    with from_remote():
        _rows(obj).update(**fields)
    for key, value in fields.items():
        setattr(obj, key, value)
    if arrived:
        link_waiting(type(obj), [obj.remote_id])


def _versioned(obj: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """The answer's fields the row takes, by the version guard of the pull (the row read
    locked): an answer is the service's state right after our write, so one older than the
    stored version (an event or a pull applied meanwhile; a version of ours never counts) keeps
    only its remote id, and one without ``date_updated`` keeps the stored version."""
    if fields.get("remote_updated") is None:
        fields = {k: v for k, v in fields.items() if k != "remote_updated"}
    ours = isinstance(obj, Subscription)  # only subscriptions record whose version is stored
    names = ["remote_updated", *(["remote_updated_ours"] if ours else [])]
    no_key = connections[router.db_for_write(type(obj))].features.has_select_for_no_key_update
    stored = _rows(obj).select_for_update(no_key=no_key).values(*names).first() or {}
    version = fields.get("remote_updated") or fields.get("remote_created")
    theirs = not stored.get("remote_updated_ours")
    if theirs and older_than_stored(version, stored.get("remote_updated")):
        return {k: v for k, v in fields.items() if k == "remote_id"}
    if ours and "remote_updated" in fields:
        fields = {**fields, "remote_updated_ours": False}
    return fields


def _answer_fields(obj: Any, data: dict[str, Any]) -> dict[str, Any]:
    keep: tuple[str, ...] = tuple(META_FIELDS)
    if isinstance(obj, Product):
        mapped = product_map.from_remote(data)
    elif isinstance(obj, Customer):
        mapped = customer_map.from_remote(data)
        keep += ("address_line_1", "address_line_2", "phone", "status")
    elif isinstance(obj, Subscription):
        mapped = subscription_map.from_remote(data)
        keep += tuple(subscription_map.REMOTE_OWNED)
    else:
        return {}
    return {k: v for k, v in mapped.items() if k in keep}


def _confirm_cycles(product: Product, body: dict[str, Any]) -> None:
    """After a push of a blueprint: the service holds its cycles and prices (what checkout
    sells), the declared cycles sent as they are now are confirmed, and the product's
    blueprint is known."""
    blueprint = body.get("subscription_blueprint")
    if not isinstance(blueprint, dict):
        return
    sent = blueprint.get("billing_cycles") or []
    cycles = product.cycles.filter(declared=True).prefetch_related("prices")
    confirmed = [c.pk for c in cycles if product_map.cycle_to_wire(c) in sent]
    product.confirmed_cycles = product_map.confirmed_cycles(blueprint)
    product.blueprint_known = True
    with from_remote():
        BillingCycle.objects.filter(pk__in=confirmed).update(declared=False)
        Product.objects.filter(pk=product.pk).update(
            confirmed_cycles=product.confirmed_cycles, blueprint_known=True
        )


def open_entry_for(obj: Any) -> OutboxEntry:
    """The entry that will create ``obj``: its oldest blocking one (put back in the queue if
    failed), else a new one."""
    blocking = OutboxEntry.objects.for_object(obj).filter(BLOCKING)
    existing: OutboxEntry | None = blocking.order_by("pk").first()
    if existing is not None:
        if existing.state == OutboxState.FAILED:
            OutboxEntry.objects.filter(pk=existing.pk).update(
                state=OutboxState.PENDING, attempts=0, next_attempt_at=None
            )
            existing.refresh_from_db()
        return existing
    from .signals import record_change

    with transaction.atomic():
        return record_change(obj)
