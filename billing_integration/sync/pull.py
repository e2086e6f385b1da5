"""Pull (remote -> local): upsert each page of the service's lists inside ``from_remote()``,
keeping local changes not yet pushed and never taking a row back to an older version."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import IntegrityError, connections, router, transaction
from django.db.models import Q, prefetch_related_objects
from django.utils import timezone

from ..context import from_remote
from ..exceptions import BillingError, RemoteDataError
from ..health import record_run
from ..mapping import customers as customer_map
from ..mapping import products as product_map
from ..mapping import subscriptions as subscription_map
from ..models.base import RemoteObject, SyncState, older_than_stored
from ..models.customers import Customer
from ..models.outbox import BLOCKING, OutboxEntry, OutboxOperation
from ..models.products import Price, Product, ProductStatus, root_prices_from_remote
from ..models.records import link_all_waiting, link_waiting
from ..models.reports import touch_reports
from ..models.subscriptions import Subscription
from ..service import ensure_service, mirror_database
from .signals import subscription_status_pulled

logger = logging.getLogger("billing_integration.sync")

Row = dict[str, Any]
Progress = Callable[[str, "PullCounts"], None]
LOCAL_CHANGES = (SyncState.PENDING, SyncState.FAILED)
#: How many error messages a ``PullCounts`` keeps (the count goes on).
MAX_ERROR_MESSAGES = 20
#: Rows a pull writes at once: consecutive pages are joined up to this many rows, then
#: upserted together (one transaction, the same few statements as one page).
PULL_BATCH_ROWS = 1000
_COUNTED = ("created", "updated", "unchanged", "skipped", "pages", "stale", "errors")


@dataclass
class PullCounts:
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    skipped: int = 0
    pages: int = 0
    errors: int = 0
    error_messages: list[str] = field(default_factory=list, repr=False)
    stale: int = 0

    @property
    def total(self) -> int:
        return self.created + self.updated + self.unchanged + self.skipped + self.stale

    def add(self, other: PullCounts) -> None:
        for name in _COUNTED:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.error_messages = (self.error_messages + other.error_messages)[:MAX_ERROR_MESSAGES]

    def error(self, message: str) -> None:
        self.errors += 1
        self.error_messages = [*self.error_messages, message][:MAX_ERROR_MESSAGES]

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in _COUNTED}

    def __str__(self) -> str:
        return (
            f"{self.created} created, {self.updated} updated, {self.unchanged} unchanged"
            + (f", {self.skipped} skipped (local changes pending)" if self.skipped else "")
            + (f", {self.stale} stale (older than the stored state)" if self.stale else "")
            + (f", {self.errors} not applied (bad data)" if self.errors else "")
        )


def _mapped(rows: Iterable[Any], mapper: Callable[[Row], Row], counts: PullCounts) -> list[Row]:
    """The mapped rows; of the copies of one row, the newest (``date_updated``, else
    ``date_created``) wins, else the last. A refused row (the mapping's ``RemoteDataError``,
    not an object, no UUID for its id) is counted in errors."""
    out: dict[Any, Row] = {}
    for row in rows:
        try:
            if not isinstance(row, dict):
                raise RemoteDataError("row", row, f"not an object ({type(row).__name__})")
            fields = mapper(row)
            if fields.get("remote_id") is None:
                raise RemoteDataError("id", row.get("id"), "not a UUID")
        except RemoteDataError as exc:
            where = str(row.get("id"))[:64] if isinstance(row, dict) else "?"
            message = f"{where}: {exc}"
            logger.error("Pulled row not applied (kept what is stored): %s", message)
            counts.error(message)
            continue
        earlier = out.get(fields["remote_id"])
        if earlier is not None and _older(fields, earlier):
            continue
        out[fields["remote_id"]] = fields
    return list(out.values())


def _older(fields: Row, than: Row) -> bool:
    """``fields`` is a version of the row older than ``than`` (both dated)."""
    mine = fields.get("remote_updated") or fields.get("remote_created")
    theirs = than.get("remote_updated") or than.get("remote_created")
    return mine is not None and theirs is not None and mine < theirs


#: The fields by which an unlinked local row (its create answer was lost) is adopted.
ADOPT_BY = {
    "Customer": ("identifier",),
    "Subscription": ("customer_id", "product_id", "selected_billing_cycle"),
}


def _existing(model: type[RemoteObject], mapped: list[Row]) -> dict[Any, Any]:
    """The local rows by remote id, the adopted unlinked ones included, in one query, locked
    until the caller's transaction ends (``FOR NO KEY UPDATE`` where the database has it, as
    the event handlers lock; in primary-key order, so two pulls do not deadlock)."""
    keys = ADOPT_BY.get(model.__name__, ())
    query = Q(remote_id__in=[m["remote_id"] for m in mapped])
    wanted = {k for k in (tuple(m.get(n) for n in keys) for m in mapped) if k and None not in k}
    if wanted:
        values = {f"{name}__in": {k[i] for k in wanted} for i, name in enumerate(keys)}
        query |= Q(remote_id__isnull=True, **values)
    existing: dict[Any, RemoteObject] = {}
    unlinked: dict[Any, RemoteObject] = {}
    no_key = connections[router.db_for_write(model)].features.has_select_for_no_key_update
    rows = model._default_manager.filter(query).order_by("pk")
    for obj in rows.select_for_update(no_key=no_key):
        if obj.remote_id is not None:
            existing[obj.remote_id] = obj
        else:
            unlinked.setdefault(tuple(getattr(obj, name) for name in keys), obj)
    for fields in mapped:
        key = tuple(fields.get(name) for name in keys)
        if unlinked and fields["remote_id"] not in existing and key in unlinked:
            existing[fields["remote_id"]] = unlinked.pop(key)
    return existing


def _written_since(obj: Any, read_at: datetime) -> bool:
    """``obj`` was written here at or after ``read_at``: by an event, another pull or a local
    edit (``updated_at``), or a push's answer (``last_synced_at``)."""
    return any(at is not None and at >= read_at for at in (obj.updated_at, obj.last_synced_at))


