"""The push of several outbox entries with one claim and one record transaction.

``push_entry_now`` (``push.py``) spends about a dozen statements in two transactions on every
entry; a drain pushing a burst would spend more time in the database than on the wire. Here
the same three phases run once per batch:

1. **claim** (one transaction): lock the entries (``SKIP LOCKED``), find the older open
   entries of their objects in one query, load the objects with one query per model, build
   and store each body, mark the entries ``in_progress`` with a lease (one ``UPDATE``).
2. **call** each entry in primary-key order, with its stored body and idempotency key; a
   failure is recorded at once (``push._record_failure``: backoff or ``failed``).
3. **record** (one transaction): the successful entries are ``done`` (one ``UPDATE``), the
   objects get their remote ids and JSON (``models.bulk.update_rows``: one pipelined
   ``executemany``).

The guarantees are ``push_entry_now``'s: an entry another worker holds is left to it; an
entry behind an older open entry of its object waits; every retry sends the stored body with
the same key, so a worker killed between the call and the record leaves an ``in_progress``
entry that is pushed again after its lease with the same key (the service replays its
answer). Whatever is not the plain case - an object gone, a dependency to create first
(subscriptions), nothing to send, two entries of one object in the batch - is pushed after
the batch by ``push_entry_now``, one by one, in primary-key order.

Calls stop before the lease is half spent (or at the caller's deadline); the entries not
called yet are released (back to ``pending``, attempt not counted).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import IntegrityError, router, transaction
from django.db.models import F, Q, prefetch_related_objects
from django.utils import timezone

from ..conf import billing_settings
from ..exceptions import BillingError
from ..models.bulk import update_rows
from ..models.outbox import OPEN_STATES, OutboxEntry, OutboxOperation, OutboxState
from ..models.products import Product
from ..models.subscriptions import Subscription
from ..service import refuse_push_if_other_service
from .push import (
    BUSY,
    SKIPPED,
    PushResult,
    _apply_response,
    _build,
    _call,
    _record_failure,
    _skip_locked,
    answer_not_stored,
    push_entry_now,
    pushed,
    response_fields,
)

__all__ = ["push_batch"]

Key = tuple[int, int]  # (content type id, object id)


def _key(entry: OutboxEntry) -> Key:
    return (entry.content_type_id, entry.object_id)


def push_batch(entry_ids: Sequence[int], *, deadline: float | None = None) -> list[PushResult]:
    """Push the entries ``entry_ids`` (a drain's next due ones); one result per id, in
    primary-key order. ``deadline`` is a ``time.monotonic()`` value after which no further
    call is started (the rest are released for the next run)."""
    ids = sorted(set(entry_ids))
    # Which service (billing_integration.service): refused -> all stay pending, nothing sent.
    if refused := refuse_push_if_other_service(ids):
        return refused
    using = router.db_for_write(OutboxEntry)
    results: dict[int, PushResult] = {}
    later: list[int] = []
    claimed = _claim(ids, using, results, later)
    done = _call_all(claimed, using, results, deadline)
    _record(done, using, results)
    for pk in later:
        results[pk] = push_entry_now(pk)
    return [results[pk] for pk in ids if pk in results]


def _claim(
    ids: list[int], using: str, results: dict[int, PushResult], later: list[int]
) -> list[tuple[OutboxEntry, Any]]:
    now = timezone.now()
    lease = float(billing_settings.OUTBOX_LEASE)
    defer = float(billing_settings.OUTBOX_DEFER_DELAY)
    with transaction.atomic(using=using):
        qs = OutboxEntry.objects.using(using).filter(pk__in=ids).order_by("pk")
        entries = list(_skip_locked(qs, using))
        for pk in set(ids) - {e.pk for e in entries}:
            # Held by another worker (it will finish it), or gone.
            results[pk] = PushResult(BUSY, pk, retry_in=defer, held=True)
        live: list[OutboxEntry] = []
        for entry in entries:
            if entry.state in (OutboxState.DONE, OutboxState.FAILED):
                results[entry.pk] = PushResult(SKIPPED, entry.pk)
            elif (
                entry.state == OutboxState.IN_PROGRESS
                and entry.started_at
                and ((left := lease - (now - entry.started_at).total_seconds()) > 0)
            ):
                results[entry.pk] = PushResult(BUSY, entry.pk, retry_in=max(1.0, left), held=True)
            else:
                live.append(entry)
        if not live:
            return []

        oldest = _oldest_open(live, using)
        in_batch = {e.pk for e in live}
        ready: list[OutboxEntry] = []
        for entry in live:
            first = oldest.get(_key(entry), entry.pk)
            if first >= entry.pk:
                ready.append(entry)
            elif first in in_batch:
                later.append(entry.pk)  # after the older one of this batch
            else:
                results[entry.pk] = PushResult(BUSY, entry.pk, retry_in=defer)

        objects = _load_targets(ready, using)
        claimed: list[tuple[OutboxEntry, Any]] = []
        for entry in ready:
            obj = objects.get(_key(entry))
            if obj is None or isinstance(obj, Subscription):
                later.append(entry.pk)  # gone, or may need its customer/product first
                continue
            if (
                isinstance(obj, Product)
                and not obj.blueprint_known
                and "subscription_blueprint" in entry.changed_fields
            ):
                later.append(entry.pk)  # declared cycles sent: confirmed there
                continue
            if entry.payload is None:
                operation, body, _note = _build(entry, obj)
                if body is None:
                    later.append(entry.pk)  # nothing to send: recorded there
                    continue
                entry.operation, entry.payload = operation, body
            elif entry.operation == OutboxOperation.CREATE and obj.remote_id is not None:
                later.append(entry.pk)  # created meanwhile through this entry
                continue
            entry.state = OutboxState.IN_PROGRESS
            entry.started_at = now
            entry.attempts += 1
            entry.updated_at = now
            claimed.append((entry, obj))
        if claimed:
            update_rows(
                [e for e, _ in claimed],
                ["state", "started_at", "attempts", "payload", "operation", "updated_at"],
                using=using,
            )
            by_model: dict[type, list[int]] = defaultdict(list)
            for _, obj in claimed:
                by_model[type(obj)].append(obj.pk)
            for model, pks in by_model.items():
                model._default_manager.using(using).filter(pk__in=pks).update(last_attempt_at=now)
    later.sort()
    return claimed


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
            # Read to build the body and to tell what the answer still lacks (one query).
            prefetch_related_objects(list(objs.values()), "root_prices")
        for pk, obj in objs.items():
            found[(ct_id, pk)] = obj
    return found


def _call_all(
    claimed: list[tuple[OutboxEntry, Any]],
    using: str,
    results: dict[int, PushResult],
    deadline: float | None,
) -> list[tuple[OutboxEntry, Any, dict[str, Any]]]:
    stop_at = time.monotonic() + float(billing_settings.OUTBOX_LEASE) / 2
    if deadline is not None:
        stop_at = min(stop_at, deadline)
    done: list[tuple[OutboxEntry, Any, dict[str, Any]]] = []
    for index, (entry, obj) in enumerate(claimed):
        if time.monotonic() >= stop_at:
            _release([e for e, _ in claimed[index:]], using, results)
            break
        try:
            data = _call(entry, obj)
        except BillingError as exc:
            results[entry.pk] = _record_failure(entry, obj, exc)
            continue
        done.append((entry, obj, data if isinstance(data, dict) else {}))
    return done


def _release(entries: list[OutboxEntry], using: str, results: dict[int, PushResult]) -> None:
    """Give back claimed entries that were not called (the attempt is not counted)."""
    OutboxEntry.objects.using(using).filter(
        pk__in=[e.pk for e in entries], state=OutboxState.IN_PROGRESS
    ).update(state=OutboxState.PENDING, started_at=None, attempts=F("attempts") - 1)
    for entry in entries:
        results[entry.pk] = PushResult(BUSY, entry.pk, released=True)


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
        except IntegrityError:
            # One answer could not be stored (no id, a remote id already taken): store them
            # one by one, so the others are kept and the culprit's entry says why.
            for entry, obj, data in done:
                try:
                    with transaction.atomic(using=using):
                        _apply_response(
                            obj, data, _key(entry) not in still_open, entry.changed_fields
                        )
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
