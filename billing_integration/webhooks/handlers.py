"""One handler per canonical event type, registered in one table (``HANDLERS``).

A handler's ``handle(ctx)`` runs inside the processing transaction, with the event row
locked. It locks the rows it changes (``_locked``: ``FOR NO KEY UPDATE`` on PostgreSQL, always
in the order subscription -> invoice -> payment -> refund, so two events never wait on each
other in opposite orders), skips the event when it is older than the stored state (``ctx.version``
compared with the row's ``remote_updated``), applies it, and returns a ``HandlerResult``
naming the objects it touched (they go to the signals).

Every event has a version (``EventContext.version``): the data's ``date_updated``, else its
``date_created``, else the envelope's ``created_at``, else the delivery's signed
``webhook-timestamp``, else the time it was received. An applied event stores it as the
row's ``remote_updated``, which therefore never goes back nor becomes null. The last two are
times of ours (``EventContext.version_is_ours``; a subscription records it in
``remote_updated_ours``): such an event never moves an object out of a final state, and of
two events of the same version the higher-ranked status wins (``leaves_final``). A value that
cannot be parsed (a date, a status longer than its column, an amount, a payment's currency
not in ``BILLING['CURRENCIES']``) raises ``RemoteDataError``: the event fails with that error
and nothing is changed.

A host overrides one event by subclassing and registering its class::

    # myapp/handlers.py
    from billing_integration.webhooks.handlers import InvoiceHandler

    class MyInvoicePaid(InvoiceHandler):
        def handle(self, ctx):
            result = super().handle(ctx)
            ...  # your own bookkeeping, in the same transaction
            return result

    # settings.py
    BILLING = {..., "EVENT_HANDLERS": {"invoice.paid": "myapp.handlers.MyInvoicePaid"}}

A handler class registered for a type that is not built in (with an
``EVENT_TYPE_ALIASES`` entry pointing a spelling at it) handles a new kind of event.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from functools import cached_property
from types import SimpleNamespace
from typing import Any, ClassVar

from django.db import connections, models
from django.db.models import Exists, OuterRef
from django.utils import timezone
from django.utils.module_loading import import_string

from .. import currencies
from ..conf import billing_settings
from ..exceptions import BillingConfigurationError, RemoteDataError, WebhookError
from ..mapping import subscriptions as subscription_mapping
from ..mapping.common import as_uuid, ts
from ..models import (
    Customer,
    Invoice,
    Payment,
    Product,
    Refund,
    Subscription,
    WebhookEvent,
)
from ..outbox import from_remote
from . import types

__all__ = [
    "HANDLERS",
    "EventContext",
    "EventDataError",
    "EventHandler",
    "HandlerResult",
    "InvoiceHandler",
    "PaymentHandler",
    "PullRequired",
    "RefundHandler",
    "SubscriptionHandler",
    "get_handler",
]


class EventDataError(WebhookError):
    """The event's data cannot be applied (e.g. no usable id). The event is marked failed."""


class PullRequired(Exception):
    """Raised by a handler inside the transaction: fetch this object from the API first.

    Processing rolls back, pulls (outside any transaction), and runs the handler again with
    ``ctx.pulled`` containing ``(kind, remote_id)`` so it does not ask twice.
    """

    def __init__(self, kind: str, remote_id: uuid.UUID, *, customer: uuid.UUID | None = None):
        super().__init__(f"{kind} {remote_id} is not known locally")
        self.kind = kind
        self.remote_id = remote_id
        self.customer = customer


