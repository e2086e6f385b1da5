"""One handler class per canonical event type, registered with ``@handler(type, ...)`` (a
host's subclass replaces a built-in one: docs/events.md). ``handle(ctx)`` runs in the event's
transaction: it locks the rows it changes (subscription -> invoice -> payment -> refund) and
returns ``stale`` for an event older than the stored state (the version guard)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from types import SimpleNamespace
from typing import Any, ClassVar

from django.contrib.contenttypes.models import ContentType
from django.db import connections, models
from django.db.models import Q
from django.utils import timezone

from .. import currencies
from ..exceptions import BillingConfigurationError, RemoteDataError, WebhookError
from ..mapping import subscriptions as subscription_mapping
from ..mapping.common import as_uuid, carried, reference, storable, ts
from ..models import (
    Customer,
    EventState,
    Invoice,
    Payment,
    Product,
    Refund,
    Subscription,
    WebhookEvent,
)
from ..models.base import older_than_stored
from ..models.outbox import BLOCKING, OutboxEntry, OutboxState
from ..models.records import link_waiting, show_newest_payment
from ..models.subscriptions import CANCELED_STATUSES
from ..outbox import from_remote
from . import types


class EventDataError(WebhookError):
    """The event's data cannot be applied (e.g. no usable id): the event fails."""


class MissingEventData(EventDataError):
    """The data lacks what the handler needs (e.g. ``data.id``): the event is kept
    ``unrecognised``, not failed, until a replay after a fix."""


class PullRequired(Exception):
    """Roll back, pull this object, run the handler again (with it in ``ctx.pulled``)."""

    def __init__(self, kind: str, remote_id: uuid.UUID, *, customer: uuid.UUID | None = None):
        super().__init__(f"{kind} {remote_id} is not known locally")
        self.kind, self.remote_id, self.customer = kind, remote_id, customer


@dataclass
class EventContext:
    """What a handler gets: the event row, its canonical type, its data and its times."""

    event: WebhookEvent
    event_type: str
    data: dict[str, Any]
    occurred_at: datetime | None
    #: The data's date, else the envelope's; else (``version_is_ours``) the delivery's.
    version: datetime
    version_is_ours: bool = False
    pulled: set[tuple[str, uuid.UUID]] = field(default_factory=set)

    def may_pull(self, kind: str, remote_id: uuid.UUID | None) -> bool:
        return remote_id is not None and (kind, remote_id) not in self.pulled


#: The outcome of an event that must wait (see ``HandlerResult``).
DEFERRED = "deferred"


@dataclass
class HandlerResult:
    """``outcome``: ``applied``, ``stale`` or ``deferred`` (nothing stored, the event stays
    ``received`` and is tried again: ``SubscriptionHandler.create_may_be_out``); ``objects``:
    the local objects, for the signals."""

    outcome: str = "applied"
    objects: dict[str, Any] = field(default_factory=dict)
    #: The record's status before the event ("" or None for a record new here, or when the
    #: handler does not say): the notices tell a change of status from a restatement of it.
    previous_status: str | None = None


def _locked(queryset: models.QuerySet[Any]) -> models.QuerySet[Any]:
    """``FOR NO KEY UPDATE`` where the database has it: a handler never waits on another
    transaction's foreign-key check (a deadlock otherwise)."""
    no_key = connections[queryset.db].features.has_select_for_no_key_update
    return queryset.select_for_update(no_key=no_key)


def _amount(value: Any) -> Decimal | None:
    """The ``amount`` as stored (None for null or ""); ``RemoteDataError`` when the column
    cannot hold it."""
    if value is None or value == "":
        return None
    try:
        dec = None if isinstance(value, bool) else Decimal(str(value))
    except (InvalidOperation, ValueError):
        dec = None
    if dec is None or not dec.is_finite() or abs(dec) >= Decimal(10) ** 15:
        raise RemoteDataError("amount", value, "not an amount")
    return dec.quantize(Decimal("0.0001"))


def _currency(value: Any, known: bool) -> str:
    """A record's currency code ("" when absent); one ``BILLING['CURRENCIES']`` lacks is a
    ``RemoteDataError`` when ``known``, else kept as received (``_text``)."""
    received = _text(value, 64, "currency")
    try:
        return currencies.currency_code(currencies.whole(value)) if received else ""
    except BillingConfigurationError:
        if known:
            raise RemoteDataError("currency", value, "not in BILLING['CURRENCIES']") from None
        return received[:8]


