"""Customers: the billing side of a subscriber (``BILLING['SUBSCRIBER_MODEL']``, a user by
default)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from .base import RemoteObject

__all__ = ["Customer"]


def subscriber_model_label() -> str:
    """``app_label.ModelName`` of the subscriber model (``BILLING['SUBSCRIBER_MODEL']``)."""
    billing = getattr(settings, "BILLING", None)
    if not isinstance(billing, dict):  # the models load before E000 can say so (same below)
        return settings.AUTH_USER_MODEL
    label = billing.get("SUBSCRIBER_MODEL")
    return label if isinstance(label, str) and label else settings.AUTH_USER_MODEL


class Customer(RemoteObject):
    subscriber = models.OneToOneField(
        subscriber_model_label(),
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="billing_customer",
    )
    identifier = models.CharField(_("identifier"), max_length=255, db_index=True)
    first_name = models.CharField(_("first name"), max_length=150, blank=True, default="")
    last_name = models.CharField(_("last name"), max_length=150, blank=True, default="")
    email = models.EmailField(_("email"), blank=True, default="")
    # Read-only: set by the service, never accepted on creation.
    address_line_1 = models.CharField(max_length=255, null=True, blank=True, editable=False)  # noqa: DJ001
    address_line_2 = models.CharField(max_length=255, null=True, blank=True, editable=False)  # noqa: DJ001
    phone = models.CharField(max_length=64, null=True, blank=True, editable=False)  # noqa: DJ001
    status = models.CharField(max_length=32, blank=True, default="", editable=False)

    class Meta:
        ordering = ["identifier", "pk"]
        verbose_name = _("customer")
        verbose_name_plural = _("customers")

    def __str__(self) -> str:
        name = f"{self.first_name} {self.last_name}".strip()
        return f"{name} ({self.identifier})" if name else self.identifier