@dataclass
class EventContext:
    """What a handler gets: the event row, its canonical type and parsed parts.

    ``occurred_at``: the envelope's ``created_at``; ``signed_at``: the delivery's
    ``webhook-timestamp`` when the signature covered it; ``received_at``: when it was stored.
    """

    event: WebhookEvent
    event_type: str
    data: dict[str, Any]
    occurred_at: datetime | None
    pulled: set[tuple[str, uuid.UUID]] = field(default_factory=set)
    signed_at: datetime | None = None
    received_at: datetime | None = None

    @cached_property
    def _versioned(self) -> tuple[datetime, bool]:
        service = (
            ts(self.data.get("date_updated"), "date_updated")
            or ts(self.data.get("date_created"), "date_created")
            or self.occurred_at
        )
        if service is not None:
            return service, False
        ours = (
            self.signed_at
            or self.received_at
            or getattr(self.event, "received_at", None)
            or timezone.now()
        )
        return ours, True

    @property
    def version(self) -> datetime:
        """The time of the state the event carries: ``data.date_updated``, else
        ``data.date_created``, else the envelope's ``created_at``, else the signed
        ``webhook-timestamp``, else the receive time (never None). ``RemoteDataError`` when
        a date given in the data does not parse."""
        return self._versioned[0]

    @property
    def version_is_ours(self) -> bool:
        """The version is a time of ours (the signed ``webhook-timestamp`` or the receive
        time), not a date of the service's: such an event never moves an object out of a
        final state (``leaves_final``)."""
        return self._versioned[1]

    def may_pull(self, kind: str, remote_id: uuid.UUID | None) -> bool:
        return remote_id is not None and (kind, remote_id) not in self.pulled


@dataclass
class HandlerResult:
    """``outcome``: ``applied`` or ``stale`` (an older event, skipped). ``objects``: the
    local objects the event concerns, by name, for the signals."""

    outcome: str = "applied"
    objects: dict[str, Any] = field(default_factory=dict)


def _locked(queryset: models.QuerySet) -> models.QuerySet:
    """``queryset`` locking its rows until the transaction ends: ``FOR NO KEY UPDATE`` where
    the database has it (PostgreSQL), else ``FOR UPDATE``. Two handlers still exclude each
    other on a row, but a handler's lock no longer blocks the ``KEY SHARE`` locks PostgreSQL's
    foreign-key checks take, at the commit (Django's foreign keys are deferred), on the rows a
    new or changed row points to. With ``FOR UPDATE``, an event inserting a refund (holding
    the ``KEY SHARE`` on its payment, then checking its subscription at the commit) and a
    payment event holding that subscription and waiting for that payment deadlocked when
    events of different objects were processed at once."""
    no_key = connections[queryset.db].features.has_select_for_no_key_update
    return queryset.select_for_update(no_key=no_key)


def is_older(version: datetime | None, stored: datetime | None) -> bool:
    """True when an event's state (``version``) is older than what is stored."""
    return version is not None and stored is not None and version < stored


def leaves_final(
    ctx: EventContext,
    stored_status: str,
    stored_version: datetime | None,
    status: str,
    *,
    final: frozenset[str],
    rank: dict[str, int],
) -> bool:
    """True when the event must not apply over the stored state (not older than it):

    - an event of the same version as the stored state applies only when its status ranks
      at least as high (``rank``, 0 for a status not in it): of two events of the same
      instant, the higher-ranked status wins whatever the order they are processed in;
    - an event whose version is ours (undated: the signed timestamp or the receive time)
      never moves the object out of one of the ``final`` states. A dated event newer than
      the stored state still can."""
    if ctx.version == stored_version and rank.get(status, 0) < rank.get(stored_status, 0):
        return True
    return ctx.version_is_ours and stored_status in final and status not in final


def _uuid_or_fail(value: Any, what: str) -> uuid.UUID:
    result = as_uuid(value)
    if result is None:
        raise EventDataError(f"data.{what} is not a UUID: {str(value)[:80]!r}")
    return result


def _amount(value: Any) -> Decimal | None:
    """The ``amount`` as stored (``None`` when absent); ``RemoteDataError`` when it cannot be
    read as one (``"lots"``, ``true``, ``1e300``: more than the column holds), never "no
    amount": reporting sums the amounts."""
    if value is None:
        return None
    dec = None
    if not isinstance(value, bool):
        try:
            dec = Decimal(str(value))
        except (InvalidOperation, ValueError):
            dec = None
    if dec is None or not dec.is_finite() or abs(dec) >= Decimal(10) ** 15:
        raise RemoteDataError("amount", value, "not an amount")
    return dec.quantize(Decimal("0.0001"))


def _currency(value: Any) -> str:
    return currencies.label(value)[:8]


def _known_currency(value: Any) -> str:
    """A payment's currency code (``""`` when absent); ``RemoteDataError`` when it is not a
    currency of ``BILLING['CURRENCIES']`` (an id or a code): a payment in an unknown currency
    cannot be counted."""
    if value in (None, ""):
        return ""
    try:
        return currencies.currency_code(value)
    except BillingConfigurationError:
        raise RemoteDataError(
            "currency", value, "not a currency of BILLING['CURRENCIES']"
        ) from None