def changed(remote_id: Any, stored_remote_id: Any, fk: Any) -> bool:
    """A link must be (re)resolved: the remote id differs, or it is set but not linked."""
    return remote_id != stored_remote_id or (remote_id is not None and fk is None)


def _text(value: Any, limit: int, field: str) -> str:
    """The text or number as the column takes it (``storable``: U+FFFD for a NUL), cut to
    ``limit``; ``RemoteDataError`` naming ``field`` for an object, a list or a boolean."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
        raise RemoteDataError(field, value, "not a string")
    return "" if value is None else storable(str(value), "event data")[:limit]


#: Canonical type -> handler class (``@handler``).
HANDLERS: dict[str, type[EventHandler]] = {}


def handler(*event_types: str) -> Callable[[type[EventHandler]], type[EventHandler]]:
    """Register the decorated class for these types (the last registration wins); a type that
    is not canonical becomes one of the project's own (``types.OWN_TYPES``). A type must fit
    ``WebhookEvent.type`` (64 characters), else ``ValueError``."""
    longest = WebhookEvent._meta.get_field("type").max_length or 0
    for name in event_types:
        if not isinstance(name, str) or not name.strip() or len(name) > longest:
            raise ValueError(f"@handler: an event type is 1 to {longest} characters: {name!r}")

    def register(cls: type[EventHandler]) -> type[EventHandler]:
        HANDLERS.update(dict.fromkeys(event_types, cls))
        types.OWN_TYPES.update(t for t in event_types if t not in types.CANONICAL_TYPES)
        return cls

    return register


def _customer_pk(ctx: EventContext, remote_id: uuid.UUID | None) -> int | None:
    """The local id of a customer; asks for a pull (once) when it is not known."""
    if remote_id is None:
        return None
    pk = Customer.objects.filter(remote_id=remote_id).values_list("pk", flat=True).first()
    if pk is None and ctx.may_pull("customer", remote_id):
        raise PullRequired("customer", remote_id)
    return pk


def _product_pk(remote_id: uuid.UUID | None) -> int | None:
    if remote_id is None:
        return None
    return Product.objects.filter(remote_id=remote_id).values_list("pk", flat=True).first()


def _link_unknown(record: Any) -> None:
    """The subscription, customer, product or payment ``record`` names and that was not found
    here may be stored meanwhile by a transaction that does not see ``record`` either: linked
    after the commit (``link_waiting``)."""
    for model in (Subscription, Customer, Product, Payment):
        name = model._meta.model_name
        remote_id = getattr(record, f"{name}_remote_id", None)
        if remote_id is not None and getattr(record, f"{name}_id") is None:
            link_waiting(model, [remote_id])


class EventHandler:
    """Base class of every handler: an upsert of the ``model`` row the event's ``data.id``
    names, behind the version guard. Override ``handle`` or its steps."""

    model: ClassVar[type[models.Model]]
    #: The local object kind the handler changes, for the signals (``subscription``, ...).
    object_name: ClassVar[str] = ""
    #: Canonical type -> the status it implies; it wins over ``data.status``.
    STATUS_FOR_TYPE: ClassVar[dict[str, str]] = {
        types.SUBSCRIPTION_CANCELED: "canceled",
        types.SUBSCRIPTION_PAUSED: "paused",
        types.INVOICE_PAID: "paid",
        types.INVOICE_VOIDED: "void",
        types.INVOICE_MARKED_UNCOLLECTABLE: "uncollectable",
        types.INVOICE_DELETED: "deleted",
        types.PAYMENT_COMPLETED: "completed",
        types.PAYMENT_FAILED: "failed",
        types.PAYMENT_CANCELED: "canceled",
        types.REFUND_INITIATED: "initiated",
        types.REFUND_APPROVED: "approved",
        types.REFUND_REJECTED: "rejected",
    }
    #: Of two events of the same version, the higher-ranked status wins.
    RANK: ClassVar[dict[str, int]] = {}
    #: Statuses an undated event (``ctx.version_is_ours``) never moves a row out of.
    FINAL: ClassVar[frozenset[str]] = frozenset()
    #: A record's other fields: ids of other objects (``<name>_remote_id``), dates, texts
    #: (name -> the column's length); ``KNOWN_CURRENCY``: an unknown currency fails the event.
    REFERENCES: ClassVar[tuple[str, ...]] = ()
    DATES: ClassVar[tuple[str, ...]] = ()
    TEXTS: ClassVar[dict[str, int]] = {}
    KNOWN_CURRENCY: ClassVar[bool] = False

    def __init__(self, event_type: str) -> None:
        self.event_type = event_type

    def is_stale(self, ctx: EventContext, record: Any, status: str) -> bool:
        stored = record.remote_updated
        if older_than_stored(ctx.version, stored):
            return True
        if ctx.version == stored:
            later = self.later_than_stored(ctx, record)
            if later is not None:
                return not later
            if self.RANK.get(status, 0) < self.RANK.get(record.status, 0):
                return True
        return ctx.version_is_ours and record.status in self.FINAL and status not in self.FINAL

    def later_than_stored(self, ctx: EventContext, record: Any) -> bool | None:
        """Of two events of one object whose data carries no ``date_updated`` (their version,
        the object's ``date_created``, is the same in each), the envelope's time says which
        came later: True (this one: it applies), False (the one stored: this one is stale);
        None when the times do not tell (one missing, or equal; then the rank decides)."""
        if ctx.data.get("date_updated") not in (None, "") or ctx.occurred_at is None:
            return None
        applied = WebhookEvent.objects.filter(
            object_id=str(record.remote_id), state=EventState.PROCESSED, outcome="applied"
        ).exclude(pk=ctx.event.pk)
        stored = applied.order_by("-processed_at", "-pk").values_list("occurred_at", flat=True)
        before = stored.first()
        if before is None or before == ctx.occurred_at:
            return None
        return ctx.occurred_at > before

    def lock_related(self, ctx: EventContext) -> dict[str, Any]:
        """Lock rows this event also changes, before the record (override)."""
        return {}

    def fields(self, ctx: EventContext) -> dict[str, Any]:
        """The values of the fields the data carries: one it leaves out keeps what is stored."""
        data = ctx.data
        status = self.STATUS_FOR_TYPE.get(self.event_type)  # the type decides: data's unread
        values: dict[str, Any] = {
            "status": status or _text(data.get("status"), 32, "status"),
            "amount": _amount(data.get("amount")),
            "currency": _currency(data.get("currency"), self.KNOWN_CURRENCY),
            "remote_created": ts(data.get("date_created"), "date_created"),
        }
        names = ("customer", "subscription", *self.REFERENCES)
        for name in names:
            values[f"{name}_remote_id"] = reference(data.get(name), name)
        for name in self.DATES:
            values[name] = ts(data.get(name), name)
        for name, length in self.TEXTS.items():
            values[name] = _text(data.get(name), length, name)
        source = {"remote_created": "date_created", **{f"{n}_remote_id": n for n in names}}
        values = {key: value for key, value in values.items() if carried(data, source, key)}
        if status:
            values["status"] = status
        values["remote_data"] = storable(data, f"event data of {str(data.get('id'))[:64]}")
        return {**values, "remote_updated": ctx.version}

    def new(self, remote_id: uuid.UUID) -> Any:
        return self.model(remote_id=remote_id)

    def resolve_links(
        self, ctx: EventContext, record: Any, values: dict[str, Any], related: dict[str, Any]
    ) -> None:
        """Set the foreign keys whose remote id changed."""
        sub_rid = values.get("subscription_remote_id", record.subscription_remote_id)
        cust_rid = values.get("customer_remote_id", record.customer_remote_id)
        prod_rid = values.get("product_remote_id", getattr(record, "product_remote_id", None))
        relink_sub = changed(sub_rid, record.subscription_remote_id, record.subscription_id)
        relink_cust = changed(cust_rid, record.customer_remote_id, record.customer_id)
        relink_prod = hasattr(record, "product_remote_id") and changed(
            prod_rid, record.product_remote_id, record.product_id
        )
        sub: Any = related.get("subscription")
        if sub is None and sub_rid and (relink_sub or relink_cust or relink_prod):
            # One query gives the subscription and, through it, its customer and product.
            cols = ("pk", "customer_id", "customer_remote_id", "product_id", "product_remote_id")
            row = Subscription.objects.filter(remote_id=sub_rid).values(*cols).first()
            sub = SimpleNamespace(**row) if row else None
        if relink_sub:
            record.subscription_id = sub.pk if sub else None
        if relink_cust:
            same = sub and sub.customer_remote_id == cust_rid and sub.customer_id
            record.customer_id = sub.customer_id if same else _customer_pk(ctx, cust_rid)
        if relink_prod:
            same = sub and sub.product_remote_id == prod_rid
            record.product_id = sub.product_id if same else _product_pk(prod_rid)

    def save(self, record: Any) -> None:
        record.save()

    def after_save(self, ctx: EventContext, record: Any, related: dict[str, Any]) -> None:
        """Further changes in the same transaction (override)."""

    def handle(self, ctx: EventContext) -> HandlerResult:
        if ctx.data.get("id") in (None, ""):
            raise MissingEventData(f"{self.event_type}: the data has no id (data.id)")
        remote_id = as_uuid(ctx.data.get("id"))
        if remote_id is None:
            raise EventDataError(f"data.id is not a UUID: {str(ctx.data.get('id'))[:80]!r}")
        related = self.lock_related(ctx)
        record = _locked(self.model._default_manager.filter(remote_id=remote_id)).first()
        values = self.fields(ctx)  # before the age check: bad data fails even a stale event
        # The status the event sets ("" for none: such an event never leaves a final state).
        if record is not None and self.is_stale(ctx, record, values.get("status", "")):
            return HandlerResult("stale", {self.object_name: record, **related})
        previous = record.status if record is not None else None
        if record is None:
            record = self.new(remote_id)
        self.resolve_links(ctx, record, values, related)
        for key, value in values.items():
            setattr(record, key, value)
        self.save(record)
        _link_unknown(record)
        self.after_save(ctx, record, related)
        objects = {self.object_name: record, **related}
        return HandlerResult("applied", objects, previous_status=previous)


@handler(types.SUBSCRIPTION_RENEWAL, types.SUBSCRIPTION_CANCELED, types.SUBSCRIPTION_PAUSED)
class SubscriptionHandler(EventHandler):
    """``subscription.*``: the data is the subscription after the change; an unknown one is
    created from it (after pulling its customer if that is unknown too)."""

    model = Subscription
    object_name = "subscription"
    RANK: ClassVar[dict[str, int]] = {"paused": 1, **dict.fromkeys(CANCELED_STATUSES, 2)}
    FINAL = frozenset(CANCELED_STATUSES)  # "cancelled" too: both grant the grace period

    def fields(self, ctx: EventContext) -> dict[str, Any]:
        values = subscription_mapping.carried_from_remote(ctx.data)
        if status := self.STATUS_FOR_TYPE.get(self.event_type):
            values["status"] = status
        return {**values, "remote_updated": ctx.version, "remote_updated_ours": ctx.version_is_ours}

    def handle(self, ctx: EventContext) -> HandlerResult:
        remote_id = as_uuid(ctx.data.get("id"))
        if remote_id is not None and self.create_may_be_out(ctx, remote_id):
            return HandlerResult(DEFERRED)
        return super().handle(ctx)

    def create_may_be_out(self, ctx: EventContext, remote_id: uuid.UUID) -> bool:
        """``remote_id`` is not known here, and a local subscription of the data's customer and
        product waits for its remote id while its create call is out or its outcome is unknown
        (entry in progress, or in doubt): this event may be of that subscription. Nothing is
        stored then (a row here would take the remote id the create's answer brings: two rows
        for one subscription); the event is tried again, and applies once the answer has
        linked the waiting row. Two different subscriptions are never merged. Data without a
        customer or a product waits only while a create of what it does name is out (in
        progress): an entry in doubt may stay so until staff act."""
        customer = reference(ctx.data.get("customer"), "customer")
        product = reference(ctx.data.get("product"), "product")
        if Subscription.objects.filter(remote_id=remote_id).exists():
            return False
        waiting = Subscription.objects.filter(remote_id__isnull=True)
        if customer is not None:
            waiting = waiting.filter(customer__remote_id=customer)
        if product is not None:
            waiting = waiting.filter(product__remote_id=product)
        out = Q(state=OutboxState.IN_PROGRESS)
        if customer is not None and product is not None:
            out |= Q(in_doubt=True)
        return OutboxEntry.objects.filter(
            BLOCKING,
            out,
            content_type=ContentType.objects.get_for_model(Subscription),
            object_id__in=waiting.values("pk"),
        ).exists()

    def new(self, remote_id: uuid.UUID) -> Any:
        return Subscription(remote_id=remote_id, sync_state="synced", last_synced_at=timezone.now())

    def resolve_links(
        self, ctx: EventContext, record: Any, values: dict[str, Any], related: dict[str, Any]
    ) -> None:
        customer_rid = values.get("customer_remote_id", record.customer_remote_id)
        product_rid = values.get("product_remote_id", record.product_remote_id)
        if changed(customer_rid, record.customer_remote_id, record.customer_id):
            record.customer_id = _customer_pk(ctx, customer_rid)
        if changed(product_rid, record.product_remote_id, record.product_id):
            record.product_id = _product_pk(product_rid)

    def save(self, record: Any) -> None:
        new = record.pk is None
        with from_remote():
            record.save()
        if new:
            link_waiting(Subscription, [record.remote_id])


@handler(
    types.INVOICE_PAID,
    types.INVOICE_VOIDED,
    types.INVOICE_MARKED_UNCOLLECTABLE,
    types.INVOICE_DELETED,
)
class InvoiceHandler(EventHandler):
    """``invoice.*``: sets the invoice paid / void / uncollectable / deleted."""

    model = Invoice
    object_name = "invoice"
    RANK: ClassVar[dict[str, int]] = {"deleted": 1}
    FINAL = frozenset({"deleted", "void", "uncollectable"})
    REFERENCES = ("product",)
    DATES = ("period_start", "period_end")


@handler(types.PAYMENT_COMPLETED, types.PAYMENT_FAILED, types.PAYMENT_CANCELED)
class PaymentHandler(EventHandler):
    """``payment.*``: the payment, and its (pulled if unknown) subscription's latest status."""

    model = Payment
    object_name = "payment"
    REFERENCES = ("product", "invoice")
    TEXTS: ClassVar[dict[str, int]] = {"failure_reason": 64}
    KNOWN_CURRENCY = True

    def lock_related(self, ctx: EventContext) -> dict[str, Any]:
        sub_rid = reference(ctx.data.get("subscription"), "subscription")
        if sub_rid is None:  # absent, null or "": the stored payment's (``carried``)
            stored = Payment.objects.filter(remote_id=str(as_uuid(ctx.data.get("id"))))
            sub_rid = stored.values_list("subscription_remote_id", flat=True).first()
        if sub_rid is None:
            return {}
        subscription = _locked(Subscription.objects.filter(remote_id=sub_rid)).first()
        if subscription is None and ctx.may_pull("subscription", sub_rid):
            customer = reference(ctx.data.get("customer"), "customer")
            raise PullRequired("subscription", sub_rid, customer=customer)
        return {"subscription": subscription} if subscription else {}

    def save(self, record: Any) -> None:
        new = record.pk is None
        record.save()
        if new:  # the refunds stored before it
            link_waiting(Payment, [record.remote_id])

    def after_save(self, ctx: EventContext, record: Any, related: dict[str, Any]) -> None:
        subscription = related.get("subscription")
        if subscription is None or record.subscription_id != subscription.pk:
            return
        if show_newest_payment(Subscription.objects.filter(pk=subscription.pk), record):
            subscription.last_payment_status = record.status


@handler(types.REFUND_INITIATED, types.REFUND_APPROVED, types.REFUND_REJECTED)
class RefundHandler(EventHandler):
    """``refund.*``: moves a refund through initiated -> approved / rejected."""

    model = Refund
    object_name = "refund"
    RANK: ClassVar[dict[str, int]] = {"approved": 1, "rejected": 1}
    FINAL = frozenset({"approved", "rejected"})
    REFERENCES = ("payment",)
    TEXTS: ClassVar[dict[str, int]] = {"reason": 255}

    def resolve_links(
        self, ctx: EventContext, record: Any, values: dict[str, Any], related: dict[str, Any]
    ) -> None:
        pay_rid = values.get("payment_remote_id", record.payment_remote_id)
        if changed(pay_rid, record.payment_remote_id, record.payment_id):
            cols = "pk subscription_id subscription_remote_id customer_id customer_remote_id"
            rows = Payment.objects.filter(remote_id=pay_rid).values(*cols.split())
            row = rows.first() if pay_rid else None
            record.payment_id = row["pk"] if row else None
            if row:
                # The payment already knows the subscription and customer: no more lookups.
                sub_rid = values.get("subscription_remote_id", record.subscription_remote_id)
                cust_rid = values.get("customer_remote_id", record.customer_remote_id)
                if row["subscription_remote_id"] == sub_rid:
                    record.subscription_remote_id = sub_rid
                    record.subscription_id = row["subscription_id"]
                if row["customer_remote_id"] == cust_rid and row["customer_id"]:
                    record.customer_remote_id = cust_rid
                    record.customer_id = row["customer_id"]
        super().resolve_links(ctx, record, values, related)


def get_handler(event_type: str) -> EventHandler | None:
    """The handler of a canonical type or a project's own, or None if there is none."""
    cls = HANDLERS.get(event_type) if event_type else None
    return cls(event_type) if cls is not None else None