def _applicable(
    obj: Any,
    fields: Row,
    local_owned: tuple[str, ...],
    counts: PullCounts,
    read_at: datetime | None = None,
) -> tuple[Row, bool] | None:
    """The fields to write on ``obj`` and whether its local changes are kept; None if stale:
    older than the stored version (a pushed change's answer, another pull, an event), or
    read (the page's request began at ``read_at``) before ``obj`` was written here and not
    strictly newer than its stored version (the same version, none, or one of our clock)."""
    version = fields.get("remote_updated") or fields.get("remote_created")
    ours = getattr(obj, "remote_updated_ours", None)  # subscriptions only
    stored = obj.remote_updated or obj.remote_created
    newer = version is not None and stored is not None and version > stored and not ours
    late = read_at is not None and obj.remote_id is not None and _written_since(obj, read_at)
    if (older_than_stored(version, obj.remote_updated) and not ours) or (late and not newer):
        counts.stale += 1
        return None
    if obj.remote_updated is not None:
        if fields.get("remote_updated") is None:
            fields = {k: v for k, v in fields.items() if k != "remote_updated"}
        elif ours is not None:
            fields = {**fields, "remote_updated_ours": False}
    keep = bool(local_owned) and obj.sync_state in LOCAL_CHANGES and obj.remote_id is not None
    if keep:
        fields = {k: v for k, v in fields.items() if k not in local_owned}
        counts.skipped += 1
    return fields, keep