def changed(remote_id: Any, stored_remote_id: Any, fk: Any) -> bool:
    """A link must be (re)resolved: the remote id differs, or it is set but not linked."""
    return remote_id != stored_remote_id or (remote_id is not None and fk is None)


def _text(value: Any, limit: int) -> str:
    if value is None:
        return ""
    return str(value).replace("\x00", "")[:limit]


class EventHandler:
    """Base class of every handler. Override ``handle``."""

    #: The local object kind the handler changes, for the signals (``subscription``, ...).
    object_name: ClassVar[str] = ""

    def __init__(self, event_type: str) -> None:
        self.event_type = event_type

    def handle(self, ctx: EventContext) -> HandlerResult:
        raise NotImplementedError

    # Helpers for subclasses -----------------------------------------------------------------
    @staticmethod
    def customer_id(
        ctx: EventContext, remote_id: uuid.UUID | None, *, pull: bool = True
    ) -> int | None:
        """The local id of a customer; asks for a pull (once) when it is not known."""
        if remote_id is None:
            return None
        pk = Customer.objects.filter(remote_id=remote_id).values_list("pk", flat=True).first()
        if pk is None and pull and ctx.may_pull("customer", remote_id):
            raise PullRequired("customer", remote_id)
        return pk

    @staticmethod
    def product_id(remote_id: uuid.UUID | None) -> int | None:
        if remote_id is None:
            return None
        return Product.objects.filter(remote_id=remote_id).values_list("pk", flat=True).first()


# --- subscriptions ---------------------------------------------------------------------------

#: Model field -> key in the resource, for the fields the mapping fills from another key.
_SUBSCRIPTION_SOURCE = {
    "remote_id": "id",
    "remote_created": "date_created",
    "remote_updated": "date_updated",
    "remote_user_created": "user_created",
    "remote_user_updated": "user_updated",
    "product_remote_id": "product",
    "customer_remote_id": "customer",
}


class SubscriptionHandler(EventHandler):
    """``subscription.*``: the data is the Subscription resource after the change.

    Renewal moves the cycle dates and the next billing date; canceled and paused set the
    status. A subscription not known locally is created from the data (after pulling its
    customer if that is unknown too).
    """

    object_name = "subscription"
    #: The status the event type implies (None: take ``data.status``).
    STATUS_FOR_TYPE: ClassVar[dict[str, str]] = {
        types.SUBSCRIPTION_CANCELED: "canceled",
        types.SUBSCRIPTION_PAUSED: "paused",
    }
    #: Of two events with the same version, the one whose status ranks higher wins, in any
    #: order (0 for any other status): a cancel over a pause over anything else.
    SAME_VERSION_RANK: ClassVar[dict[str, int]] = {"paused": 1, "canceled": 2}
    #: States an undated event (a version of ours) never moves a subscription out of.
    FINAL: ClassVar[frozenset[str]] = frozenset({"canceled"})

    def fields(self, ctx: EventContext) -> dict[str, Any]:
        mapped = subscription_mapping.from_remote(ctx.data)
        values = {
            name: value
            for name, value in mapped.items()
            if name == "remote_data" or _SUBSCRIPTION_SOURCE.get(name, name) in ctx.data
        }
        status = self.STATUS_FOR_TYPE.get(self.event_type)
        if status:
            values["status"] = status
        # The event's version (its date_updated when it has one): never None, and never
        # older than the stored one (an older event is skipped before this is saved).
        values["remote_updated"] = ctx.version
        values["remote_updated_ours"] = ctx.version_is_ours
        return values

    def is_stale(self, ctx: EventContext, subscription: Subscription, status: str) -> bool:
        """Older than the stored state, or held off by its final state (``leaves_final``)."""
        return is_older(ctx.version, subscription.remote_updated) or leaves_final(
            ctx,
            subscription.status,
            subscription.remote_updated,
            status,
            final=self.FINAL,
            rank=self.SAME_VERSION_RANK,
        )

    def handle(self, ctx: EventContext) -> HandlerResult:
        remote_id = _uuid_or_fail(ctx.data.get("id"), "id")
        subscription = _locked(Subscription.objects.filter(remote_id=remote_id)).first()
        values = self.fields(ctx)  # before the age check: bad data fails even a stale event
        if subscription is not None and self.is_stale(
            ctx, subscription, values.get("status", subscription.status)
        ):
            return HandlerResult("stale", {"subscription": subscription})
        new = subscription is None
        if new:
            subscription = Subscription(
                remote_id=remote_id, sync_state="synced", last_synced_at=timezone.now()
            )
        customer_rid = values.get("customer_remote_id", subscription.customer_remote_id)
        product_rid = values.get("product_remote_id", subscription.product_remote_id)
        if customer_rid != subscription.customer_remote_id or (
            customer_rid and subscription.customer_id is None
        ):
            subscription.customer_id = self.customer_id(ctx, customer_rid)
        if product_rid != subscription.product_remote_id or (
            product_rid and subscription.product_id is None
        ):
            subscription.product_id = self.product_id(product_rid)
        for name, value in values.items():
            setattr(subscription, name, value)
        with from_remote():
            subscription.save()
        return HandlerResult("applied", {"subscription": subscription})


