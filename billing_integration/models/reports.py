"""Reporting rollups: the monthly figures of closed months, the customer figures and the
customers at risk, computed ahead of time from the mirror (``reporting/rollups.py``), and the
rows that say what they cover."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date, datetime, timedelta

from django.db import models
from django.db.models import Min, Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

__all__ = [
    "ReportAtRisk",
    "ReportAtRiskCount",
    "ReportCustomer",
    "ReportMonth",
    "ReportState",
    "mark_reports_dirty",
    "month_of",
    "touch_reports",
]

EPSILON = timedelta(microseconds=1)
#: The fields of a subscription that give the months it counts in (``touch_reports``).
SUBSCRIPTION_INSTANTS = (
    "remote_created",
    "created_at",
    "remote_updated",
    "cycle_end_date",
    "trial_end_date",
)
#: The subscription figures of a ``ReportMonth`` row (per cycle); the others are on cycle "".
SUBSCRIPTION_FIELDS = (
    "active_start",
    "active_end",
    "new",
    "reactivated",
    "cancellations",
    "paying_end",
)
COUNT_FIELDS = (
    *SUBSCRIPTION_FIELDS,
    "trials_ended",
    "trials_converted",
    "payments_completed",
    "payments_failed",
    "payments_canceled",
    "refunds",
    "refunds_pending",
)
AMOUNT_FIELDS = ("paid_amount", "failed_amount", "refunded_amount")


def _count() -> models.IntegerField[int, int]:
    return models.IntegerField(default=0)


def _amount() -> models.DecimalField[object, object]:
    return models.DecimalField(max_digits=24, decimal_places=2, default=0)


class ReportMonth(models.Model):
    """The figures of one closed month (local time) for one product, billing cycle and
    currency. Subscription counts are per cycle (MRR is ``paying_end`` times the cycle's
    current monthly price, applied when read); trials, payments and refunds are on the row
    of cycle ``""``."""

    month = models.DateField()
    product_id = models.IntegerField(null=True, blank=True)
    cycle = models.CharField(max_length=32, blank=True, default="")
    currency = models.CharField(max_length=8, blank=True, default="")
    active_start = _count()
    active_end = _count()
    new = _count()
    #: among ``new``: customers coming back after churning (``metrics.came_back``)
    reactivated = _count()
    cancellations = _count()
    paying_end = _count()
    trials_ended = _count()
    trials_converted = _count()
    payments_completed = _count()
    payments_failed = _count()
    payments_canceled = _count()
    refunds = _count()
    refunds_pending = _count()
    paid_amount = _amount()
    failed_amount = _amount()
    refunded_amount = _amount()

    class Meta:
        verbose_name = _("report month")
        verbose_name_plural = _("report months")
        indexes = [models.Index(fields=["month"], name="report_month_month")]

    def __str__(self) -> str:
        return f"{self.month:%Y-%m} {self.product_id} {self.cycle} {self.currency}"


class ReportCustomer(models.Model):
    """A customer's payments in one currency, for one product (or, ``all_products``, every
    product), up to the last refresh: what the report's customer ranking reads."""

    customer_id = models.IntegerField()
    product_id = models.IntegerField(null=True, blank=True)
    all_products = models.BooleanField(default=False)
    currency = models.CharField(max_length=8, blank=True, default="")
    paid = models.DecimalField(max_digits=24, decimal_places=6, null=True, blank=True)
    #: ``paid`` is NULL (nothing completed): ranked after every paid amount.
    unpaid = models.BooleanField(default=False)
    failed = _count()
    failed_amount = models.DecimalField(max_digits=24, decimal_places=6, null=True, blank=True)
    last_payment_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("report customer")
        verbose_name_plural = _("report customers")
        indexes = [
            models.Index(
                "all_products",
                "product_id",
                "unpaid",
                models.F("paid").desc(),
                "customer_id",
                "currency",
                name="report_customer_ranking",
            )
        ]

    def __str__(self) -> str:
        return f"{self.customer_id} {self.product_id} {self.currency}"


class ReportState(models.Model):
    """One row per name. ``"rollups"``: the rollups hold every month before ``month`` (the
    first day of the month they were computed in), ``verified_at`` is when they were last
    recomputed with nothing pending. ``"dirty"``: ``month`` is the first month a change
    touched since (``None``: nothing pending). Two rows, so that marking a change never
    waits for a recomputation holding the first. ``"current"``: the rollups also hold the
    current month (``month``) up to ``verified_at``, the instant of the last refresh.
    ``"at_risk"``: ``ReportAtRisk`` and ``ReportAtRiskCount`` are as of ``verified_at``."""

    ROLLUPS, DIRTY, CURRENT, AT_RISK = "rollups", "dirty", "current", "at_risk"

    name = models.CharField(max_length=16, unique=True)
    month = models.DateField(null=True, blank=True)
    verified_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("report state")
        verbose_name_plural = _("report states")

    def __str__(self) -> str:
        return f"{self.name}: {self.month}"


