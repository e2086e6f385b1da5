"""The push of outbox entries: the one state machine from ``pending`` to ``done``/``failed``.

A push of one entry (``push_entry_now``) is a batch of one (``push_entries``); a push run
pushes ``OUTBOX_CLAIM_BATCH`` or more at a time (``drain.claim_size``). Three phases, no
transaction held during the HTTP calls:

1. **claim** (one transaction): lock the entries (``SELECT ... FOR UPDATE SKIP LOCKED``
   where the database has it: an entry another worker holds is left to it, ``held``); skip
   the settled ones and those whose worker's lease has not expired; find the older open (or
   in-doubt failed) entries of their objects in one query (pushes of one object are
   serialised: an entry waits behind older ones, and one behind an older entry of the same
   batch is pushed after it); load the objects with one query per model; build each body
   once and store it with the entry (every retry resends the same body with the same
   idempotency key, so the service can replay its first answer); mark them ``in_progress``
   with a lease (one ``UPDATE``). Settled in the claim, without a call: an entry whose object
   is gone, one with nothing to send (a customer edit: ``not_sent`` with a note), one whose
   create went through meanwhile. A subscription whose customer or product is not created yet
   is pushed after the batch, those first (each through its own entry and key).
2. **call** the claimed entries, ``OUTBOX_PUSH_CONCURRENCY`` at a time (they are for
   distinct objects: ``parallel.call_all``), started in primary-key order: ``create_*`` if
   the object has no ``remote_id``, else ``PATCH`` of what changed; through ``client`` (a
   person waiting passes one bound to a deadline). Each failure is then recorded (backoff and
   ``pending`` again, or ``failed``: at once for a refused request, after
   ``OUTBOX_MAX_ATTEMPTS`` otherwise). No call starts once the lease is half spent (or at the
   caller's deadline): the entries not called are released (``pending`` again, attempt not
   counted).
3. **record** (one transaction): the entries are ``done`` (one ``UPDATE``); the objects get
   their remote ids, timestamps and JSON (``models.bulk.update_rows``, no signal fires,
   nothing is pushed back); a product's declared cycles sent as its blueprint are confirmed.
   When one answer cannot be stored, the answers are stored one by one, so the others are
   kept and the culprit's entry says why.

A worker killed between the call and the record leaves an ``in_progress`` entry that is pushed
again after its lease, with the same key.
"""

from __future__ import annotations

import logging
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import IntegrityError, router, transaction
from django.db.models import F, Q, prefetch_related_objects
from django.utils import timezone

from ..conf import billing_settings
from ..exceptions import BillingError, BillingIdempotencyConflict, RemoteDataError
from ..mapping import customers as customer_map
from ..mapping import products as product_map
from ..mapping import subscriptions as subscription_map
from ..mapping.common import META_FIELDS, as_uuid
from ..models.base import SyncState
from ..models.bulk import update_rows
from ..models.customers import Customer
from ..models.outbox import OPEN_STATES, OutboxEntry, OutboxOperation, OutboxState
from ..models.products import BillingCycle, Product
from ..models.subscriptions import Subscription
from ..service import refuse_push_if_other_service
from .context import from_remote
from .locks import skip_locked
from .parallel import call_all

logger = logging.getLogger("billing_integration.outbox")

__all__ = [
    "PushOutcome",
    "PushResult",
    "backoff",
    "push_entries",
    "push_entry_now",
    "response_fields",
    "settled_state",
]


class PushOutcome(StrEnum):
    """What a push did with an entry (not an entry state: see ``OutboxState``)."""

    DONE = "done"  # pushed (or nothing to send)
    SKIPPED = "skipped"  # already done / failed / gone: nothing to do
    BUSY = "busy"  # another worker holds it, or an older entry of the object comes first
    RETRY = "retry"  # retryable error: try again after ``retry_in``
    FAILED = "failed"  # given up: marked failed
    REFUSED = "refused"  # the mirror belongs to another service: left pending, nothing sent


@dataclass
class PushResult:
    status: PushOutcome
    entry_id: int
    #: Calls to the service this push made for the entry (0: settled or left without one).
    calls: int = 0
    retry_in: float | None = None
    error: BaseException | None = None
    #: BUSY because another worker holds the entry (it will finish it): nothing to re-try.
    held: bool = False
    #: BUSY because a batch stopped (deadline, lease) before calling it: pending again.
    released: bool = False


Key = tuple[int, int]  # (content type id, object id)


def _key(entry: OutboxEntry) -> Key:
    return (entry.content_type_id, entry.object_id)


