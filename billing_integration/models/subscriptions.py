"""Subscriptions, owned by the service, and checkout sessions. The active rule (``active_q``
in SQL, ``grants_access`` in Python): the status is in ``BILLING['ACTIVE_STATUSES']`` and
the cycle has not ended, or the trial has not (no cycle end is open-ended unless a trial
ended); or the grace period (``in_grace_period``): with
``BILLING['ACCESS_AFTER_CANCEL'] = "period_end"`` a canceled subscription until its
``cycle_end_date``."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from functools import lru_cache
from typing import Any

from django.db import models
from django.db.models import Q
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..conf import billing_settings
from ..exceptions import BillingConfigurationError
from .base import RemoteObject
from .customers import Customer
from .products import Product
from .reports import SUBSCRIPTION_INSTANTS

__all__ = ["CheckoutSession", "Report", "Subscription", "active_q", "active_statuses"]
__all__ += ["grace_q", "grants_access", "in_grace_period", "is_known_status", "unknown_status_q"]

#: Statuses known to grant no access (not reported as unknown); not a deny-list.
KNOWN_INACTIVE_STATUSES = ("canceled", "cancelled", "paused", "ended", "expired", "detached")
#: Statuses of a canceled subscription (the grace period's); ``paused`` is not one.
CANCELED_STATUSES = ("canceled", "cancelled")
#: The status of a subscription paused on the service: no access, but the service may resume
#: it, so with ``auto_renew`` on it may still bill (``renewing_statuses``).
PAUSED_STATUS = "paused"
#: The values of ``BILLING['ACCESS_AFTER_CANCEL']``.
ACCESS_AFTER_CANCEL_CHOICES = ("period_end", "immediately")


@lru_cache(maxsize=8)
def _normalised(configured: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(s.strip().lower() for s in configured))


def active_statuses() -> tuple[str, ...]:
    """``BILLING['ACTIVE_STATUSES']`` stripped and lower-cased; raises on a malformed one."""
    configured = billing_settings.ACTIVE_STATUSES
    if (
        not isinstance(configured, (list, tuple))
        or not configured
        or not all(isinstance(s, str) and s.strip() for s in configured)
    ):
        raise BillingConfigurationError(
            "BILLING['ACTIVE_STATUSES'] must be a non-empty list of non-empty strings, "
            f"not {configured!r}.",
            setting="BILLING['ACTIVE_STATUSES']",
        )
    return _normalised(tuple(configured))


def renewing_statuses() -> tuple[str, ...]:
    """The statuses of a subscription that may still renew on the service when its
    ``auto_renew`` is on: the active ones, and ``paused`` (the service may resume it)."""
    return (*active_statuses(), PAUSED_STATUS)


def is_known_status(status: str) -> bool:
    """An active status or one of ``KNOWN_INACTIVE_STATUSES``."""
    return status in active_statuses() or status in KNOWN_INACTIVE_STATUSES


def access_after_cancel() -> str:
    """``BILLING['ACCESS_AFTER_CANCEL']``, ``"period_end"`` or ``"immediately"`` (else raises)."""
    value = billing_settings.ACCESS_AFTER_CANCEL
    if value not in ACCESS_AFTER_CANCEL_CHOICES:
        raise BillingConfigurationError(
            "BILLING['ACCESS_AFTER_CANCEL'] must be one of "
            f"{', '.join(map(repr, ACCESS_AFTER_CANCEL_CHOICES))}, not {value!r}.",
            setting="BILLING['ACCESS_AFTER_CANCEL']",
        )
    return str(value)


def in_grace_period(
    status: str, cycle_end_date: datetime | None, at: datetime | None = None
) -> bool:
    """The grace-period rule: with ``BILLING['ACCESS_AFTER_CANCEL'] = "period_end"`` (the
    default), a canceled subscription grants access until a ``cycle_end_date`` after ``at``."""
    return (
        status in CANCELED_STATUSES
        and cycle_end_date is not None
        and cycle_end_date > (at or timezone.now())
        and access_after_cancel() == "period_end"
    )


def grace_q(at: datetime | None = None, prefix: str = "") -> Q | None:
    """``in_grace_period`` as a ``Q``; ``None`` when the setting is ``"immediately"``."""
    if access_after_cancel() != "period_end":
        return None
    return Q(**{f"{prefix}status__in": CANCELED_STATUSES}) & Q(
        **{f"{prefix}cycle_end_date__gt": at or timezone.now()}
    )


def active_q(at: datetime | None = None, prefix: str = "") -> Q:
    """The active rule as a ``Q`` (``prefix``: e.g. ``"subscriptions__"``)."""
    now = at or timezone.now()
    live = Q(**{f"{prefix}status__in": active_statuses()}) & (
        Q(**{f"{prefix}cycle_end_date__isnull": True, f"{prefix}trial_end_date__isnull": True})
        | Q(**{f"{prefix}cycle_end_date__gt": now})
        | Q(**{f"{prefix}trial_end_date__gt": now})
    )
    grace = grace_q(now, prefix)
    return live if grace is None else live | grace


def grants_access(
    status: str,
    cycle_end_date: datetime | None,
    trial_end_date: datetime | None,
    at: datetime | None = None,
) -> bool:
    """The active rule in Python (the twin of ``active_q``)."""
    now = at or timezone.now()
    live = status in active_statuses() and (
        (cycle_end_date is None and trial_end_date is None)
        or (cycle_end_date is not None and cycle_end_date > now)
        or (trial_end_date is not None and trial_end_date > now)
    )
    return live or in_grace_period(status, cycle_end_date, now)


def unknown_status_q() -> Q:
    """Subscriptions whose status is neither active nor known inactive (``""`` included)."""
    return ~Q(status__in=[*active_statuses(), *KNOWN_INACTIVE_STATUSES])


class SubscriptionQuerySet(models.QuerySet["Subscription"]):
    def active(self, at: datetime | None = None) -> SubscriptionQuerySet:
        """Subscriptions that grant access at ``at`` (now by default)."""
        return self.filter(active_q(at))

    def unknown_status(self) -> SubscriptionQuerySet:
        return self.filter(unknown_status_q())

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
    #: ``discount_coupon`` as received (its shape is not documented): shown, never interpreted.
    discount_coupon = models.JSONField(_("discount coupon"), null=True, blank=True)
    #: True when ``remote_updated`` is a time of ours (an undated event's), not the service's.
    remote_updated_ours = models.BooleanField(default=False, editable=False)

    objects = SubscriptionQuerySet.as_manager()
    #: Set by ``start_trial``: True when a trial in progress is returned (a repeated request).
    reused = False
    #: ``SUBSCRIPTION_INSTANTS`` as read from the database or last marked by ``touch_reports``:
    #: the months the row counted in before a change, which that change marks dirty too.
    report_instants: tuple[datetime | None, ...] = ()

    class Meta:
        ordering = ["-created_at", "pk"]
        verbose_name = _("subscription")
        verbose_name_plural = _("subscriptions")
        # For reporting.metrics: the start, trials ending, customers at risk.
        indexes = [
            models.Index(Coalesce("remote_created", "created_at"), name="subscription_started"),
            # reporting.rollups.touching: ended or lapsed in the current month
            models.Index(Coalesce("remote_updated", "updated_at"), name="subscription_changed"),
            models.Index(fields=["cycle_end_date"], name="subscription_cycle_end"),
            models.Index(
                fields=["trial_end_date"],
                condition=Q(trial_end_date__isnull=False),
                name="subscription_trial_end",
            ),
            models.Index(
                fields=["customer"],
                include=[
                    "status",
                    "cycle_end_date",
                    "trial_end_date",
                    "product",
                    "selected_currency",
                ],
                condition=Q(last_payment_status="failed"),
                name="subscription_failed_payment",
            ),
        ]

    @classmethod
    def from_db(
        cls, db: str | None, field_names: Collection[str], values: Collection[Any], **kw: Any
    ) -> Subscription:
        instance = super().from_db(db, field_names, values, **kw)
        loaded = instance.__dict__  # the fields read (a deferred one is not loaded for this)
        instance.report_instants = tuple(loaded.get(name) for name in SUBSCRIPTION_INSTANTS)
        return instance

    def __str__(self) -> str:
        product = self.product or self.product_remote_id
        return f"{product} for {self.customer or self.customer_remote_id}"

    @property
    def is_active(self) -> bool:
        """Whether the subscription grants access now."""
        return grants_access(self.status, self.cycle_end_date, self.trial_end_date)

    @property
    def is_live(self) -> bool:
        """Active and not canceled (``access.live_subscriptions``): a plan held, that renews."""
        return self.is_active and self.status not in CANCELED_STATUSES

    @property
    def bought(self) -> bool:
        """Live, and out of trial or a trial that renews by itself (``auto_renew``: its end
        bills the first period): the product held, that a checkout must not sell again (a
        trial that does not renew is converted by buying its product)."""
        return self.is_live and (self.trial_ends_at is None or self.auto_renew)

    @property
    def on_grace_period(self) -> bool:
        """Canceled, with access until ``cycle_end_date`` (``in_grace_period``)."""
        return in_grace_period(self.status, self.cycle_end_date)

    @property
    def trial_ends_at(self) -> datetime | None:
        """The end of the trial while it runs (``None`` when not in trial, or canceled)."""
        end = self.trial_end_date
        if end is None or end <= timezone.now() or self.status not in active_statuses():
            return None
        return end

    @property
    def has_unknown_status(self) -> bool:
        return not is_known_status(self.status)


class Report(Subscription):
    """A proxy behind the admin reporting dashboard."""

    class Meta:
        proxy = True
        verbose_name = _("report")
        verbose_name_plural = _("reports")
        default_permissions = ("view",)


class CheckoutSession(RemoteObject):
    """Created synchronously by the checkout view (the redirect needs its id)."""

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
    #: When the customer first came back from its hosted page to the return page (which names
    #: it, else the customer's latest session): it may have been paid. Never grants anything.
    returned_at = models.DateTimeField(
        _("back from its page at"), null=True, blank=True, editable=False
    )
    #: Set by ``start_checkout``: True when an earlier identical request's open session is returned.
    reused = False

    class Meta:
        ordering = ["-created_at", "pk"]
        verbose_name = _("checkout session")
        verbose_name_plural = _("checkout sessions")

    def __str__(self) -> str:
        return f"checkout {self.remote_id or self.pk} ({self.status or 'new'})"
