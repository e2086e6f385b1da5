"""Checkout sessions, created synchronously by the checkout view (the redirect needs the id)."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from .base import RemoteObject
from .customers import Customer
from .products import Product

__all__ = ["CheckoutSession"]


class CheckoutSession(RemoteObject):
    customer = models.ForeignKey(
        Customer, on_delete=models.SET_NULL, null=True, blank=True, related_name="checkout_sessions"
    )
    product = models.ForeignKey(
        Product, on_delete=models.PROTECT, null=True, blank=True, related_name="checkout_sessions"
    )
    status = models.CharField(_("status"), max_length=32, blank=True, default="")
    expires_at = models.DateTimeField(null=True, blank=True)
    action = models.CharField(max_length=32, default="new_subscription")
    completed_at = models.DateTimeField(null=True, blank=True)
    selected_billing_cycle = models.CharField(max_length=32, blank=True, default="")
    selected_currency = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("The service's integer currency id.")
    )
    upgrade_to = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    downgrade_to = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    #: Set by ``start_checkout``: True when an earlier identical request's open session is returned.
    reused = False

    class Meta:
        ordering = ["-created_at", "pk"]
        verbose_name = _("checkout session")
        verbose_name_plural = _("checkout sessions")

    def __str__(self) -> str:
        return f"checkout {self.remote_id or self.pk} ({self.status or 'new'})"