def backoff(attempt: int) -> float:
    """Seconds before retry ``attempt`` (1-based): ``BASE * 2**(attempt-1)`` with jitter,
    capped by ``OUTBOX_RETRY_MAX`` (keep it below the broker's visibility timeout)."""
    base = float(billing_settings.OUTBOX_RETRY_BASE)
    cap = float(billing_settings.OUTBOX_RETRY_MAX)
    wait = min(cap, base * 2 ** max(0, attempt - 1))
    return min(cap, wait * (0.75 + random.random() * 0.5))


# --- the one path -----------------------------------------------------------------------------
def push_entry_now(entry_id: int, *, client: Any = None) -> PushResult:
    """Push one outbox entry synchronously (a batch of one). Safe to call from any number of
    processes.

    ``client``: the ``BillingClient`` to call through (default ``get_client()``); a person
    waiting passes one bound to a deadline (``client.with_deadline``)."""
    (result,) = push_entries([entry_id], client=client)
    return result


def push_entries(
    entry_ids: Sequence[int], *, client: Any = None, deadline: float | None = None
) -> list[PushResult]:
    """Push the entries ``entry_ids``; one result per id, in primary-key order. ``deadline``
    is a ``time.monotonic()`` value after which no further call is started (the rest are
    released for the next run)."""
    ids = sorted(set(entry_ids))
    # Which service (billing_integration.service): refused -> all stay pending, nothing sent.
    if refused := refuse_push_if_other_service(ids):
        return refused
    return _push(ids, client, deadline, depth=0)


@dataclass
class _Claim:
    claimed: list[tuple[OutboxEntry, Any]] = field(default_factory=list)
    #: Pushed after the batch, in primary-key order: behind an older entry of the batch, or
    #: waiting for its dependencies (``dependencies``).
    later: list[int] = field(default_factory=list)
    dependencies: dict[int, list[Any]] = field(default_factory=dict)


def _push(ids: list[int], client: Any, deadline: float | None, depth: int) -> list[PushResult]:
    using = router.db_for_write(OutboxEntry)
    results: dict[int, PushResult] = {}
    claim = _claim(ids, using, results)
    done = _call_all(claim.claimed, using, results, deadline, client)
    _record(done, using, results)
    for pk in sorted(claim.later):
        if pk in claim.dependencies:
            results[pk] = _after_dependencies(pk, claim.dependencies[pk], client, depth)
        else:
            (results[pk],) = _push([pk], client, None, depth)
    return [results[pk] for pk in ids if pk in results]


def _after_dependencies(pk: int, deps: list[Any], client: Any, depth: int) -> PushResult:
    """Create what the entry's object refers to first (each through its own entry and key),
    then push the entry."""
    defer = float(billing_settings.OUTBOX_DEFER_DELAY)
    for dep in deps:
        (result,) = _push([_open_entry_for(dep).pk], client, None, 0)
        if result.status not in (PushOutcome.DONE, PushOutcome.SKIPPED):
            return PushResult(
                PushOutcome.RETRY if result.status != PushOutcome.FAILED else PushOutcome.BUSY,
                pk,
                retry_in=result.retry_in or defer,
                error=result.error,
            )
    if depth >= 2:
        return PushResult(PushOutcome.BUSY, pk, retry_in=defer)
    (result,) = _push([pk], client, None, depth + 1)
    return result