# --- records (invoices, payments, refunds) ----------------------------------------------------


class RecordHandler(EventHandler):
    """Upsert of an ``Invoice``/``Payment``/``Refund`` from the event's data."""

    model: ClassVar[type[models.Model]]
    #: Canonical type -> the status it implies; it wins over ``data.status``.
    STATUS_FOR_TYPE: ClassVar[dict[str, str]] = {}
    #: Statuses that an event at the same instant never moves away from.
    TERMINAL: ClassVar[frozenset[str]] = frozenset()
    #: Statuses that an undated event (a version of ours) never moves away from (``None``:
    #: the ``TERMINAL`` ones).
    FINAL: ClassVar[frozenset[str] | None] = None

    def status(self, ctx: EventContext) -> str:
        given = ctx.data.get("status")
        implied = self.STATUS_FOR_TYPE.get(self.event_type, "")
        if implied:
            return implied
        return _text(given, 32)

    def lock_related(self, ctx: EventContext) -> dict[str, Any]:
        """Lock rows this event also changes, before the record (override)."""
        return {}

    def common_fields(self, ctx: EventContext) -> dict[str, Any]:
        data = ctx.data
        return {
            "status": self.status(ctx),
            "amount": _amount(data.get("amount")),
            "currency": _currency(data.get("currency")),
            "customer_remote_id": as_uuid(data.get("customer")),
            "subscription_remote_id": as_uuid(data.get("subscription")),
            "remote_created": ts(data.get("date_created"), "date_created"),
            "remote_updated": ctx.version,
            "remote_data": data,
        }

    def extra_fields(self, ctx: EventContext) -> dict[str, Any]:
        return {}

    def resolve_links(
        self, ctx: EventContext, record: Any, values: dict[str, Any], related: dict[str, Any]
    ) -> None:
        """Set the foreign keys from the remote ids, querying only when they changed."""
        subscription: Any = related.get("subscription")
        sub_rid = values["subscription_remote_id"]
        needs_lookup = changed(sub_rid, record.subscription_remote_id, record.subscription_id) or (
            changed(values["customer_remote_id"], record.customer_remote_id, record.customer_id)
            or changed(
                values.get("product_remote_id"),
                getattr(record, "product_remote_id", None),
                getattr(record, "product_id", None),
            )
        )
        if subscription is None and sub_rid and needs_lookup:
            # One query gives the subscription and, through it, its customer and product.
            row = (
                Subscription.objects.filter(remote_id=sub_rid)
                .values(
                    "pk",
                    "remote_id",
                    "customer_id",
                    "customer_remote_id",
                    "product_id",
                    "product_remote_id",
                )
                .order_by()[:1]
            )
            subscription = SimpleNamespace(**row[0]) if row else None
        if changed(sub_rid, record.subscription_remote_id, record.subscription_id):
            if subscription is not None and subscription.remote_id == sub_rid:
                record.subscription_id = subscription.pk
            else:
                record.subscription_id = None
        cust_rid = values["customer_remote_id"]
        if cust_rid != record.customer_remote_id or (cust_rid and record.customer_id is None):
            if (
                subscription is not None
                and subscription.customer_remote_id == cust_rid
                and subscription.customer_id is not None
            ):
                record.customer_id = subscription.customer_id
            else:
                record.customer_id = self.customer_id(ctx, cust_rid)
        if hasattr(record, "product_remote_id"):
            prod_rid = values.get("product_remote_id")
            if prod_rid != record.product_remote_id or (prod_rid and record.product_id is None):
                if subscription is not None and subscription.product_remote_id == prod_rid:
                    record.product_id = subscription.product_id
                else:
                    record.product_id = self.product_id(prod_rid)

    def is_stale(self, ctx: EventContext, record: Any, status: str) -> bool:
        """Older than the stored state, or held off by its final state (``leaves_final``)."""
        return is_older(ctx.version, record.remote_updated) or leaves_final(
            ctx,
            record.status,
            record.remote_updated,
            status,
            final=self.TERMINAL if self.FINAL is None else self.FINAL,
            rank=dict.fromkeys(self.TERMINAL, 1),
        )

    def after_save(self, ctx: EventContext, record: Any, related: dict[str, Any]) -> None:
        """Hook: further changes in the same transaction (override)."""

    def handle(self, ctx: EventContext) -> HandlerResult:
        remote_id = _uuid_or_fail(ctx.data.get("id"), "id")
        related = self.lock_related(ctx)
        name = self.object_name
        record = _locked(self.model.objects.filter(remote_id=remote_id)).first()
        values = {**self.common_fields(ctx), **self.extra_fields(ctx)}
        if record is not None and self.is_stale(ctx, record, values["status"]):
            return HandlerResult("stale", {name: record, **related})
        if record is None:
            record = self.model(remote_id=remote_id)
        self.resolve_links(ctx, record, values, related)
        for key, value in values.items():
            setattr(record, key, value)
        record.save()
        self.after_save(ctx, record, related)
        return HandlerResult("applied", {name: record, **related})


