"""Invoices, payments and refunds: read-only records of what events say (the service has
no API for them), with the remote ids they name and a foreign key where known here."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from django.db import models, router, transaction
from django.db.models import Case, Exists, F, OuterRef, Subquery, Value, When
from django.db.models.functions import Coalesce, Upper
from django.utils.translation import gettext_lazy as _

from .base import trusted_until
from .customers import Customer
from .products import Product
from .reports import touch_reports
from .subscriptions import Subscription

__all__ = ["Invoice", "InvoiceStatus", "Payment", "PaymentStatus", "Refund", "RefundStatus"]


class InvoiceStatus(models.TextChoices):
    PAID = "paid", _("Paid")
    VOID = "void", _("Void")
    UNCOLLECTABLE = "uncollectable", _("Uncollectable")
    DELETED = "deleted", _("Deleted")


class PaymentStatus(models.TextChoices):
    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
    CANCELED = "canceled", _("Canceled")


class RefundStatus(models.TextChoices):
    INITIATED = "initiated", _("Initiated")
    APPROVED = "approved", _("Approved")
    REJECTED = "rejected", _("Rejected")


def _status(choices: Any = None) -> models.CharField[Any, Any]:
    return models.CharField(
        _("status"), max_length=32, blank=True, default="", choices=choices, db_index=True
    )


def _link(to: Any, related_name: str) -> models.ForeignKey[Any, Any]:
    """A read-only link to a local row, when it is known here."""
    return models.ForeignKey(
        to, models.SET_NULL, null=True, blank=True, related_name=related_name, editable=False
    )


def _remote_ref() -> models.UUIDField[Any, Any]:
    return models.UUIDField(null=True, blank=True, editable=False)


class EventRecord(models.Model):
    """Fields common to the three records (abstract)."""

    remote_id = models.UUIDField(_("remote id"), unique=True, editable=False)
    status = _status()
    amount = models.DecimalField(
        _("amount"), max_digits=20, decimal_places=4, null=True, blank=True, editable=False
    )
    currency = models.CharField(_("currency"), max_length=8, blank=True, default="", editable=False)

    customer = _link("billing_integration.Customer", "%(class)ss")
    subscription = _link("billing_integration.Subscription", "%(class)ss")
    customer_remote_id = _remote_ref()
    subscription_remote_id = _remote_ref()

    remote_created = models.DateTimeField(null=True, blank=True, editable=False)
    remote_updated = models.DateTimeField(null=True, blank=True, editable=False)
    remote_data = models.JSONField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True
        ordering = ("-remote_created", "-id")

    def __str__(self) -> str:
        return f"{type(self).__name__} {self.remote_id} {self.status}"


class Invoice(EventRecord):
    status = _status(InvoiceStatus.choices)
    product = _link("billing_integration.Product", "invoices")
    product_remote_id = _remote_ref()
    period_start = models.DateTimeField(null=True, blank=True, editable=False)
    period_end = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta(EventRecord.Meta):
        verbose_name = _("invoice")
        verbose_name_plural = _("invoices")


class Payment(EventRecord):
    status = _status(PaymentStatus.choices)
    product = _link("billing_integration.Product", "payments")
    product_remote_id = _remote_ref()
    invoice_remote_id = _remote_ref()
    failure_reason = models.CharField(max_length=64, blank=True, default="", editable=False)

    class Meta(EventRecord.Meta):
        verbose_name = _("payment")
        verbose_name_plural = _("payments")
        # For reporting.metrics (index-only scans on PostgreSQL).
        indexes = [
            models.Index(
                Coalesce("remote_created", "created_at"),
                Upper("currency"),
                include=["product", "status", "amount", "currency", "remote_created", "created_at"],
                name="payment_at_code_covering",
            ),
            models.Index(
                F("customer"),
                Upper("currency"),
                include=["amount", "currency", "product", "remote_created", "created_at"],
                condition=models.Q(
                    status="completed", amount__isnull=False, customer__isnull=False
                ),
                name="payment_paid_covering",
            ),
            models.Index(
                F("customer"),
                Upper("currency"),
                include=["currency", "status", "amount", "remote_created", "created_at"],
                name="payment_customer_covering",
            ),
        ]

    @property
    def invoice(self) -> Invoice | None:
        """The invoice this payment settles, if it is known locally."""
        if self.invoice_remote_id is None:
            return None
        return Invoice.objects.filter(remote_id=self.invoice_remote_id).first()


class Refund(EventRecord):
    status = _status(RefundStatus.choices)
    payment = _link(Payment, "refunds")
    payment_remote_id = _remote_ref()
    reason = models.CharField(max_length=255, blank=True, default="", editable=False)

    class Meta(EventRecord.Meta):
        verbose_name = _("refund")
        verbose_name_plural = _("refunds")
        # reporting: the refunds of a month, and of the current month since the last refresh
        indexes = [models.Index(Coalesce("remote_created", "created_at"), name="refund_at")]


def of_customer(customer: Customer) -> models.Q:
    """A record (payment, invoice, refund) of ``customer``: linked to its row, or naming its
    remote id while not linked yet (``=None`` would match every unlinked record)."""
    mine = models.Q(customer=customer)
    return mine | models.Q(customer_remote_id=customer.remote_id) if customer.remote_id else mine


def of_product(product: Any) -> models.Q:
    """A record of ``product``: linked to its row, or naming its remote id while not linked."""
    its = models.Q(product=product)
    return its | models.Q(product_remote_id=product.remote_id) if product.remote_id else its


def show_newest_payment(
    subscriptions: models.QuerySet[Subscription], payment: Payment | None = None
) -> int:
    """Set the ``last_payment_status`` of those of ``subscriptions`` that have payments to
    the status of their newest (``remote_updated``; one beyond ``trusted_until()``, a clock
    ahead, after every other; of equals, the last stored) payment, only where that is
    ``payment`` if given; returns how many rows were updated (one statement)."""
    payments = Payment.objects.filter(subscription=OuterRef("pk"))
    ahead = Case(When(remote_updated__gt=trusted_until(), then=Value(1)), default=Value(0))
    newest = payments.order_by(ahead, "-remote_updated", "-updated_at", "-pk")
    if payment is not None:
        subscriptions = subscriptions.alias(newest=Subquery(newest.values("pk")[:1]))
        subscriptions = subscriptions.filter(newest=payment.pk)
    status = Subquery(newest.values("status")[:1])
    return subscriptions.filter(Exists(payments)).update(last_payment_status=status)


def link_waiting(model: type[models.Model], remote_ids: Iterable[Any]) -> None:
    """Link what named these subscriptions, customers, products or payments (``model``)
    before they were known here, once the current transaction commits (at once outside
    one): the foreign key of the subscriptions and records whose ``<name>_remote_id`` is one
    of ``remote_ids``, whose key is null and whose object is stored here, one UPDATE per
    model (in the handlers' lock order); the reporting rollups are told, and a subscription
    that got payments shows the newest one's status, as if they had arrived after it.

    Asked for by what stores such an object and by what stores a record naming one it does
    not find: neither sees the other's row before it is committed, and whichever commits last
    links both."""
    ids = [rid for rid in remote_ids if rid is not None]
    if ids:
        link = functools.partial(_link_waiting, model, ids)
        transaction.on_commit(link, using=router.db_for_write(model))


def link_all_waiting() -> None:
    """Link every subscription and record still waiting for an object stored here (a link
    ``link_waiting`` could not make after its commit, say): the periodic pull's last step.
    Reads the rows whose foreign key is null and whose object is stored, one query per link."""
    for model in (Customer, Product, Subscription, Payment):
        name = model._meta.model_name
        local = model._default_manager.filter(remote_id=OuterRef(f"{name}_remote_id"))
        ids: set[Any] = set()
        for referrer in _referrers(name):
            waiting = referrer._default_manager.filter(Exists(local), **{f"{name}__isnull": True})
            ids.update(waiting.values_list(f"{name}_remote_id", flat=True))
        if ids:
            _link_waiting(model, list(ids))


def _referrers(name: str | None) -> list[type[models.Model]]:
    """The models naming a ``name`` (``customer``, ...) by its remote id."""
    models_ = (Subscription, Invoice, Payment, Refund)
    return [m for m in models_ if hasattr(m, f"{name}_remote_id")]


def _link_waiting(model: type[models.Model], ids: list[Any]) -> None:
    name = model._meta.model_name
    local = model._default_manager.filter(remote_id=OuterRef(f"{name}_remote_id"))
    for referrer in _referrers(name):
        named = referrer._default_manager.filter(**{f"{name}_remote_id__in": ids})
        waiting = named.filter(Exists(local), **{f"{name}__isnull": True})
        if not waiting.update(**{f"{name}_id": Subquery(local.values("pk")[:1])}):
            continue
        if referrer is not Invoice:  # touch_reports reads subscriptions, payments, refunds
            touch_reports(named)
        if referrer is Payment and model is Subscription:
            show_newest_payment(Subscription.objects.filter(remote_id__in=ids))