def _claim(ids: list[int], using: str, results: dict[int, PushResult]) -> _Claim:
    now = timezone.now()
    lease = float(billing_settings.OUTBOX_LEASE)
    defer = float(billing_settings.OUTBOX_DEFER_DELAY)
    claim = _Claim()
    with transaction.atomic(using=using):
        qs = OutboxEntry.objects.using(using).filter(pk__in=ids).order_by("pk")
        entries = list(skip_locked(qs, using))
        if missing := set(ids) - {e.pk for e in entries}:
            held = set(
                OutboxEntry.objects.using(using).filter(pk__in=missing).values_list("pk", flat=True)
            )
            for pk in missing:
                if pk in held:  # another worker holds it: it will finish it
                    results[pk] = PushResult(PushOutcome.BUSY, pk, retry_in=defer, held=True)
                else:  # gone
                    results[pk] = PushResult(PushOutcome.SKIPPED, pk)
        live: list[OutboxEntry] = []
        for entry in entries:
            if entry.state in (OutboxState.DONE, OutboxState.FAILED):
                results[entry.pk] = PushResult(PushOutcome.SKIPPED, entry.pk)
            elif (
                entry.state == OutboxState.IN_PROGRESS
                and entry.started_at
                and ((left := lease - (now - entry.started_at).total_seconds()) > 0)
            ):
                results[entry.pk] = PushResult(
                    PushOutcome.BUSY, entry.pk, retry_in=max(1.0, left), held=True
                )
            else:
                live.append(entry)
        if not live:
            return claim

        oldest = _oldest_open(live, using)
        in_batch = {e.pk for e in live}
        ready: list[OutboxEntry] = []
        for entry in live:
            first = oldest.get(_key(entry), entry.pk)
            if first >= entry.pk:
                ready.append(entry)
            elif first in in_batch:
                claim.later.append(entry.pk)  # after the older one of this batch
            else:
                results[entry.pk] = PushResult(PushOutcome.BUSY, entry.pk, retry_in=defer)

        objects = _load_targets(ready, using)
        touched: dict[type, list[int]] = defaultdict(list)
        for entry in ready:
            obj = objects.get(_key(entry))
            if obj is None:
                entry.state = OutboxState.DONE
                entry.last_error = "The object no longer exists locally."
                entry.completed_at = now
                entry.save()
                results[entry.pk] = PushResult(PushOutcome.SKIPPED, entry.pk)
                continue
            if entry.payload is None and (deps := _dependencies_missing(obj)):
                claim.later.append(entry.pk)
                claim.dependencies[entry.pk] = deps
                continue
            if entry.payload is None:
                operation, body, note = _build(entry, obj)
                entry.operation = operation
                if body is None:
                    _settle_unsent(entry, obj, note, now)
                    results[entry.pk] = PushResult(PushOutcome.DONE, entry.pk)
                    continue
                entry.payload = body
            elif entry.operation == OutboxOperation.CREATE and obj.remote_id is not None:
                # Created meanwhile through this same entry (e.g. the synchronous path).
                entry.state = OutboxState.DONE
                entry.completed_at = now
                entry.save()
                results[entry.pk] = PushResult(PushOutcome.DONE, entry.pk)
                continue
            entry.state = OutboxState.IN_PROGRESS
            entry.started_at = now
            entry.attempts += 1
            entry.updated_at = now
            claim.claimed.append((entry, obj))
            touched[type(obj)].append(obj.pk)
        if claim.claimed:
            update_rows(
                [e for e, _ in claim.claimed],
                ["state", "started_at", "attempts", "payload", "operation", "updated_at"],
                using=using,
            )
            for model, pks in touched.items():
                model._default_manager.using(using).filter(pk__in=pks).update(last_attempt_at=now)
    return claim


def _settle_unsent(entry: OutboxEntry, obj: Any, note: str, now: Any) -> None:
    """An entry with nothing to send is done; its object is ``not_sent`` with ``note`` (what
    no request can carry), or synced."""
    entry.state = OutboxState.DONE
    entry.completed_at = now
    entry.last_error = note
    entry.save()
    synced = not _others_open(entry)
    type(obj)._default_manager.filter(pk=obj.pk).update(
        sync_state=settled_state(note, synced), sync_error=note
    )


def _oldest_open(live: list[OutboxEntry], using: str) -> dict[Key, int]:
    """Per object of ``live``, the pk of its oldest open (or in-doubt failed) entry: pushes of
    one object are serialised, an entry waits for the older ones. One query."""
    keys = {_key(e) for e in live}
    oldest: dict[Key, int] = {}
    rows = (
        OutboxEntry.objects.using(using)
        .filter(
            content_type_id__in={k[0] for k in keys},
            object_id__in={k[1] for k in keys},
            pk__lt=live[-1].pk,
        )
        .filter(Q(state__in=OPEN_STATES) | Q(state=OutboxState.FAILED, in_doubt=True))
        .values_list("content_type_id", "object_id", "pk")
    )
    for ct_id, object_id, pk in rows:
        key = (ct_id, object_id)
        if key in keys and pk < oldest.get(key, pk + 1):
            oldest[key] = pk
    return oldest


def _load_targets(entries: list[OutboxEntry], using: str) -> dict[Key, Any]:
    """The objects of ``entries``: one query per model."""
    wanted: dict[int, set[int]] = defaultdict(set)
    for entry in entries:
        wanted[entry.content_type_id].add(entry.object_id)
    found: dict[Key, Any] = {}
    for ct_id, object_ids in wanted.items():
        model = ContentType.objects.db_manager(using).get_for_id(ct_id).model_class()
        if model is None:
            continue
        objs = model._default_manager.using(using).in_bulk(object_ids)
        if model is Product:
            # Read to build the bodies (the blueprint's cycles and their prices) and to tell
            # what the answers still lack: three queries for the batch, not three per product.
            prefetch_related_objects(list(objs.values()), "root_prices", "cycles__prices")
        for pk, obj in objs.items():
            found[(ct_id, pk)] = obj
    return found