def _upsert(
    model: type[RemoteObject],
    mapped: list[Row],
    counts: PullCounts,
    *,
    local_owned: tuple[str, ...] = (),
    create_only: tuple[str, ...] = (),
    read_at: datetime | None = None,
) -> tuple[list[Any], list[Any]]:
    """Upsert mapped rows (a page, or the pages of one write) read from ``read_at`` on (None:
    no row is held back for being written here meanwhile); returns the created and the
    updated rows."""
    counts.pages += 1
    if not mapped:
        return [], []

    def write() -> tuple[list[Any], list[Any]]:
        # The rows are read, locked, in the write's transaction: each is decided on (the
        # version guard, the local changes) as it is when written, never as it was before an
        # event changed it; that event waits for the commit, then its own guard decides.
        done = PullCounts()
        with transaction.atomic(using=router.db_for_write(model)), from_remote():
            written = _write(model, mapped, done, local_owned, create_only, read_at)
        counts.add(done)
        return written

    # A row an event, a push or another pull inserted after the read (none to lock then)
    # fails the insert: the write is rolled back and made again, that row now read, locked,
    # and decided on.
    for _retry in range(2):
        with contextlib.suppress(IntegrityError):
            return write()
    return write()


def _write(
    model: type[RemoteObject],
    mapped: list[Row],
    counts: PullCounts,
    local_owned: tuple[str, ...],
    create_only: tuple[str, ...],
    read_at: datetime | None,
) -> tuple[list[Any], list[Any]]:
    """``_upsert`` in its transaction: read the rows (locked), decide, write."""
    now = timezone.now()
    existing = _existing(model, mapped)
    # new here, or an unlinked local row adopted: what named it before is linked to it
    arrived = [
        f["remote_id"]
        for f in mapped
        if getattr(existing.get(f["remote_id"]), "remote_id", None) is None
    ]
    to_create: list[Any] = []
    to_update: list[Any] = []
    update_fields = {"last_synced_at", "updated_at"}
    moved: list[tuple[Any, str, Any]] = []  # subscriptions known here whose status changed
    for fields in mapped:
        obj = existing.get(fields["remote_id"])
        if obj is None:
            to_create.append(model(**fields, sync_state=SyncState.SYNCED, last_synced_at=now))
            continue
        fields = {k: v for k, v in fields.items() if k not in create_only}
        applicable = _applicable(obj, fields, local_owned, counts, read_at)
        if applicable is None:
            continue
        fields, kept = applicable
        changed = [name for name, value in fields.items() if getattr(obj, name) != value]
        if not changed:
            counts.unchanged += not kept
            continue
        if model is Subscription and "status" in changed and obj.remote_id is not None:
            moved.append((obj, obj.status, fields.get("remote_updated")))
        for name in changed:
            setattr(obj, name, fields[name])
        obj.last_synced_at = obj.updated_at = now
        update_fields.update(changed)
        if not kept:
            if obj.sync_state != SyncState.SYNCED:
                obj.sync_state = SyncState.SYNCED
                update_fields.add("sync_state")
            counts.updated += 1
        to_update.append(obj)
    if to_create:
        # A row inserted meanwhile fails the insert (IntegrityError: ``_upsert`` writes again).
        model._default_manager.bulk_create(to_create)
    if to_update:
        model._default_manager.bulk_update(to_update, sorted(update_fields))
    for obj, previous, date_updated in moved:  # in the transaction: a notice commits with it
        subscription_status_pulled.send(
            Subscription, subscription=obj, previous_status=previous, date_updated=date_updated
        )
    # bulk writes send no signals: the reporting rollups are told here (one statement)
    touch_reports([*to_create, *to_update])
    link_waiting(model, arrived)
    counts.created += len(to_create)
    return to_create, to_update


PRODUCT_LOCAL = ("name", "description", "status", "selected_currencies", "billing_type")
CUSTOMER_LOCAL = ("identifier", "first_name", "last_name", "email")


