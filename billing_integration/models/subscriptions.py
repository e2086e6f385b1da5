"""Subscriptions. Their state is owned by the service (events, pulls); a local
``Subscription`` without ``remote_id`` is created remotely once through ``POST /subscriptions``.

``Subscription.objects.active()`` — the documented rule: a subscription is active when its
``status`` is not one of ``INACTIVE_STATUSES`` (``canceled``, ``cancelled``, ``paused``,
``ended``, ``expired``, and ``detached``: a subscription of a former service, see
``billing_integration.service.reset_mirror``) and either its ``cycle_end_date`` is null or
in the future, or its ``trial_end_date`` is in the future (in trial).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import Q
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .base import RemoteObject
from .customers import Customer
from .products import Product

__all__ = ["INACTIVE_STATUSES", "Subscription", "SubscriptionQuerySet"]

INACTIVE_STATUSES = ("canceled", "cancelled", "paused", "ended", "expired", "detached")


class SubscriptionQuerySet(models.QuerySet):
    def active(self, at: datetime | None = None) -> SubscriptionQuerySet:
        """Subscriptions that currently grant access (see the module docstring)."""
        now = at or timezone.now()
        return self.exclude(status__in=INACTIVE_STATUSES).filter(
            Q(cycle_end_date__isnull=True)
            | Q(cycle_end_date__gt=now)
            | Q(trial_end_date__gt=now)
        )

    def inactive(self, at: datetime | None = None) -> SubscriptionQuerySet:
        return self.exclude(pk__in=self.active(at).values("pk"))

    def for_subscriber(self, subscriber: Any) -> SubscriptionQuerySet:
        """Subscriptions of the customer linked to ``subscriber`` (a user, team, ...)."""
        return self.filter(customer__subscriber=subscriber)

    def for_customer(self, customer: Customer) -> SubscriptionQuerySet:
        return self.filter(customer=customer)

    def for_product(self, product: Product) -> SubscriptionQuerySet:
        return self.filter(product=product)

    def in_trial(self, at: datetime | None = None) -> SubscriptionQuerySet:
        return self.filter(trial_end_date__gt=at or timezone.now())


class Subscription(RemoteObject):
    product = models.ForeignKey(
        Product, on_delete=models.PROTECT, null=True, blank=True, related_name="subscriptions"
    )
    customer = models.ForeignKey(
        Customer, on_delete=models.SET_NULL, null=True, blank=True, related_name="subscriptions"
    )
    # The remote references as received, kept even when the local row is not known (yet).
    product_remote_id = models.UUIDField(null=True, blank=True, db_index=True)
    customer_remote_id = models.UUIDField(null=True, blank=True, db_index=True)
    status = models.CharField(_("status"), max_length=32, blank=True, default="")
    cycle_start_date = models.DateTimeField(null=True, blank=True)
    cycle_end_date = models.DateTimeField(null=True, blank=True)
    next_billing_date = models.DateTimeField(null=True, blank=True)
    auto_renew = models.BooleanField(default=True)
    trial_end_date = models.DateTimeField(null=True, blank=True)
    selected_billing_cycle = models.CharField(max_length=32, blank=True, default="")
    selected_currency = models.CharField(
        max_length=8, blank=True, default="", help_text=_("Currency code, e.g. XOF.")
    )
    last_payment_status = models.CharField(max_length=16, null=True, blank=True)  # noqa: DJ001

    objects = SubscriptionQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "pk"]
        verbose_name = _("subscription")
        verbose_name_plural = _("subscriptions")
        # Reporting (billing_integration.reporting.metrics): when a subscription started
        # (also PostgreSQL statistics on that expression, for the plans); two small partial
        # ones: trials ending in the period, and the customers whose last payment failed (at
        # risk), including what ``active()`` reads (INCLUDE is PostgreSQL only).
        indexes = [
            models.Index(Coalesce("remote_created", "created_at"),
                         name="subscription_started"),
            models.Index(
                fields=["trial_end_date"], condition=Q(trial_end_date__isnull=False),
                name="subscription_trial_end",
            ),
            models.Index(
                fields=["customer"],
                include=["status", "cycle_end_date", "trial_end_date", "product",
                         "selected_currency"],
                condition=Q(last_payment_status="failed"),
                name="subscription_failed_payment",
            ),
        ]

    def __str__(self) -> str:
        product = self.product or self.product_remote_id
        return f"{product} for {self.customer or self.customer_remote_id}"

    @property
    def is_active(self) -> bool:
        now = timezone.now()
        if self.status in INACTIVE_STATUSES:
            return False
        return (
            self.cycle_end_date is None
            or self.cycle_end_date > now
            or (self.trial_end_date is not None and self.trial_end_date > now)
        )