def _call_all(
    claimed: list[tuple[OutboxEntry, Any]],
    using: str,
    results: dict[int, PushResult],
    deadline: float | None,
    client: Any,
) -> list[tuple[OutboxEntry, Any, dict[str, Any]]]:
    """Call the service for the claimed entries, ``OUTBOX_PUSH_CONCURRENCY`` at a time (they
    are for distinct objects), started in primary-key order; record each failure; give back
    those not started when the stop time came. Returns the calls that went through.

    An unexpected error (not a ``BillingError``) is raised once the others are recorded:
    its entry stays ``in_progress`` and is pushed again after its lease, with the same key."""
    stop_at = time.monotonic() + float(billing_settings.OUTBOX_LEASE) / 2
    if deadline is not None:
        stop_at = min(stop_at, deadline)
    if client is None:
        from ..client import get_client

        client = get_client()
    outcomes = call_all(
        claimed,
        lambda pair: _call(pair[0], pair[1], client),
        width=int(billing_settings.OUTBOX_PUSH_CONCURRENCY),
        stop_at=stop_at,
    )
    done: list[tuple[OutboxEntry, Any, dict[str, Any]]] = []
    unexpected: BaseException | None = None
    for (entry, obj), outcome in zip(claimed, outcomes, strict=True):
        if not outcome.started:
            continue
        if isinstance(outcome.error, BillingError):
            results[entry.pk] = _record_failure(entry, obj, outcome.error)
        elif outcome.error is not None:
            unexpected = unexpected or outcome.error
        else:
            data = outcome.value
            done.append((entry, obj, data if isinstance(data, dict) else {}))
    pairs = zip(claimed, outcomes, strict=True)
    if not_started := [entry for (entry, _), outcome in pairs if not outcome.started]:
        _release(not_started, using, results)
    if unexpected is not None:
        _record(done, using, results)
        raise unexpected
    return done


def _release(entries: list[OutboxEntry], using: str, results: dict[int, PushResult]) -> None:
    """Give back claimed entries that were not called (the attempt is not counted)."""
    OutboxEntry.objects.using(using).filter(
        pk__in=[e.pk for e in entries], state=OutboxState.IN_PROGRESS
    ).update(state=OutboxState.PENDING, started_at=None, attempts=F("attempts") - 1)
    for entry in entries:
        results[entry.pk] = PushResult(PushOutcome.BUSY, entry.pk, released=True)


def _record(
    done: list[tuple[OutboxEntry, Any, dict[str, Any]]],
    using: str,
    results: dict[int, PushResult],
) -> None:
    if not done:
        return
    now = timezone.now()
    pks = [entry.pk for entry, _, _ in done]
    with transaction.atomic(using=using):
        OutboxEntry.objects.using(using).filter(pk__in=pks).update(
            state=OutboxState.DONE,
            completed_at=now,
            last_error="",
            in_doubt=False,
            updated_at=now,
        )
        keys = {_key(entry) for entry, _, _ in done}
        still_open = {
            key
            for key in OutboxEntry.objects.using(using)
            .filter(
                content_type_id__in={k[0] for k in keys},
                object_id__in={k[1] for k in keys},
                state__in=OPEN_STATES,
            )
            .exclude(pk__in=pks)
            .values_list("content_type_id", "object_id")
            if key in keys
        }
        try:
            with transaction.atomic(using=using):
                _store_answers(done, still_open, using)
                _confirm_declared_cycles(
                    [
                        (obj, entry.payload or {})
                        for entry, obj, _ in done
                        if isinstance(obj, Product)
                    ]
                )
        except IntegrityError:
            # One answer could not be stored (no id, a remote id already taken): store them
            # one by one, so the others are kept and the culprit's entry says why.
            for entry, obj, data in done:
                try:
                    with transaction.atomic(using=using):
                        _apply_response(
                            obj, data, _key(entry) not in still_open, entry.changed_fields
                        )
                        if isinstance(obj, Product):
                            _confirm_declared_cycles([(obj, entry.payload or {})])
                except IntegrityError as exc:
                    OutboxEntry.objects.using(using).filter(pk=entry.pk).update(
                        last_error=answer_not_stored(entry, exc)
                    )
    for entry, obj, _ in done:
        results[entry.pk] = pushed(entry, obj)


