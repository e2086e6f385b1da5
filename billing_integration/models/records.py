"""Invoices, payments and refunds: read-only local records of what events say.

The service has no API for them; they are known only from events. Each keeps the raw remote
ids of the objects it names (``customer_remote_id``, ...) and, where that object is known
locally, a foreign key to it. ``remote_data`` is the last ``data`` seen; ``remote_updated``
its ``date_updated`` (an older event never overwrites a newer one).
"""

from __future__ import annotations

from django.db import models
from django.db.models import F
from django.db.models.functions import Coalesce, Upper
from django.utils.translation import gettext_lazy as _

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


class EventRecord(models.Model):
    """Fields common to the three records (abstract)."""

    remote_id = models.UUIDField(_("remote id"), unique=True, editable=False)
    status = models.CharField(_("status"), max_length=32, blank=True, default="", db_index=True)
    amount = models.DecimalField(
        _("amount"), max_digits=20, decimal_places=4, null=True, blank=True, editable=False
    )
    currency = models.CharField(_("currency"), max_length=8, blank=True, default="", editable=False)

    customer = models.ForeignKey(
        "billing_integration.Customer",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="%(class)ss",
        editable=False,
    )
    subscription = models.ForeignKey(
        "billing_integration.Subscription",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="%(class)ss",
        editable=False,
    )
    customer_remote_id = models.UUIDField(null=True, blank=True, editable=False)
    subscription_remote_id = models.UUIDField(null=True, blank=True, editable=False)

    remote_created = models.DateTimeField(null=True, blank=True, editable=False)
    remote_updated = models.DateTimeField(null=True, blank=True, editable=False)
    remote_data = models.JSONField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{type(self).__name__} {self.remote_id} {self.status}"


class Invoice(EventRecord):
    status = models.CharField(
        _("status"),
        max_length=32,
        blank=True,
        default="",
        choices=InvoiceStatus.choices,
        db_index=True,
    )
    product = models.ForeignKey(
        "billing_integration.Product",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="invoices",
        editable=False,
    )
    product_remote_id = models.UUIDField(null=True, blank=True, editable=False)
    period_start = models.DateTimeField(null=True, blank=True, editable=False)
    period_end = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        verbose_name = _("invoice")
        verbose_name_plural = _("invoices")
        ordering = ("-remote_created", "-id")


class Payment(EventRecord):
    status = models.CharField(
        _("status"),
        max_length=32,
        blank=True,
        default="",
        choices=PaymentStatus.choices,
        db_index=True,
    )
    product = models.ForeignKey(
        "billing_integration.Product",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="payments",
        editable=False,
    )
    product_remote_id = models.UUIDField(null=True, blank=True, editable=False)
    invoice_remote_id = models.UUIDField(null=True, blank=True, editable=False)
    failure_reason = models.CharField(max_length=64, blank=True, default="", editable=False)

    class Meta:
        verbose_name = _("payment")
        verbose_name_plural = _("payments")
        ordering = ("-remote_created", "-id")
        # Reporting (billing_integration.reporting.metrics); INCLUDE is PostgreSQL only, so
        # that it answers the dashboard's two payment aggregates with index-only scans
        # (which also return the indexed UPPER(currency) instead of computing it per row).
        indexes = [
            # payment_history: one range of COALESCE(remote_created, created_at) per month
            # (also gives PostgreSQL statistics on that expression).
            models.Index(
                Coalesce("remote_created", "created_at"),
                Upper("currency"),
                include=["product", "status", "amount", "currency", "remote_created", "created_at"],
                name="payment_at_code_covering",
            ),
            # customer_summary: the ranking by lifetime paid, completed payments only.
            models.Index(
                F("customer"),
                Upper("currency"),
                include=["amount", "currency", "product", "remote_created", "created_at"],
                condition=models.Q(
                    status="completed", amount__isnull=False, customer__isnull=False
                ),
                name="payment_paid_covering",
            ),
            # customer_summary: every figure of a customer and currency (the listed
            # customers of the dashboard; every customer for the CSV export).
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
    status = models.CharField(
        _("status"),
        max_length=32,
        blank=True,
        default="",
        choices=RefundStatus.choices,
        db_index=True,
    )
    payment = models.ForeignKey(
        Payment,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="refunds",
        editable=False,
    )
    payment_remote_id = models.UUIDField(null=True, blank=True, editable=False)
    reason = models.CharField(max_length=255, blank=True, default="", editable=False)

    class Meta:
        verbose_name = _("refund")
        verbose_name_plural = _("refunds")
        ordering = ("-remote_created", "-id")