class InvoiceHandler(RecordHandler):
    """``invoice.*``: sets the invoice paid / void / uncollectable / deleted."""

    model = Invoice
    object_name = "invoice"
    STATUS_FOR_TYPE: ClassVar[dict[str, str]] = {
        types.INVOICE_PAID: "paid",
        types.INVOICE_VOIDED: "void",
        types.INVOICE_MARKED_UNCOLLECTABLE: "uncollectable",
        types.INVOICE_DELETED: "deleted",
    }
    TERMINAL = frozenset({"deleted"})
    FINAL = frozenset({"deleted", "void", "uncollectable"})

    def extra_fields(self, ctx: EventContext) -> dict[str, Any]:
        return {
            "product_remote_id": as_uuid(ctx.data.get("product")),
            "period_start": ts(ctx.data.get("period_start"), "period_start"),
            "period_end": ts(ctx.data.get("period_end"), "period_end"),
        }


class PaymentHandler(RecordHandler):
    """``payment.*``: records the payment and updates the subscription's
    ``last_payment_status`` (a failed payment shows there) to the status of its most recent
    payment. A subscription not known locally is pulled from the API first (once) - this is
    how a subscription created through checkout appears locally."""

    model = Payment
    object_name = "payment"
    STATUS_FOR_TYPE: ClassVar[dict[str, str]] = {
        types.PAYMENT_COMPLETED: "completed",
        types.PAYMENT_FAILED: "failed",
        types.PAYMENT_CANCELED: "canceled",
    }

    def lock_related(self, ctx: EventContext) -> dict[str, Any]:
        sub_rid = as_uuid(ctx.data.get("subscription"))
        if sub_rid is None:
            return {}
        subscription = _locked(Subscription.objects.filter(remote_id=sub_rid)).first()
        if subscription is None:
            if ctx.may_pull("subscription", sub_rid):
                raise PullRequired(
                    "subscription", sub_rid, customer=as_uuid(ctx.data.get("customer"))
                )
            return {}
        return {"subscription": subscription}

    def extra_fields(self, ctx: EventContext) -> dict[str, Any]:
        return {
            "product_remote_id": as_uuid(ctx.data.get("product")),
            "invoice_remote_id": as_uuid(ctx.data.get("invoice")),
            "currency": _known_currency(ctx.data.get("currency")),
            "failure_reason": _text(ctx.data.get("failure_reason"), 64),
        }

    def after_save(self, ctx: EventContext, record: Any, related: dict[str, Any]) -> None:
        subscription = related.get("subscription")
        if subscription is None or record.subscription_id != subscription.pk:
            return
        newer = Payment.objects.filter(
            subscription_id=subscription.pk, remote_updated__gt=record.remote_updated
        )
        if record.remote_updated is None:
            newer = Payment.objects.filter(subscription_id=subscription.pk).exclude(pk=record.pk)
        updated = (
            Subscription.objects.filter(pk=subscription.pk)
            .exclude(Exists(newer.filter(subscription_id=OuterRef("pk"))))
            .update(last_payment_status=record.status)
        )
        if updated:
            subscription.last_payment_status = record.status


