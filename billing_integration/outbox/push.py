"""The push of one outbox entry: claim it, build the request from the object's *current*
state, call the service with the entry's idempotency key, record the answer.

Phases (no transaction is held during the HTTP call):

1. **claim** (short transaction): lock the entry row (``SKIP LOCKED`` where the database
   has it, so two workers never push the same entry); refuse if an older entry of the same
   object is still open (pushes of one object are serialised: an update never races the
   create); build the body once and store it with the entry (a retry resends the same body
   with the same key, so the service can replay its first answer); mark it ``in_progress``
   with a lease.
2. **call**: ``create_*`` if the object has no ``remote_id``, else ``PATCH`` of what changed.
3. **record** (short transaction): remote id, timestamps and JSON stored with
   ``QuerySet.update`` (no signal fires, nothing is pushed back); the entry is ``done``. On a
   retryable error the entry goes back to ``pending`` with ``next_attempt_at``; after
   ``OUTBOX_MAX_ATTEMPTS`` (or at once for a refused request) it is ``failed``.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, connections, models, router, transaction
from django.db.models import Q
from django.utils import timezone

from ..conf import billing_settings
from ..exceptions import BillingError, BillingIdempotencyConflict, RemoteDataError
from ..mapping import customers as customer_map
from ..mapping import products as product_map
from ..mapping import subscriptions as subscription_map
from ..mapping.common import META_FIELDS, as_uuid
from ..models.base import SyncState
from ..models.customers import Customer
from ..models.outbox import OPEN_STATES, OutboxEntry, OutboxOperation, OutboxState
from ..models.products import BillingCycle, Product
from ..models.subscriptions import Subscription
from ..service import refuse_push_if_other_service
from .context import from_remote

logger = logging.getLogger("billing_integration.outbox")

__all__ = ["PushResult", "backoff", "push_entry_now", "settled_state"]

# Result statuses
DONE = "done"  # pushed (or nothing to send)
SKIPPED = "skipped"  # already done / failed / gone: nothing to do
BUSY = "busy"  # another worker holds it, or an older entry of the object comes first
RETRY = "retry"  # retryable error: try again after ``retry_in``
FAILED = "failed"  # given up: marked failed
REFUSED = "refused"  # the mirror belongs to another service: left pending, nothing sent


@dataclass
class PushResult:
    status: str
    entry_id: int
    calls: int = 0
    retry_in: float | None = None
    error: BaseException | None = None
    #: BUSY because another worker holds the entry (it will finish it): nothing to re-try.
    held: bool = False
    #: BUSY because a batch stopped (deadline, lease) before calling it: pending again.
    released: bool = False


def backoff(attempt: int) -> float:
    """Seconds before retry ``attempt`` (1-based): ``BASE * 2**(attempt-1)`` with jitter,
    capped by ``OUTBOX_RETRY_MAX`` (keep it below the broker's visibility timeout)."""
    base = float(billing_settings.OUTBOX_RETRY_BASE)
    cap = float(billing_settings.OUTBOX_RETRY_MAX)
    wait = min(cap, base * 2 ** max(0, attempt - 1))
    return min(cap, wait * (0.75 + random.random() * 0.5))


def _skip_locked(qs: models.QuerySet, using: str) -> models.QuerySet:
    features = connections[using].features
    if features.has_select_for_update_skip_locked:
        return qs.select_for_update(skip_locked=True)
    if features.has_select_for_update:
        return qs.select_for_update(nowait=False)
    return qs


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
        fields = customer_map.differs(obj)
        note = (
            f"Not pushed: the service has no customer update operation (changed: {fields})."
            if fields
            else ""
        )
        return OutboxOperation.UPDATE, None, note
    if isinstance(obj, Subscription):
        if obj.remote_id is None:
            return OutboxOperation.CREATE, subscription_map.to_remote(obj), ""
        return OutboxOperation.UPDATE, None, ""
    return entry.operation, None, f"No push defined for {type(obj).__name__}."


def _dependencies_missing(obj: Any) -> list[Any]:
    """Objects that must exist remotely before ``obj`` can be created."""
    if isinstance(obj, Subscription) and obj.remote_id is None:
        return [
            dep
            for dep in (obj.customer, obj.product)
            if dep is not None and dep.remote_id is None
        ]
    return []


def _call(entry: OutboxEntry, obj: Any, client: Any = None) -> dict[str, Any]:
    if client is None:
        from ..client import get_client

        client = get_client()
    key = str(entry.idempotency_key)
    body = entry.payload or {}
    if isinstance(obj, Product):
        if entry.operation == OutboxOperation.CREATE:
            return client.create_product(body, idempotency_key=key)
        return client.update_product(str(obj.remote_id), body, idempotency_key=key)
    if isinstance(obj, Customer):
        return client.create_customer(body, idempotency_key=key)
    if isinstance(obj, Subscription):
        return client.create_subscription(body, idempotency_key=key)
    raise TypeError(f"No push defined for {type(obj).__name__}")


def _others_open(entry: OutboxEntry) -> bool:
    return (
        OutboxEntry.objects.filter(content_type_id=entry.content_type_id, object_id=entry.object_id)
        .exclude(pk=entry.pk)
        .filter(state__in=OPEN_STATES)
        .exists()
    )


def settled_state(note: str, synced: bool) -> str:
    """The sync state of an object whose push is done: ``not_sent`` when part of its local
    state could not be carried (``note``), ``pending`` while other entries are open."""
    if not synced:
        return SyncState.PENDING
    return SyncState.NOT_SENT if note else SyncState.SYNCED


def response_fields(
    obj: Any, data: dict[str, Any], synced: bool, changed: Any = ()
) -> dict[str, Any]:
    """The columns to store from what the service answered to the push of ``obj``: the
    remote id, timestamps and JSON, the service-owned fields, and the sync state (for a
    product, ``not_sent`` with the reason in ``sync_error`` when the answer still lacks a
    local change no request can carry: ``changed`` are the entry's changed fields).

    An answer with a value the mapping refuses (``RemoteDataError``: a date that does not
    parse, ...) gives its remote id only (the object exists remotely: it must never be
    created twice) and the error in ``sync_error``; a pull or an event brings the rest (a
    subscription keeps its local, empty status meanwhile: no access).

    Raises ``IntegrityError`` when neither the answer nor the object has a remote id."""
    error = note = ""
    try:
        fields = _answer_fields(obj, data)
    except RemoteDataError as exc:
        error = f"The answer could not be stored: {exc}"
        logger.error("%s#%s: %s", type(obj).__name__, obj.pk, error)
        fields = {"remote_id": as_uuid(data.get("id")), "remote_data": data}
    if isinstance(obj, Product):
        note = product_map.not_carried(obj, data, changed)
    if fields.get("remote_id") is None:
        fields.pop("remote_id", None)
        if obj.remote_id is None:
            raise IntegrityError("The service's answer carries no id.")
    fields.update(last_synced_at=timezone.now(), sync_error="\n".join(filter(None, (note, error))))
    if synced:
        fields["sync_state"] = settled_state(note, synced)
    return fields


def _answer_fields(obj: Any, data: dict[str, Any]) -> dict[str, Any]:
    if isinstance(obj, Product):
        return {k: v for k, v in product_map.from_remote(data).items() if k in META_FIELDS}
    if isinstance(obj, Customer):
        mapped = customer_map.from_remote(data)
        keep = (*META_FIELDS, "address_line_1", "address_line_2", "phone", "status")
        return {k: v for k, v in mapped.items() if k in keep}
    if isinstance(obj, Subscription):
        mapped = subscription_map.from_remote(data)
        return {
            k: v
            for k, v in mapped.items()
            if k in META_FIELDS or k in subscription_map.REMOTE_OWNED
        }
    return {}


def _apply_response(obj: Any, data: dict[str, Any], synced: bool, changed: Any = ()) -> None:
    """Store what the service answered, without signals (so nothing is pushed back)."""
    fields = response_fields(obj, data, synced, changed)
    with from_remote():
        type(obj)._default_manager.filter(pk=obj.pk).update(**fields)
    for key, value in fields.items():
        setattr(obj, key, value)


def push_entry_now(entry_id: int, *, client: Any = None, _depth: int = 0) -> PushResult:
    """Push one outbox entry synchronously. Safe to call from any number of processes.

    ``client``: the ``BillingClient`` to call through (default ``get_client()``); a person
    waiting passes one bound to a deadline (``client.with_deadline``)."""
    # Which service (billing_integration.service): refused -> stays pending, nothing sent.
    if _depth == 0 and (refused := refuse_push_if_other_service([entry_id])):
        return refused[0]
    using = router.db_for_write(OutboxEntry)
    now = timezone.now()
    lease = float(billing_settings.OUTBOX_LEASE)

    # 1. claim -----------------------------------------------------------------------------
    with transaction.atomic(using=using):
        entry = _skip_locked(OutboxEntry.objects.using(using).filter(pk=entry_id), using).first()
        if entry is None:
            if OutboxEntry.objects.using(using).filter(pk=entry_id).exists():
                return PushResult(
                    BUSY, entry_id, retry_in=billing_settings.OUTBOX_DEFER_DELAY, held=True
                )
            return PushResult(SKIPPED, entry_id)
        if entry.state in (OutboxState.DONE, OutboxState.FAILED):
            return PushResult(SKIPPED, entry_id)
        if entry.state == OutboxState.IN_PROGRESS and entry.started_at and (
            entry.started_at > now - timedelta(seconds=lease)
        ):
            left = (entry.started_at + timedelta(seconds=lease) - now).total_seconds()
            return PushResult(BUSY, entry_id, retry_in=max(1.0, left), held=True)
        blocked = (
            OutboxEntry.objects.using(using)
            .filter(
                content_type_id=entry.content_type_id,
                object_id=entry.object_id,
                pk__lt=entry.pk,
            )
            .filter(Q(state__in=OPEN_STATES) | Q(state=OutboxState.FAILED, in_doubt=True))
            .exists()
        )
        if blocked:
            return PushResult(BUSY, entry_id, retry_in=billing_settings.OUTBOX_DEFER_DELAY)
        obj = entry.target
        if obj is None:
            entry.state = OutboxState.DONE
            entry.last_error = "The object no longer exists locally."
            entry.completed_at = now
            entry.save()
            return PushResult(SKIPPED, entry_id)
        missing = _dependencies_missing(obj)
        if missing and entry.payload is None:
            deps = missing
        else:
            deps = []
            if entry.payload is None:
                operation, body, note = _build(entry, obj)
                if body is None:
                    entry.operation = operation
                    entry.state = OutboxState.DONE
                    entry.completed_at = now
                    entry.last_error = note
                    entry.save()
                    synced = not _others_open(entry)
                    type(obj)._default_manager.filter(pk=obj.pk).update(
                        sync_state=settled_state(note, synced), sync_error=note
                    )
                    return PushResult(DONE, entry_id)
                entry.operation = operation
                entry.payload = body
            elif entry.operation == OutboxOperation.CREATE and obj.remote_id is not None:
                # Created meanwhile through this same entry (e.g. the synchronous path).
                entry.state = OutboxState.DONE
                entry.completed_at = now
                entry.save()
                return PushResult(DONE, entry_id)
            entry.state = OutboxState.IN_PROGRESS
            entry.started_at = now
            entry.attempts += 1
            entry.save()
            type(obj)._default_manager.filter(pk=obj.pk).update(last_attempt_at=now)

    if deps:
        # Create what the object refers to first (each through its own entry and key).
        for dep in deps:
            dep_entry = _open_entry_for(dep)
            result = push_entry_now(dep_entry.pk, client=client)
            if result.status not in (DONE, SKIPPED):
                return PushResult(
                    RETRY if result.status != FAILED else BUSY,
                    entry_id,
                    retry_in=result.retry_in or billing_settings.OUTBOX_DEFER_DELAY,
                    error=result.error,
                )
        if _depth >= 2:
            return PushResult(BUSY, entry_id, retry_in=billing_settings.OUTBOX_DEFER_DELAY)
        return push_entry_now(entry_id, client=client, _depth=_depth + 1)

    # 2. call ------------------------------------------------------------------------------
    try:
        data = _call(entry, obj, client)
    except BillingError as exc:
        return _record_failure(entry, obj, exc)

    # 3. record ----------------------------------------------------------------------------
    with transaction.atomic(using=using):
        current = OutboxEntry.objects.using(using).select_for_update().get(pk=entry.pk)
        current.state = OutboxState.DONE
        current.completed_at = timezone.now()
        current.last_error = ""
        current.in_doubt = False
        current.save()
        try:
            with transaction.atomic(using=using):
                answer = data if isinstance(data, dict) else {}
                _apply_response(obj, answer, not _others_open(current), entry.changed_fields)
                if isinstance(obj, Product):
                    _confirm_declared_cycles(obj, (entry.payload or {}))
        except IntegrityError as exc:
            current.last_error = answer_not_stored(entry, exc)
            current.save(update_fields=["last_error", "updated_at"])
    return pushed(entry, obj)


def _confirm_declared_cycles(product: Product, body: dict[str, Any]) -> None:
    """After a push that carried a blueprint: the service's blueprint is now the one sent, so
    the product's blueprint is known and its declared cycles sent as they are now are
    confirmed (a cycle changed since the body was built stays declared)."""
    sent = body.get("subscription_blueprint")
    if not isinstance(sent, dict):
        return
    carried = sent.get("billing_cycles") or []
    confirmed = [
        cycle.pk
        for cycle in product.cycles.filter(declared=True).prefetch_related("prices")
        if product_map.cycle_to_wire(cycle) in carried
    ]
    with from_remote():
        if confirmed:
            BillingCycle.objects.filter(pk__in=confirmed).update(declared=False)
        if not product.blueprint_known:
            Product.objects.filter(pk=product.pk).update(blueprint_known=True)
            product.blueprint_known = True


def answer_not_stored(entry: OutboxEntry, exc: IntegrityError) -> str:
    """The entry's error when the push went through but its answer could not be stored."""
    error = f"Pushed, but the answer could not be stored: {exc}"
    logger.error("outbox entry %s: %s", entry.pk, error)
    return error


def pushed(entry: OutboxEntry, obj: Any) -> PushResult:
    """The result of a push that went through (logged)."""
    logger.info(
        "outbox entry %s: %s %s#%s done (attempt %s)",
        entry.pk,
        entry.operation,
        type(obj).__name__,
        obj.pk,
        entry.attempts,
    )
    return PushResult(DONE, entry.pk, calls=1)


def _record_failure(entry: OutboxEntry, obj: Any, exc: BillingError) -> PushResult:
    retryable = bool(getattr(exc, "retryable", False))
    # A refused request (4xx) created nothing; a timeout or a 5xx may have. An idempotency
    # conflict means a request with this key reached the service before.
    in_doubt = retryable or isinstance(exc, BillingIdempotencyConflict)
    max_attempts = int(billing_settings.OUTBOX_MAX_ATTEMPTS)
    now = timezone.now()
    with transaction.atomic():
        current = OutboxEntry.objects.select_for_update().get(pk=entry.pk)
        current.last_error = str(exc)[:2000]
        current.in_doubt = in_doubt
        current.started_at = None
        if retryable and current.attempts < max_attempts:
            wait = backoff(current.attempts)
            current.state = OutboxState.PENDING
            current.next_attempt_at = now + timedelta(seconds=wait)
            current.save()
            type(obj)._default_manager.filter(pk=obj.pk).update(sync_error=current.last_error)
            logger.warning(
                "outbox entry %s: attempt %s failed (%s); retry in %.1fs",
                entry.pk,
                current.attempts,
                exc,
                wait,
            )
            return PushResult(RETRY, entry.pk, retry_in=wait, error=exc)
        current.state = OutboxState.FAILED
        current.completed_at = now
        current.save()
        type(obj)._default_manager.filter(pk=obj.pk).update(
            sync_state=SyncState.FAILED, sync_error=current.last_error
        )
    logger.error("outbox entry %s failed after %s attempt(s): %s", entry.pk, entry.attempts, exc)
    return PushResult(FAILED, entry.pk, error=exc)


def _open_entry_for(obj: Any) -> OutboxEntry:
    """The entry that will create ``obj``: its oldest open (or in-doubt failed) one, else a
    new one. Used for dependencies and by ``ensure_customer_pushed``."""
    existing = (
        OutboxEntry.objects.for_object(obj)
        .filter(Q(state__in=OPEN_STATES) | Q(state=OutboxState.FAILED, in_doubt=True))
        .order_by("pk")
        .first()
    )
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