def upsert_products(rows: Iterable[Row], *, read_at: datetime | None = None) -> PullCounts:
    """Upsert product resources (a page, or the pages of one write, read from ``read_at`` on),
    new ones with their root prices."""
    counts = PullCounts()
    mapped = _without_creates_in_doubt(_mapped(rows, product_map.from_remote, counts), counts)
    create_only = ("product_type", "blueprint_known")
    created, updated = _upsert(
        Product,
        mapped,
        counts,
        local_owned=PRODUCT_LOCAL,
        create_only=create_only,
        read_at=read_at,
    )
    _settle_not_carried(updated)
    prices = [
        Price(product=product, currency_id=currency, amount=amount)
        for product in created  # its remote_data: the row it was created from
        for currency, amount in root_prices_from_remote(product.remote_data)
    ]
    if prices:
        with transaction.atomic(), from_remote():
            Price.objects.bulk_create(prices)
    return counts


def _without_creates_in_doubt(mapped: list[Row], counts: PullCounts) -> list[Row]:
    """``mapped`` without the products new here named as the create of a local product that was
    sent and not answered yet or is in doubt (its answer on its way, or lost): a product has no key
    of ours to adopt it by, and a row made for it here would take the remote id the create's
    answer or retry (same key) links the local product to. Such a row is counted skipped; a
    later pull creates it if still unlinked."""
    sent = OutboxEntry.objects.filter(
        BLOCKING,
        content_type=ContentType.objects.get_for_model(Product),
        object_id__in=Product.objects.filter(remote_id__isnull=True).values("pk"),
        operation=OutboxOperation.CREATE,
        attempts__gt=0,  # sent: in progress, or pending or failed in doubt
    )
    names = set(sent.values_list("payload__name", flat=True))  # as sent, renamed since or not
    if not names:
        return mapped
    new = [m for m in mapped if m.get("name") in names]
    known = set(
        Product.objects.filter(remote_id__in=[m["remote_id"] for m in new]).values_list(
            "remote_id", flat=True
        )
    )
    held = {m["remote_id"] for m in new} - known
    counts.skipped += len(held)
    return [m for m in mapped if m["remote_id"] not in held]


def _settle_not_carried(products: list[Product]) -> None:
    """Re-derive ``synced`` / ``not_sent`` of updated products without pending changes."""
    settled = [p for p in products if p.sync_state in (SyncState.SYNCED, SyncState.NOT_SENT)]
    prefetch_related_objects(settled, "root_prices")
    changed = []
    for product in settled:
        note = product_map.not_carried(product)
        state = SyncState.NOT_SENT if note else SyncState.SYNCED
        if (product.sync_state, product.sync_error) != (state, note):
            product.sync_state, product.sync_error = state, note
            changed.append(product)
    if changed:
        with transaction.atomic(), from_remote():
            Product.objects.bulk_update(changed, ["sync_state", "sync_error"])


def upsert_customers(rows: Iterable[Row], *, read_at: datetime | None = None) -> PullCounts:
    counts = PullCounts()
    mapped = _mapped(rows, customer_map.from_remote, counts)
    _upsert(Customer, mapped, counts, local_owned=CUSTOMER_LOCAL, read_at=read_at)
    return counts


def upsert_subscriptions(
    rows: Iterable[Row], *, customer: Customer | None = None, read_at: datetime | None = None
) -> PullCounts:
    """Upsert subscription resources (a page, or the pages of one write, read from ``read_at``
    on); with ``customer``, only its rows."""
    counts = PullCounts()
    mapped = _mapped(rows, subscription_map.carried_from_remote, counts)
    if customer is not None:
        mapped = [m for m in mapped if m.get("customer_remote_id") == customer.remote_id]
    unknown: dict[type[Any], set[Any]] = {}
    for name, model in (("product", Product), ("customer", Customer)):
        key = f"{name}_remote_id"  # left out (or null) when the row does not carry it: kept
        remote_ids = {m[key] for m in mapped if m.get(key)}
        rows_ = model._default_manager.filter(remote_id__in=remote_ids)
        local = dict(rows_.values_list("remote_id", "pk"))
        unknown[model] = remote_ids - local.keys()
        for fields in mapped:
            if key in fields:
                fields[f"{name}_id"] = local.get(fields[key])
    _upsert(Subscription, mapped, counts, read_at=read_at)
    # Those not found may be stored meanwhile by a transaction that does not see these rows.
    for model, remote_ids in unknown.items():
        link_waiting(model, remote_ids)
    return counts