class ReportAtRiskCount(models.Model):
    """How many customers are at risk in one filter of the report, as of the last refresh:
    ``product_id`` NULL for every product, ``currency`` ``""`` for every currency. A filter
    with no row has none."""

    product_id = models.IntegerField(null=True, blank=True)
    currency = models.CharField(max_length=8, blank=True, default="")
    customers = _count()

    class Meta:
        verbose_name = _("report customers at risk count")
        verbose_name_plural = _("report customers at risk counts")
        indexes = [models.Index(fields=["product_id", "currency"], name="report_at_risk_count")]

    def __str__(self) -> str:
        return f"{self.product_id} {self.currency}: {self.customers}"


class ReportAtRisk(models.Model):
    """One of the first customers at risk (by identifier, ``position`` from 1) in one filter
    of the report (as ``ReportAtRiskCount``), as of the last refresh, with the reasons counted
    in that filter."""

    product_id = models.IntegerField(null=True, blank=True)
    currency = models.CharField(max_length=8, blank=True, default="")
    position = models.IntegerField()
    customer_id = models.IntegerField()
    identifier = models.CharField(max_length=255, blank=True, default="")
    name = models.CharField(max_length=301, blank=True, default="")
    email = models.CharField(max_length=254, blank=True, default="")
    failing_subscriptions = _count()
    #: every invoice not paid, void or deleted, the uncollectable ones included
    unsettled_invoices = _count()
    uncollectable_invoices = _count()

    class Meta:
        verbose_name = _("report customer at risk")
        verbose_name_plural = _("report customers at risk")
        indexes = [
            models.Index(fields=["product_id", "currency", "position"], name="report_at_risk")
        ]

    def __str__(self) -> str:
        return f"{self.product_id} {self.currency} #{self.position}: {self.identifier}"


def month_of(at: datetime | date) -> date:
    """The first day of the month (local time) ``at`` lies in."""
    if isinstance(at, datetime):
        at = timezone.localtime(at).date()
    return at.replace(day=1)


def mark_reports_dirty(*instants: datetime | date | None, using: str = "default") -> None:
    """Note that the figures of the month of the earliest of ``instants`` (and of every month
    after it; of the month before too for an instant on a month's first) must be recomputed."""
    months = [month_of(t - EPSILON if isinstance(t, datetime) else t) for t in instants if t]
    if not months:
        return
    first = min(months)
    # One UPDATE that matches nothing (and locks nothing) when the month is already as early:
    # concurrent workers do not queue on the row, which only ever moves to an earlier month.
    # The row is made by the migration (and again by a refresh, should it be missing).
    rows = ReportState.objects.using(using).filter(name=ReportState.DIRTY)
    rows.filter(Q(month__isnull=True) | Q(month__gt=first)).update(month=first)


def touch_reports(objs: Iterable[models.Model], using: str = "default") -> None:
    """Mark dirty the months that saved or deleted subscriptions, payments or refunds count
    in, and counted in before the change (``report_instants``): a subscription's start, end or
    trial end (an end may lie before the start); a payment's or refund's date, and the trial
    ends a payment may convert (``reporting.metrics.trial_history``): its subscription's, and
    those of its customer's subscriptions for its product that started by its date."""
    from .records import Payment, Refund
    from .subscriptions import Subscription

    instants: list[datetime | None] = []
    subscriptions: set[int] = set()
    # (customer, product) -> the latest date of a payment of theirs
    bought: dict[tuple[int, int], datetime] = {}
    for obj in objs:
        if isinstance(obj, Subscription):
            current = tuple(getattr(obj, name) for name in SUBSCRIPTION_INSTANTS)
            # and the months it counted in before this change (as read or last saved)
            instants += [*current, *obj.report_instants]
            obj.report_instants = current
        elif isinstance(obj, (Payment, Refund)):
            instants.append(obj.remote_created or obj.created_at)
            if isinstance(obj, Payment):
                if obj.subscription_id is not None:
                    subscriptions.add(obj.subscription_id)
                at = obj.remote_created
                if obj.customer_id is not None and obj.product_id is not None and at:
                    key = (obj.customer_id, obj.product_id)
                    bought[key] = max(at, bought.get(key, at))
    converted = Q(pk__in=subscriptions) if subscriptions else Q()
    for (customer, product), at in bought.items():
        converted |= Q(customer_id=customer, product_id=product, remote_created__lte=at)
        converted |= Q(
            customer_id=customer, product_id=product, remote_created=None, created_at__lte=at
        )
    if converted:
        trial_ends = Subscription.objects.using(using).filter(
            converted, trial_end_date__isnull=False
        )
        instants.append(trial_ends.order_by().aggregate(first=Min("trial_end_date"))["first"])
    mark_reports_dirty(*instants, using=using)