class RefundHandler(RecordHandler):
    """``refund.*``: moves a refund through initiated -> approved / rejected."""

    model = Refund
    object_name = "refund"
    STATUS_FOR_TYPE: ClassVar[dict[str, str]] = {
        types.REFUND_INITIATED: "initiated",
        types.REFUND_APPROVED: "approved",
        types.REFUND_REJECTED: "rejected",
    }
    TERMINAL = frozenset({"approved", "rejected"})

    def extra_fields(self, ctx: EventContext) -> dict[str, Any]:
        return {
            "payment_remote_id": as_uuid(ctx.data.get("payment")),
            "reason": _text(ctx.data.get("reason"), 255),
        }

    def resolve_links(
        self, ctx: EventContext, record: Any, values: dict[str, Any], related: dict[str, Any]
    ) -> None:
        pay_rid = values["payment_remote_id"]
        if pay_rid != record.payment_remote_id or (pay_rid and record.payment_id is None):
            row = (
                Payment.objects.filter(remote_id=pay_rid)
                .values(
                    "pk",
                    "subscription_id",
                    "subscription_remote_id",
                    "customer_id",
                    "customer_remote_id",
                )
                .first()
                if pay_rid
                else None
            )
            record.payment_id = row["pk"] if row else None
            if row:
                # The payment already knows the subscription and customer: no more lookups.
                if row["subscription_remote_id"] == values["subscription_remote_id"]:
                    record.subscription_remote_id = values["subscription_remote_id"]
                    record.subscription_id = row["subscription_id"]
                if row["customer_remote_id"] == values["customer_remote_id"] and row["customer_id"]:
                    record.customer_remote_id = values["customer_remote_id"]
                    record.customer_id = row["customer_id"]
        super().resolve_links(ctx, record, values, related)


# --- the table -------------------------------------------------------------------------------

#: Canonical type -> handler class. ``BILLING['EVENT_HANDLERS']`` overrides or extends it.
HANDLERS: dict[str, type[EventHandler]] = {
    types.SUBSCRIPTION_RENEWAL: SubscriptionHandler,
    types.SUBSCRIPTION_CANCELED: SubscriptionHandler,
    types.SUBSCRIPTION_PAUSED: SubscriptionHandler,
    types.PAYMENT_COMPLETED: PaymentHandler,
    types.PAYMENT_FAILED: PaymentHandler,
    types.PAYMENT_CANCELED: PaymentHandler,
    types.REFUND_INITIATED: RefundHandler,
    types.REFUND_APPROVED: RefundHandler,
    types.REFUND_REJECTED: RefundHandler,
    types.INVOICE_PAID: InvoiceHandler,
    types.INVOICE_VOIDED: InvoiceHandler,
    types.INVOICE_MARKED_UNCOLLECTABLE: InvoiceHandler,
    types.INVOICE_DELETED: InvoiceHandler,
}


def get_handler(event_type: str) -> EventHandler | None:
    """The handler for a canonical type (settings first), or None if there is none."""
    if not event_type:
        return None
    configured = billing_settings.get("EVENT_HANDLERS") or {}
    target: Any = configured.get(event_type) or HANDLERS.get(event_type)
    if target is None:
        return None
    if isinstance(target, str):
        try:
            target = import_string(target)
        except ImportError as exc:
            raise BillingConfigurationError(
                f"BILLING['EVENT_HANDLERS'][{event_type!r}] cannot be imported: {exc}",
                setting="BILLING['EVENT_HANDLERS']",
            ) from exc
    return target(event_type)
