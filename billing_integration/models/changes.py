"""Plan changes and stops of renewal a subscriber asked for (``ChangeRequest``), and the guesses
about the service that a refusal switched off (``SwitchedOffGuess``). The service's word (an
event or a pull of the subscription) is the only proof a request took effect."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from .customers import Customer
from .products import Product
from .subscriptions import CheckoutSession, Subscription

__all__ = ["ChangeKind", "ChangeRequest", "ChangeState", "ChangeVia", "SwitchedOffGuess"]


class ChangeKind(models.TextChoices):
    CHANGE_PLAN = "change_plan", _("Change plan")
    STOP_RENEWAL = "stop_renewal", _("Stop renewal")
    RESUME = "resume", _("Resume renewal")


class ChangeVia(models.TextChoices):
    #: A checkout session with the guessed ``action`` (the customer confirms on the hosted page).
    CHECKOUT = "checkout", _("Checkout (guess)")
    #: ``PATCH /subscriptions/{id}`` on ``auto_renew`` (a guess).
    PATCH = "patch", _("PATCH (guess)")
    #: Staff do it on the service (the default and the fallback).
    REQUEST = "request", _("Request to staff")


class ChangeState(models.TextChoices):
    #: Asked; the service has not shown it done yet.
    PENDING = "pending", _("Pending")
    #: The service shows it done (an event or a pull).
    CONFIRMED = "confirmed", _("Confirmed by the service")
    #: Superseded by a later request of the subscriber, or its subscription ended.
    WITHDRAWN = "withdrawn", _("Withdrawn")


class ChangeRequest(models.Model):
    """One change a subscriber asked for on one subscription."""

    customer = models.ForeignKey(
        Customer,
        on_delete=models.CASCADE,
        related_name="change_requests",
        verbose_name=_("customer"),
    )
    subscription = models.ForeignKey(
        Subscription,
        on_delete=models.CASCADE,
        related_name="change_requests",
        verbose_name=_("subscription"),
    )
    kind = models.CharField(_("kind"), max_length=16, choices=ChangeKind.choices)
    via = models.CharField(_("via"), max_length=16, choices=ChangeVia.choices)
    state = models.CharField(
        _("state"), max_length=16, choices=ChangeState.choices, default=ChangeState.PENDING
    )
    target_product = models.ForeignKey(
        Product,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("new plan"),
    )
    target_cycle = models.CharField(_("new billing cycle"), max_length=32, blank=True, default="")
    target_currency = models.CharField(_("new currency"), max_length=8, blank=True, default="")
    #: ``upgrade`` or ``downgrade`` (monthly-normalised price in one currency); ``""`` otherwise.
    direction = models.CharField(_("direction"), max_length=16, blank=True, default="")
    checkout_session = models.ForeignKey(
        CheckoutSession, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    #: The subscription that carries the change, once the service shows it.
    new_subscription = models.ForeignKey(
        Subscription, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(_("asked at"), auto_now_add=True)
    staff_done_at = models.DateTimeField(_("done on the service (staff)"), null=True, blank=True)
    confirmed_at = models.DateTimeField(_("confirmed at"), null=True, blank=True)
    #: Set by ``change_plan``: the hosted page where the customer confirms (a checkout change).
    checkout_url: str | None = None

    class Meta:
        verbose_name = _("change request")
        verbose_name_plural = _("change requests")
        ordering = ["-created_at", "-pk"]
        indexes = [
            models.Index(
                fields=["subscription"],
                condition=models.Q(state="pending"),
                name="billing_change_pending",
            )
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} of {self.subscription_id} ({self.state})"


class SwitchedOffGuess(models.Model):
    """A guess of ``BILLING['GUESSES']`` the service refused (400, 404 or 405): not tried again
    until this row is deleted (admin, or ``billing_doctor``'s hint)."""

    name = models.CharField(_("guess"), max_length=64, unique=True)
    status = models.PositiveIntegerField(_("HTTP status"))
    operation = models.CharField(_("operation"), max_length=64)
    at = models.DateTimeField(_("switched off at"), auto_now_add=True)

    class Meta:
        verbose_name = _("switched-off guess")
        verbose_name_plural = _("switched-off guesses")

    def __str__(self) -> str:
        return f"{self.name} (HTTP {self.status})"
