"""Pull (remote -> local): page through the service's lists and upsert in bulk.

Each page costs a constant number of queries, whatever its size: one ``SELECT`` of the rows
already known by ``remote_id`` and of the local rows not linked yet that may stand for one
(their create answer was lost), one for the customers a subscription page links to (products
are looked up once per pull), one insert of the new rows (``models.bulk.insert_rows``: a
``COPY`` on PostgreSQL) and one ``bulk_update``. While a page is stored, a thread fetches the
next ones (``_read_ahead``), so the HTTP wait overlaps the database work. Nothing here sends
an outbox entry (bulk operations fire no signals, and everything runs inside
``from_remote()``).

Ownership rules:

- products and customers are authored locally: a row with local changes not yet pushed
  (``sync_state`` ``pending`` or ``failed``) is left alone (counted as ``skipped``);
- subscriptions are owned by the service: state and dates always come from the remote side,
  but never move backwards: a row older than the stored version (its ``date_updated``, else
  ``date_created``, against the stored ``remote_updated``, which an event may have set) is
  not applied (counted as ``stale``), and a stored ``remote_updated`` is never nulled. Only
  a stored version of the service's own makes a row stale: one of our clock (an undated
  event's signed timestamp or receive time, ``remote_updated_ours``) never does, the pull
  is the service's present.

A row the mapping refuses (``RemoteDataError``: a date that does not parse, a string longer
than its column) is not applied: what is stored is kept, the row is counted in ``errors``
with its message in ``error_messages``, and an error is logged. The rest of the page is
applied.

Public, stable entry points (also used by the webhook handlers)::

    pull_products() / pull_customers() / pull_subscriptions(customer=None) -> PullCounts
    pull_each(resources) -> (resource, PullCounts or the BillingError of its failed pull)...
    products_without_cycles() -> products checkout refuses until their cycles are declared
    upsert_products(rows) / upsert_customers(rows) / upsert_subscriptions(rows) -> PullCounts
    upsert_product(data) / upsert_customer(data) / upsert_subscription(data) -> model instance
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import connections, models, transaction
from django.db.models import Q, prefetch_related_objects
from django.utils import timezone

from ..exceptions import BillingError, RemoteDataError
from ..health import record_run
from ..mapping import customers as customer_map
from ..mapping import products as product_map
from ..mapping import subscriptions as subscription_map
from ..models.base import SyncState
from ..models.bulk import insert_rows
from ..models.customers import Customer
from ..models.products import Price, Product, ProductStatus
from ..models.subscriptions import Subscription
from ..outbox.context import from_remote
from ..service import ensure_service

__all__ = [
    "RESOURCES",
    "PullCounts",
    "products_without_cycles",
    "pull_customers",
    "pull_each",
    "pull_products",
    "pull_subscriptions",
    "upsert_customer",
    "upsert_customers",
    "upsert_product",
    "upsert_products",
    "upsert_subscription",
    "upsert_subscriptions",
]

logger = logging.getLogger("billing_integration.sync")

Progress = Callable[[str, "PullCounts"], None]
T = TypeVar("T")
LOCAL_CHANGES = (SyncState.PENDING, SyncState.FAILED)


#: How many error messages a ``PullCounts`` keeps (the count goes on).
MAX_ERROR_MESSAGES = 20


@dataclass
class PullCounts:
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    skipped: int = 0
    pages: int = 0
    seen: set[uuid.UUID] = field(default_factory=set, repr=False)
    #: Rows not applied because the mapping refused a value (``RemoteDataError``).
    errors: int = 0
    error_messages: list[str] = field(default_factory=list, repr=False)
    #: Rows older than the stored version, not applied.
    stale: int = 0

    @property
    def total(self) -> int:
        return self.created + self.updated + self.unchanged + self.skipped + self.stale

    def add(self, other: PullCounts) -> None:
        self.created += other.created
        self.updated += other.updated
        self.unchanged += other.unchanged
        self.skipped += other.skipped
        self.pages += other.pages
        self.errors += other.errors
        self.stale += other.stale
        room = MAX_ERROR_MESSAGES - len(self.error_messages)
        self.error_messages.extend(other.error_messages[: max(room, 0)])

    def error(self, message: str) -> None:
        self.errors += 1
        if len(self.error_messages) < MAX_ERROR_MESSAGES:
            self.error_messages.append(message)

    def as_dict(self) -> dict[str, int]:
        return {
            "created": self.created,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "skipped": self.skipped,
            "pages": self.pages,
            "stale": self.stale,
            "errors": self.errors,
        }

    def __str__(self) -> str:
        return (
            f"{self.created} created, {self.updated} updated, {self.unchanged} unchanged"
            + (f", {self.skipped} skipped (local changes pending)" if self.skipped else "")
            + (f", {self.stale} stale (older than the stored state)" if self.stale else "")
            + (f", {self.errors} not applied (bad data)" if self.errors else "")
        )


# --- generic bulk upsert ---------------------------------------------------------------------
def _mapped(
    rows: Iterable[dict[str, Any]], mapper: Callable[[dict], dict], counts: PullCounts
) -> list[dict]:
    """The mapped rows by remote id; a row the mapper refuses (``RemoteDataError``) is left
    out and counted in ``counts.errors`` (what is stored for it is kept)."""
    out: dict[uuid.UUID, dict] = {}
    for row in rows:
        if not isinstance(row, dict):
            continue
        try:
            fields = mapper(row)
        except RemoteDataError as exc:
            rid = str(row.get("id"))[:64]
            message = f"{rid}: {exc}"
            logger.error("Pulled row not applied (kept what is stored): %s", message)
            counts.error(message)
            continue
        if fields.get("remote_id") is not None:
            out[fields["remote_id"]] = fields  # the last of duplicates wins
    return list(out.values())


def _differs(obj: models.Model, fields: dict[str, Any]) -> list[str]:
    return [name for name, value in fields.items() if getattr(obj, name) != value]


@dataclass(frozen=True)
class Adoption:
    """How a page finds local rows not linked yet (their create answer was lost) that stand
    for a remote row: ``candidates(rows)`` filters the local unlinked rows that may match
    (``None``: none can), ``local_key(obj)`` and ``remote_key(fields)`` pair them up."""

    candidates: Callable[[list[dict[str, Any]]], Q | None]
    local_key: Callable[[Any], Any]
    remote_key: Callable[[dict[str, Any]], Any]


def _bulk_upsert(
    model: type[models.Model],
    mapped: list[dict[str, Any]],
    *,
    local_owned: tuple[str, ...],
    adopt: Adoption | None = None,
    create_only: tuple[str, ...] = (),
    created_rows: bool = False,
    counts: PullCounts | None = None,
    versioned: bool = False,
) -> tuple[PullCounts, list[models.Model]]:
    """Upsert one page. ``local_owned`` fields are not overwritten on rows with local
    changes pending; ``create_only`` fields are set on new rows only; ``adopt`` links remote
    rows to local not-yet-linked rows (looked up in the same query as the known rows).
    ``versioned``: a row older than the stored ``remote_updated`` is not applied (``stale``)
    unless that is a time of ours (``remote_updated_ours``), and a row without
    ``date_updated`` keeps the stored ``remote_updated``.
    Returns the counts and the rows written: the created ones (with their primary keys) when
    ``created_rows`` is set - otherwise new rows are inserted without building model
    instances (``models.bulk.insert_rows``) and only the updated ones are returned."""
    counts = counts if counts is not None else PullCounts()
    counts.pages += 1
    if not mapped:
        return counts, []
    now = timezone.now()
    query = Q(remote_id__in=[m["remote_id"] for m in mapped])
    candidates = adopt.candidates(mapped) if adopt else None
    if candidates is not None:
        query |= Q(remote_id__isnull=True) & candidates
    existing: dict[uuid.UUID, models.Model] = {}
    unlinked: dict[Any, models.Model] = {}
    for obj in model._default_manager.filter(query).order_by("pk"):
        if obj.remote_id is not None:
            existing[obj.remote_id] = obj
        elif adopt is not None:
            unlinked.setdefault(adopt.local_key(obj), obj)
    if adopt is not None and unlinked:
        for fields in mapped:
            if fields["remote_id"] not in existing:
                obj = unlinked.pop(adopt.remote_key(fields), None)
                if obj is not None:
                    existing[fields["remote_id"]] = obj
    to_create: list[dict[str, Any]] = []
    to_update: list[models.Model] = []
    update_fields: set[str] = set()
    for fields in mapped:
        counts.seen.add(fields["remote_id"])
        obj = existing.get(fields["remote_id"])
        if obj is None:
            to_create.append({**fields, "sync_state": SyncState.SYNCED, "last_synced_at": now})
            continue
        fields = {k: v for k, v in fields.items() if k not in create_only}
        if versioned and obj.remote_updated is not None:
            version = fields.get("remote_updated") or fields.get("remote_created")
            ours = obj.remote_updated_ours  # our clock never makes the service's row stale
            if version is not None and version < obj.remote_updated and not ours:
                counts.stale += 1
                continue
            if fields.get("remote_updated") is None:
                fields = {k: v for k, v in fields.items() if k != "remote_updated"}
            else:
                fields["remote_updated_ours"] = False
        if (
            local_owned
            and getattr(obj, "sync_state", None) in LOCAL_CHANGES
            and obj.remote_id is not None
        ):
            # Local changes waiting to be pushed: keep them; still record what we saw.
            fields = {k: v for k, v in fields.items() if k not in local_owned}
            counts.skipped += 1
            skipped = True
        else:
            skipped = False
        changed = _differs(obj, fields)
        if not changed:
            if not skipped:
                counts.unchanged += 1
            continue
        for name in changed:
            setattr(obj, name, fields[name])
        obj.last_synced_at = now
        update_fields.update(changed)
        update_fields.add("last_synced_at")
        if not skipped:
            if obj.sync_state != SyncState.SYNCED and obj.remote_id is not None:
                obj.sync_state = SyncState.SYNCED
                update_fields.add("sync_state")
            counts.updated += 1
        to_update.append(obj)
    created: list[models.Model] = []
    with transaction.atomic(), from_remote():
        if to_create and created_rows:
            created = model._default_manager.bulk_create([model(**row) for row in to_create])
        elif to_create:
            insert_rows(model, to_create, using=model._default_manager.db)
        if to_update:
            update_fields.add("updated_at")
            for obj in to_update:
                obj.updated_at = now
            model._default_manager.bulk_update(to_update, sorted(update_fields))
    counts.created += len(to_create)
    return counts, [*created, *to_update]


# --- products --------------------------------------------------------------------------------
PRODUCT_LOCAL = ("name", "description", "status", "selected_currencies", "billing_type")


def upsert_products(rows: Iterable[dict[str, Any]]) -> PullCounts:
    """Upsert one page of product resources (request or response shape). Products new to
    this side get their type and root prices (one-time products) from the resource; the
    cycles of a response-shape blueprint (an id) are not known and stay empty: such a
    subscription product is stored with ``blueprint_known`` False, so the cycles declared
    for it here are not pushed unasked (see ``Product.objects.without_cycles()``).

    Products whose remote JSON changed get their ``not_sent`` state re-derived: what the
    service lacks may have changed (two queries for the page)."""
    rows = [r for r in rows if isinstance(r, dict)]
    counts = PullCounts()
    mapped = _mapped(rows, product_map.from_remote, counts)
    counts, objs = _bulk_upsert(
        Product,
        mapped,
        local_owned=PRODUCT_LOCAL,
        create_only=("product_type", "blueprint_known"),
        created_rows=True,
        counts=counts,
    )
    _settle_not_carried(objs[counts.created :])
    created = [o for o in objs[: counts.created] if o.pk is not None]
    if created:
        by_id = {str(r.get("id")): r for r in rows}
        prices = [
            Price(product=product, currency_id=currency, amount=amount)
            for product in created
            for currency, amount in product_map.root_prices_from_remote(
                by_id.get(str(product.remote_id), {})
            )
        ]
        if prices:
            with transaction.atomic(), from_remote():
                Price.objects.bulk_create(prices)
    return counts


def _settle_not_carried(products: list[Any]) -> None:
    """Re-derive ``synced`` / ``not_sent`` (and its reason) of updated products with no
    local change pending, from the JSON just pulled (a pull must not hide a local change
    the service still lacks, nor keep reporting one it now has)."""
    settled = [p for p in products if p.sync_state in (SyncState.SYNCED, SyncState.NOT_SENT)]
    if not settled:
        return
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


def upsert_product(data: dict[str, Any]) -> Product | None:
    upsert_products([data])
    return Product.objects.filter(remote_id=data.get("id")).first()


def pull_products(*, client: Any = None, progress: Progress | None = None) -> PullCounts:
    return _pull("products", upsert_products, client, progress)


def products_without_cycles() -> list[Product]:
    """Products on the service, not archived, with no billing cycle known here: checkout
    refuses them until cycles are declared (a pulled subscription product arrives so)."""
    return list(
        Product.objects.without_cycles()
        .filter(remote_id__isnull=False)
        .exclude(status=ProductStatus.ARCHIVED)
        .order_by("name", "pk")
    )


# --- customers -------------------------------------------------------------------------------
CUSTOMER_LOCAL = ("identifier", "first_name", "last_name", "email")


def _customer_candidates(rows: list[dict[str, Any]]) -> Q | None:
    idents = {m["identifier"] for m in rows if m.get("identifier")}
    return Q(identifier__in=idents) if idents else None


#: Local customers not linked yet (their create answer was lost) with the same identifier
#: as a remote one are linked instead of creating a second local row.
CUSTOMER_ADOPTION = Adoption(
    candidates=_customer_candidates,
    local_key=lambda customer: customer.identifier,
    remote_key=lambda fields: fields.get("identifier"),
)


def upsert_customers(rows: Iterable[dict[str, Any]]) -> PullCounts:
    counts = PullCounts()
    mapped = _mapped(rows, customer_map.from_remote, counts)
    counts, _ = _bulk_upsert(
        Customer, mapped, local_owned=CUSTOMER_LOCAL, adopt=CUSTOMER_ADOPTION, counts=counts
    )
    return counts


def upsert_customer(data: dict[str, Any]) -> Customer | None:
    upsert_customers([data])
    return Customer.objects.filter(remote_id=data.get("id")).first()


def pull_customers(*, client: Any = None, progress: Progress | None = None) -> PullCounts:
    return _pull("customers", upsert_customers, client, progress)


# --- subscriptions ---------------------------------------------------------------------------
def _subscription_candidates(rows: list[dict[str, Any]]) -> Q | None:
    pairs = [(m["customer_id"], m["product_id"]) for m in rows]
    customers = {c for c, p in pairs if c is not None and p is not None}
    products = {p for c, p in pairs if c is not None and p is not None}
    if not customers:
        return None
    return Q(customer_id__in=customers, product_id__in=products)


#: Local subscriptions created here whose create answer was lost (same customer, product and
#: cycle, not linked yet) are linked instead of creating a second local row.
SUBSCRIPTION_ADOPTION = Adoption(
    candidates=_subscription_candidates,
    local_key=lambda sub: (sub.customer_id, sub.product_id, sub.selected_billing_cycle),
    remote_key=lambda fields: (
        fields["customer_id"],
        fields["product_id"],
        fields["selected_billing_cycle"],
    ),
)


def upsert_subscriptions(
    rows: Iterable[dict[str, Any]],
    *,
    customer: Customer | None = None,
    products: dict[uuid.UUID, int] | None = None,
) -> PullCounts:
    """Upsert one page of subscription resources, linked to the local product and customer
    by remote id (one query each for the whole page). ``customer`` keeps only its rows.
    ``products`` (remote id -> local pk) is a cache kept across the pages of one pull: the
    products of a page are looked up only when some are new to it."""
    counts = PullCounts()
    mapped = _mapped(rows, subscription_map.from_remote, counts)
    if customer is not None:
        mapped = [m for m in mapped if m["customer_remote_id"] == customer.remote_id]
    product_ids = {m["product_remote_id"] for m in mapped if m["product_remote_id"]}
    customer_ids = {m["customer_remote_id"] for m in mapped if m["customer_remote_id"]}
    if products is None:
        products = {}
    unknown = product_ids - products.keys()
    if unknown:
        products.update(
            Product.objects.filter(remote_id__in=unknown).values_list("remote_id", "pk")
        )
    customers = dict(
        Customer.objects.filter(remote_id__in=customer_ids).values_list("remote_id", "pk")
    )
    linked = [
        {
            **fields,
            "product_id": products.get(fields["product_remote_id"]),
            "customer_id": customers.get(fields["customer_remote_id"]),
        }
        for fields in mapped
    ]
    counts, _ = _bulk_upsert(
        Subscription,
        linked,
        local_owned=(),
        adopt=SUBSCRIPTION_ADOPTION,
        counts=counts,
        versioned=True,
    )
    return counts


def upsert_subscription(data: dict[str, Any]) -> Subscription | None:
    """Upsert one subscription resource (an event's ``data``) and return the local row."""
    upsert_subscriptions([data])
    return (
        Subscription.objects.select_related("product", "customer")
        .filter(remote_id=data.get("id"))
        .first()
    )


def pull_subscriptions(
    customer: Customer | None = None, *, client: Any = None, progress: Progress | None = None
) -> PullCounts:
    """Pull subscriptions; with ``customer``, only that customer's (the list has no filter
    in the interface, so the pages are still read in full)."""
    if customer is not None and customer.remote_id is None:
        return PullCounts()
    products: dict[uuid.UUID, int] = {}
    return _pull(
        "subscriptions",
        lambda rows: upsert_subscriptions(rows, customer=customer, products=products),
        client,
        progress,
    )


# --- all of them ---------------------------------------------------------------------------
#: The resources a full pull reads, in this order (subscriptions link to the other two).
RESOURCES = ("products", "customers", "subscriptions")


def pull_each(
    resources: Iterable[str] = RESOURCES, *, progress: Progress | None = None
) -> Iterator[tuple[str, PullCounts | BillingError]]:
    """Pull each resource on its own: yields ``(resource, counts)``, or ``(resource, error)``
    when that pull failed (logged), and goes on with the next one, so a failing resource
    never keeps the others from being pulled."""
    functions: dict[str, Callable[..., PullCounts]] = {
        "products": pull_products,
        "customers": pull_customers,
        "subscriptions": pull_subscriptions,
    }
    for resource in resources:
        try:
            yield resource, functions[resource](progress=progress)
        except BillingError as exc:
            logger.error("Pull of %s failed: %s", resource, exc)
            yield resource, exc


# --- paging ----------------------------------------------------------------------------------
#: Pages fetched ahead by a thread while the current page is stored (0: no thread).
READ_AHEAD = 2
_END = object()


def _read_ahead(pages: Iterator[T], depth: int = READ_AHEAD) -> Iterator[T]:
    """Yield the items of ``pages`` while a thread fetches up to ``depth`` more, so the wait
    for the next page overlaps the database work on this one. An error in the thread is
    raised here, at the point the failed page would have been yielded; stopping early stops
    the thread."""
    if depth <= 0:
        yield from pages
        return
    box: queue.Queue[tuple[Any, BaseException | None]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: tuple[Any, BaseException | None]) -> bool:
        while not stop.is_set():
            try:
                box.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def fetch() -> None:
        try:
            for page in pages:
                if not put((page, None)):
                    return
            put((_END, None))
        except BaseException as exc:  # handed to the consumer
            put((_END, exc))
        finally:
            connections.close_all()  # this thread's own (e.g. a database cache for the token)

    thread = threading.Thread(target=fetch, name="billing-pull-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            page, error = box.get()
            if page is _END:
                if error is not None:
                    raise error
                return
            yield page
    finally:
        stop.set()
        thread.join(timeout=60)


def _pull(
    resource: str,
    upsert: Callable[[list[dict[str, Any]]], PullCounts],
    client: Any,
    progress: Progress | None,
) -> PullCounts:
    # Which service (billing_integration.service): refuse before any request.
    ensure_service(client=client)
    if client is None:
        from ..client import get_client

        client = get_client()
    total = PullCounts()
    for page in _read_ahead(client.iter_pages(resource)):
        total.add(upsert(page))
        if progress:
            progress(resource, total)
    record_run(f"pull:{resource}")  # billing_doctor: the last successful pull
    return total