def upsert_subscription(data: Row) -> Subscription | None:
    """Upsert one subscription resource (an event's ``data``) and return the local row."""
    upsert_subscriptions([data])
    rows = Subscription.objects.select_related("product", "customer")
    return rows.filter(remote_id=data.get("id")).first()


def products_without_cycles() -> list[Product]:
    """Products on the service, not archived, with no billing cycle known here."""
    return list(
        Product.objects.without_cycles()
        .filter(remote_id__isnull=False)
        .exclude(status=ProductStatus.ARCHIVED)
        .order_by("name", "pk")
    )


def pull_products(*, client: Any = None, progress: Progress | None = None) -> PullCounts:
    return _pull("products", upsert_products, client, progress)


def pull_customers(*, client: Any = None, progress: Progress | None = None) -> PullCounts:
    return _pull("customers", upsert_customers, client, progress)


def pull_subscriptions(
    customer: Customer | None = None, *, client: Any = None, progress: Progress | None = None
) -> PullCounts:
    """Pull subscriptions; with ``customer``, only its (the list has no filter: all pages)."""
    if customer is not None and customer.remote_id is None:
        return PullCounts()
    upsert = functools.partial(upsert_subscriptions, customer=customer)
    return _pull("subscriptions", upsert, client, progress)


#: The resources a full pull reads, in this order (subscriptions link to the other two).
RESOURCES = ("products", "customers", "subscriptions")


def pull_each(
    resources: Iterable[str] = RESOURCES, *, progress: Progress | None = None
) -> Iterator[tuple[str, PullCounts | BillingError]]:
    """Pull each resource on its own: yields ``(resource, counts or the error)``; then links
    what still waits for an object stored here (``link_all_waiting``)."""
    for resource in resources:
        try:
            yield resource, globals()[f"pull_{resource}"](progress=progress)
        except BillingError as exc:
            logger.error("Pull of %s failed: %s", resource, exc)
            yield resource, exc
    link_all_waiting()


def _pull(
    resource: str, upsert: Callable[..., PullCounts], client: Any, progress: Any
) -> PullCounts:
    ensure_service(client=client)  # refuse before any request if the service is another one
    if client is None:
        from ..client import get_client

        client = get_client()
    total = PullCounts()
    for rows, pages, read_at in _batches(client.iter_pages(resource), _batch_rows()):
        counts = upsert(rows, read_at=read_at)
        counts.pages = pages
        total.add(counts)
        if progress:
            progress(resource, total)
    record_run(f"pull:{resource}")  # billing_doctor: the last successful pull
    return total


def _batch_rows() -> int:
    """Rows per write: ``PULL_BATCH_ROWS``, fewer on a database that caps a statement's
    parameters (Django's SQLite backend assumes 999), as a write's lookups send one or two
    per row."""
    cap = connections[mirror_database()].features.max_query_params
    return PULL_BATCH_ROWS if cap is None else max(1, min(PULL_BATCH_ROWS, cap // 3))


def _batches(pages: Iterator[list[Row]], size: int) -> Iterator[tuple[list[Row], int, datetime]]:
    """Consecutive pages joined until they hold ``size`` rows: ``(rows, pages, read_at)``,
    ``read_at`` the time the request of the first of them began (``pages`` is read lazily).
    When reading a page fails, the pages read before it are yielded first, then the error
    raised."""
    rows: list[Row] = []
    read = 0
    read_at = timezone.now()
    try:
        for page in pages:
            rows += page
            read += 1
            if len(rows) >= size:
                yield rows, read, read_at
                rows, read = [], 0
                read_at = timezone.now()  # before the next page's request
    except Exception:
        if read:
            yield rows, read, read_at
        raise
    if read:
        yield rows, read, read_at
