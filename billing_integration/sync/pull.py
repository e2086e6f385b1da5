"""Pull (remote -> local): page through the service's lists and upsert in bulk.

Each page costs a constant number of queries, whatever its size: one ``SELECT`` of the rows
already known by ``remote_id`` (plus one for the references a page links to, and one to
adopt local rows whose create answer was lost), one ``bulk_create`` and one ``bulk_update``.
Nothing here sends an outbox entry (bulk operations fire no signals, and everything runs
inside ``from_remote()``).

Ownership rules:

- products and customers are authored locally: a row with local changes not yet pushed
  (``sync_state`` ``pending`` or ``failed``) is left alone (counted as ``skipped``);
- subscriptions are owned by the service: state and dates always come from the remote side.

Public, stable entry points (also used by the webhook handlers)::

    pull_products() / pull_customers() / pull_subscriptions(customer=None) -> PullCounts
    upsert_products(rows) / upsert_customers(rows) / upsert_subscriptions(rows) -> PullCounts
    upsert_product(data) / upsert_customer(data) / upsert_subscription(data) -> model instance
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import models, transaction
from django.utils import timezone

from ..mapping import customers as customer_map
from ..mapping import products as product_map
from ..mapping import subscriptions as subscription_map
from ..models.base import SyncState
from ..models.customers import Customer
from ..models.products import Price, Product
from ..models.subscriptions import Subscription
from ..outbox.context import from_remote

__all__ = [
    "PullCounts",
    "pull_customers",
    "pull_products",
    "pull_subscriptions",
    "upsert_customer",
    "upsert_customers",
    "upsert_product",
    "upsert_products",
    "upsert_subscription",
    "upsert_subscriptions",
]

Progress = Callable[[str, "PullCounts"], None]
LOCAL_CHANGES = (SyncState.PENDING, SyncState.FAILED)


@dataclass
class PullCounts:
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    skipped: int = 0
    pages: int = 0
    seen: set[uuid.UUID] = field(default_factory=set, repr=False)

    @property
    def total(self) -> int:
        return self.created + self.updated + self.unchanged + self.skipped

    def add(self, other: PullCounts) -> None:
        self.created += other.created
        self.updated += other.updated
        self.unchanged += other.unchanged
        self.skipped += other.skipped
        self.pages += other.pages

    def as_dict(self) -> dict[str, int]:
        return {
            "created": self.created,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "skipped": self.skipped,
            "pages": self.pages,
        }

    def __str__(self) -> str:
        return (
            f"{self.created} created, {self.updated} updated, {self.unchanged} unchanged"
            + (f", {self.skipped} skipped (local changes pending)" if self.skipped else "")
        )


# --- generic bulk upsert ---------------------------------------------------------------------
def _mapped(rows: Iterable[dict[str, Any]], mapper: Callable[[dict], dict]) -> list[dict]:
    out: dict[uuid.UUID, dict] = {}
    for row in rows:
        if not isinstance(row, dict):
            continue
        fields = mapper(row)
        if fields.get("remote_id") is not None:
            out[fields["remote_id"]] = fields  # the last of duplicates wins
    return list(out.values())


def _differs(obj: models.Model, fields: dict[str, Any]) -> list[str]:
    return [name for name, value in fields.items() if getattr(obj, name) != value]


def _bulk_upsert(
    model: type[models.Model],
    mapped: list[dict[str, Any]],
    *,
    local_owned: tuple[str, ...],
    adopt: Callable[[list[dict[str, Any]]], dict[uuid.UUID, models.Model]] | None = None,
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    create_only: tuple[str, ...] = (),
) -> tuple[PullCounts, list[models.Model]]:
    """Upsert one page. ``local_owned`` fields are not overwritten on rows with local
    changes pending; ``create_only`` fields are set on new rows only; ``adopt`` maps remote
    ids to local not-yet-linked rows. Returns the counts and the created rows followed by
    the updated ones."""
    counts = PullCounts(pages=1)
    if not mapped:
        return counts, []
    now = timezone.now()
    ids = [m["remote_id"] for m in mapped]
    existing = {o.remote_id: o for o in model._default_manager.filter(remote_id__in=ids)}
    missing = [m for m in mapped if m["remote_id"] not in existing]
    if adopt and missing:
        existing.update(adopt(missing))
    to_create: list[models.Model] = []
    to_update: list[models.Model] = []
    update_fields: set[str] = set()
    for fields in mapped:
        if prepare:
            fields = prepare(fields)
        counts.seen.add(fields["remote_id"])
        obj = existing.get(fields["remote_id"])
        if obj is None:
            to_create.append(
                model(**fields, sync_state=SyncState.SYNCED, last_synced_at=now)  # type: ignore[misc]
            )
            continue
        fields = {k: v for k, v in fields.items() if k not in create_only}
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
    with transaction.atomic(), from_remote():
        if to_create:
            model._default_manager.bulk_create(to_create)
        if to_update:
            update_fields.add("updated_at")
            for obj in to_update:
                obj.updated_at = now
            model._default_manager.bulk_update(to_update, sorted(update_fields))
    counts.created += len(to_create)
    return counts, [*to_create, *to_update]


# --- products --------------------------------------------------------------------------------
PRODUCT_LOCAL = ("name", "description", "status", "selected_currencies", "billing_type")


def upsert_products(rows: Iterable[dict[str, Any]]) -> PullCounts:
    """Upsert one page of product resources (request or response shape). Products new to
    this side get their type and root prices (one-time products) from the resource; the
    cycles of a response-shape blueprint (an id) are not known and stay empty."""
    rows = [r for r in rows if isinstance(r, dict)]
    mapped = _mapped(rows, product_map.from_remote)
    counts, objs = _bulk_upsert(
        Product, mapped, local_owned=PRODUCT_LOCAL, create_only=("product_type",)
    )
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


def upsert_product(data: dict[str, Any]) -> Product | None:
    upsert_products([data])
    return Product.objects.filter(remote_id=data.get("id")).first()


def pull_products(*, client: Any = None, progress: Progress | None = None) -> PullCounts:
    return _pull("products", upsert_products, client, progress)


# --- customers -------------------------------------------------------------------------------
CUSTOMER_LOCAL = ("identifier", "first_name", "last_name", "email")


def _adopt_customers(missing: list[dict[str, Any]]) -> dict[uuid.UUID, models.Model]:
    """Local customers not linked yet (their create answer was lost) with the same
    identifier as a remote one: link them instead of creating a second local row."""
    idents = {m["identifier"]: m["remote_id"] for m in missing if m.get("identifier")}
    if not idents:
        return {}
    found = Customer.objects.filter(remote_id__isnull=True, identifier__in=list(idents))
    return {idents[c.identifier]: c for c in found}


def upsert_customers(rows: Iterable[dict[str, Any]]) -> PullCounts:
    mapped = _mapped(rows, customer_map.from_remote)
    counts, _ = _bulk_upsert(
        Customer, mapped, local_owned=CUSTOMER_LOCAL, adopt=_adopt_customers
    )
    return counts


def upsert_customer(data: dict[str, Any]) -> Customer | None:
    upsert_customers([data])
    return Customer.objects.filter(remote_id=data.get("id")).first()


def pull_customers(*, client: Any = None, progress: Progress | None = None) -> PullCounts:
    return _pull("customers", upsert_customers, client, progress)


# --- subscriptions ---------------------------------------------------------------------------
def _adopt_subscriptions(missing: list[dict[str, Any]]) -> dict[uuid.UUID, models.Model]:
    """Local subscriptions created here whose create answer was lost: same customer, product
    and cycle, not linked yet."""
    keys = {
        (m["customer_remote_id"], m["product_remote_id"], m["selected_billing_cycle"]): m[
            "remote_id"
        ]
        for m in missing
        if m.get("customer_remote_id") and m.get("product_remote_id")
    }
    if not keys:
        return {}
    found = Subscription.objects.filter(
        remote_id__isnull=True,
        customer__remote_id__in={k[0] for k in keys},
        product__remote_id__in={k[1] for k in keys},
    ).select_related("customer", "product")
    out: dict[uuid.UUID, models.Model] = {}
    for sub in found:
        key = (sub.customer.remote_id, sub.product.remote_id, sub.selected_billing_cycle)
        if key in keys and keys[key] not in out:
            out[keys.pop(key)] = sub
    return out


def upsert_subscriptions(
    rows: Iterable[dict[str, Any]], *, customer: Customer | None = None
) -> PullCounts:
    """Upsert one page of subscription resources, linked to the local product and customer
    by remote id (one query each for the whole page). ``customer`` keeps only its rows."""
    mapped = _mapped(rows, subscription_map.from_remote)
    if customer is not None:
        mapped = [m for m in mapped if m["customer_remote_id"] == customer.remote_id]
    product_ids = {m["product_remote_id"] for m in mapped if m["product_remote_id"]}
    customer_ids = {m["customer_remote_id"] for m in mapped if m["customer_remote_id"]}
    products = dict(
        Product.objects.filter(remote_id__in=product_ids).values_list("remote_id", "pk")
    )
    customers = dict(
        Customer.objects.filter(remote_id__in=customer_ids).values_list("remote_id", "pk")
    )

    def link(fields: dict[str, Any]) -> dict[str, Any]:
        return {
            **fields,
            "product_id": products.get(fields["product_remote_id"]),
            "customer_id": customers.get(fields["customer_remote_id"]),
        }

    counts, _ = _bulk_upsert(
        Subscription, mapped, local_owned=(), adopt=_adopt_subscriptions, prepare=link
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
    return _pull(
        "subscriptions",
        lambda rows: upsert_subscriptions(rows, customer=customer),
        client,
        progress,
    )


# --- paging ----------------------------------------------------------------------------------
def _pull(
    resource: str,
    upsert: Callable[[list[dict[str, Any]]], PullCounts],
    client: Any,
    progress: Progress | None,
) -> PullCounts:
    if client is None:
        from ..client import get_client

        client = get_client()
    total = PullCounts()
    for page in client.iter_pages(resource):
        total.add(upsert(page))
        if progress:
            progress(resource, total)
    return total