def _store_answers(
    done: list[tuple[OutboxEntry, Any, dict[str, Any]]], still_open: set[Key], using: str
) -> None:
    """An ``UPDATE`` per object, pipelined per model and set of columns (``update_rows``:
    no signal fires, nothing is pushed back)."""
    groups: dict[tuple[type, tuple[str, ...]], list[Any]] = defaultdict(list)
    for entry, obj, data in done:
        fields = response_fields(obj, data, _key(entry) not in still_open, entry.changed_fields)
        for name, value in fields.items():
            setattr(obj, name, value)
        groups[(type(obj), tuple(sorted(fields)))].append(obj)
    for (_model, names), objs in groups.items():
        update_rows(objs, names, using=using)


# --- building, calling, storing ---------------------------------------------------------------
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
            dep for dep in (obj.customer, obj.product) if dep is not None and dep.remote_id is None
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
        if _may_exist_remotely(entry):
            # An earlier attempt may have created it: look it up (the identifier is ours).
            found = client.find_customer(str(body.get("identifier") or obj.identifier))
            if found is not None:
                logger.info("outbox entry %s: customer found on the service", entry.pk)
                return found
        return client.create_customer(body, idempotency_key=key)
    if isinstance(obj, Subscription):
        return client.create_subscription(body, idempotency_key=key)
    raise TypeError(f"No push defined for {type(obj).__name__}")


def _may_exist_remotely(entry: OutboxEntry) -> bool:
    """Whether an earlier attempt of ``entry`` may have reached the service: it was in doubt,
    or it is claimed again after an attempt that recorded nothing (a worker killed during
    the call)."""
    return entry.in_doubt or entry.attempts > 1


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


def _confirm_declared_cycles(pushed: list[tuple[Product, dict[str, Any]]]) -> None:
    """After pushes that carried a blueprint: the service's blueprint is now the one sent, so
    each such product's blueprint is known and its declared cycles sent as they are now are
    confirmed (a cycle changed since the body was built stays declared). Two queries at
    most for the whole batch."""
    sent: dict[int, tuple[Product, list[Any]]] = {}
    for product, body in pushed:
        blueprint = body.get("subscription_blueprint")
        if isinstance(blueprint, dict):
            sent[product.pk] = (product, blueprint.get("billing_cycles") or [])
    if not sent:
        return
    confirmed = [
        cycle.pk
        for cycle in BillingCycle.objects.filter(product_id__in=sent, declared=True)
        .prefetch_related("prices")
        .order_by("pk")
        if product_map.cycle_to_wire(cycle) in sent[cycle.product_id][1]
    ]
    unknown = [product for product, _ in sent.values() if not product.blueprint_known]
    with from_remote():
        if confirmed:
            BillingCycle.objects.filter(pk__in=confirmed).update(declared=False)
        if unknown:
            Product.objects.filter(pk__in=[p.pk for p in unknown]).update(blueprint_known=True)
            for product in unknown:
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
    return PushResult(PushOutcome.DONE, entry.pk, calls=1)


def _record_failure(entry: OutboxEntry, obj: Any, exc: BillingError) -> PushResult:
    retryable = bool(getattr(exc, "retryable", False))
    # A refused request (4xx) created nothing; a timeout, a 5xx or a 2xx whose answer was
    # lost may have. An idempotency conflict means a request with this key reached the
    # service before. Once in doubt, always in doubt (until done): a later refusal does not
    # undo what an earlier attempt may have created, so a retry keeps the key.
    in_doubt = retryable or isinstance(exc, BillingIdempotencyConflict)
    max_attempts = int(billing_settings.OUTBOX_MAX_ATTEMPTS)
    now = timezone.now()
    with transaction.atomic():
        current = OutboxEntry.objects.select_for_update().get(pk=entry.pk)
        current.last_error = str(exc)[:2000]
        current.in_doubt = in_doubt or current.in_doubt
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
            return PushResult(PushOutcome.RETRY, entry.pk, calls=1, retry_in=wait, error=exc)
        current.state = OutboxState.FAILED
        current.completed_at = now
        current.save()
        type(obj)._default_manager.filter(pk=obj.pk).update(
            sync_state=SyncState.FAILED, sync_error=current.last_error
        )
    logger.error("outbox entry %s failed after %s attempt(s): %s", entry.pk, entry.attempts, exc)
    return PushResult(PushOutcome.FAILED, entry.pk, calls=1, error=exc)


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
