"""Reporting figures: each function runs one grouped query over the mirror and returns plain
rows. The rules are those of docs/reporting.md."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from functools import partial
from itertools import accumulate
from operator import sub
from typing import Any

from django.db.models import (
    BigIntegerField,
    Case,
    CharField,
    Count,
    DateTimeField,
    DecimalField,
    Exists,
    ExpressionWrapper,
    F,
    Func,
    IntegerField,
    Max,
    Min,
    Model,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast, Coalesce, Concat, Greatest, TruncMonth, Upper
from django.db.models.lookups import IsNull, LessThan, LessThanOrEqual
from django.utils import timezone

from .. import currencies
from ..models import (
    Customer,
    Invoice,
    InvoiceStatus,
    Payment,
    PaymentStatus,
    Price,
    Refund,
    RefundStatus,
    Subscription,
    active_statuses,
)
from ..models.subscriptions import CANCELED_STATUSES, access_after_cancel
from ..timestamps import TOLERANCE

MONEY = DecimalField(max_digits=24, decimal_places=6)
CENT = Decimal("0.01")
Rows = list[dict[str, Any]]
Prices = dict[tuple[Any, str, str], Decimal]
#: Invoices not in these states (nor uncollectable) still wait for their money.
SETTLED_INVOICE_STATUSES = (InvoiceStatus.PAID, InvoiceStatus.VOID, InvoiceStatus.DELETED)
#: The figures of ``subscription_history``'s rows (and MRR).
HISTORY_COUNTS = ("active_start", "active_end", "new", "reactivated", "cancellations")


def month_starts(months: int, now: datetime | None = None) -> list[datetime]:
    """The first instants (local time) of the last ``months`` months, oldest first."""
    current = timezone.localtime(now or timezone.now())
    current = current.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    indexes = [current.year * 12 + current.month - 1 - i for i in range(months - 1, -1, -1)]
    return [current.replace(year=i // 12, month=i % 12 + 1) for i in indexes]


@dataclass(frozen=True)
class Period:
    """The last ``months`` months up to ``now``, optionally one product (pk) and currency."""

    months: int = 12
    product: int | None = None
    currency: str | None = None
    now: datetime = field(default_factory=timezone.now)

    def __post_init__(self) -> None:
        if not 1 <= self.months <= 120:
            raise ValueError("months must be between 1 and 120")
        if self.currency:
            object.__setattr__(self, "currency", self.currency.upper())

    @property
    def starts(self) -> list[datetime]:
        return month_starts(self.months, self.now)

    @property
    def start(self) -> datetime:
        return self.starts[0]

    def bounds(self) -> list[tuple[datetime, datetime]]:
        """``(start, end)`` of each month, the last one ending at ``now``."""
        starts = self.starts
        return list(zip(starts, [*starts[1:], self.now], strict=True))


def month_key(month: datetime) -> str:
    return timezone.localtime(month).strftime("%Y-%m")


def started_at() -> Coalesce:
    return Coalesce("remote_created", "created_at", output_field=DateTimeField())


def changed_at() -> Case:
    """When the service last changed it (``remote_updated``), unless that is more than
    ``TOLERANCE`` after it was stored here (a clock ahead, a 2099 ``date_updated``: the rule of
    the version guard, ``models.base.trusted_until``); then, and without it, ``updated_at``."""
    trusted = Q(remote_updated__lte=F("updated_at") + timedelta(seconds=TOLERANCE))
    return Case(When(trusted, then=F("remote_updated")), default=F("updated_at"))


def ended_at(now: datetime) -> Case:
    """When a subscription stopped being active, else NULL. A canceled one in its grace period
    (``BILLING['ACCESS_AFTER_CANCEL'] = "period_end"``) stops at its ``cycle_end_date``."""
    canceled = Q(status__in=CANCELED_STATUSES, cycle_end_date__isnull=False)
    grace = (
        [
            When(canceled & Q(cycle_end_date__gt=now), then=Value(None)),
            When(canceled, then=F("cycle_end_date")),
        ]
        if access_after_cancel() == "period_end"
        else []
    )
    return Case(
        *grace,
        When(~Q(status__in=active_statuses()), then=changed_at()),
        When(Q(cycle_end_date__lte=now) & ~Q(trial_end_date__gt=now), then=F("cycle_end_date")),
        # no cycle end, a trial over: it ended with the trial
        When(Q(cycle_end_date__isnull=True, trial_end_date__lte=now), then=F("trial_end_date")),
        default=Value(None, output_field=DateTimeField()),
        output_field=DateTimeField(),
    )


def came_back(at: datetime) -> Q:
    """A *reactivated* subscription (``started`` annotated): its customer had another
    subscription (any product) that started and ended at or before its start, and none active
    at its start: a customer coming back after churning. ``at``: the instant the end rule is
    judged at (``ended_at``)."""
    others = (
        Subscription.objects.annotate(started=started_at(), ended=ended_at(at))
        .filter(customer_id=OuterRef("customer_id"), started__lte=OuterRef("started"))
        .exclude(pk=OuterRef("pk"))
        .order_by()
    )
    churned = others.filter(ended__lte=OuterRef("started"))
    holding = others.filter(Q(ended__isnull=True) | Q(ended__gt=OuterRef("started")))
    return Q(Exists(churned)) & ~Q(Exists(holding))


def price_table() -> Prices:
    """Monthly price by ``(product pk, cycle code, currency code)``, one query (a Subquery in
    the grouped queries would run once per subscription)."""
    # In 64 bits: a frequency of years near the column's 32-bit limit, times 12, overflows it.
    months = ExpressionWrapper(
        Cast("cycle__frequency", BigIntegerField())
        * Case(When(cycle__unit="years", then=12), default=1),
        output_field=BigIntegerField(),
    )
    rows = (
        Price.objects.filter(cycle__isnull=False)
        .annotate(
            product_ref=F("cycle__product_id"),
            cycle_code=Concat(
                "cycle__unit",
                Value("-"),
                Cast("cycle__frequency", CharField()),
                output_field=CharField(),
            ),
            code=Case(
                *[When(currency_id=i, then=Value(c)) for i, c in currencies.known().items()],
                default=Value(""),
                output_field=CharField(),
            ),
            # ``* 1.0``: exact numeric on PostgreSQL, no integer division on SQLite
            monthly=ExpressionWrapper(F("amount") * RawSQL("1.0", ()) / months, output_field=MONEY),
        )
        .order_by("-pk")  # the first price of a (cycle, currency) wins, as in the admin
        .values_list("product_ref", "cycle_code", "code", "monthly")
    )
    return {(p, cycle, code): Decimal(m) for p, cycle, code, m in rows}


def _subscriptions(period: Period, qs: QuerySet[Any] | None = None) -> QuerySet[Any]:
    qs = Subscription.objects.all() if qs is None else qs
    qs = qs.annotate(currency=Upper("selected_currency"))
    if period.product:
        qs = qs.filter(product_id=period.product)
    if period.currency:
        same = Q(currency=period.currency)
        if period.currency.isascii():
            # the stored code first: OR stops there, sparing UPPER on most rows
            same = Q(selected_currency=period.currency) | same
        qs = qs.filter(same)
    return qs.order_by()


def _records(
    model: type[Model], period: Period, *, product: Any = None, lifetime: bool = False
) -> QuerySet[Any]:
    """Payments or refunds of the period (``lifetime``: up to now), with ``at``, ``code`` and
    ``product_ref``."""
    qs = model._default_manager.annotate(
        at=started_at(),
        code=Upper("currency"),
        product_ref=product if product is not None else F("product_id"),
    ).filter(at__lte=period.now)
    if not lifetime:
        qs = qs.filter(at__gte=period.start)
    if period.product:
        qs = qs.filter(product_ref=period.product)
    if period.currency:
        qs = qs.filter(code=period.currency)
    return qs.order_by()


def money(value: Any) -> Decimal:
    return (Decimal(value) if value is not None else Decimal(0)).quantize(CENT)


def _merge_codes(rows: Any, keys: tuple[str, ...], counts: tuple[str, ...]) -> Rows:
    """Rows grouped on the stored currency, added up per ``keys`` + ``code`` (as ``currency``):
    "usd" and "USD" are one currency."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        key = (*(r[k] for k in keys), r["code"])
        blank = {**{k: r[k] for k in keys}, "currency": r["code"], **dict.fromkeys(counts, 0)}
        row = out.setdefault(key, blank)
        for c in counts:
            row[c] += r[c]
    return list(out.values())


def current_subscriptions(
    period: Period, prices: Prices | None = None, *, future_only: bool = False
) -> Rows:
    """Active and trialing subscriptions now and MRR, per product, cycle and currency
    (``future_only``: among the subscriptions that start after now, an index range)."""
    now = period.now
    active = Subscription.objects.active(now)
    if future_only:
        active = active.alias(started=started_at()).filter(started__gt=now)
    rows = (
        _subscriptions(period, active)
        .values("product_id", "selected_billing_cycle", "selected_currency")
        .annotate(
            code=Upper(Min("selected_currency")),
            active=Count("pk"),
            trialing=Count("pk", filter=Q(trial_end_date__gt=now)),
        )
    )
    prices = price_table() if prices is None else prices
    merged = _merge_codes(rows, ("product_id", "selected_billing_cycle"), ("active", "trialing"))
    keys = ("product_id", "selected_billing_cycle", "currency")
    return [
        current_row(tuple(r[k] for k in keys), r["active"], r["trialing"], prices) for r in merged
    ]


def current_row(key: tuple[Any, ...], active: int, trialing: int, prices: Prices) -> dict[str, Any]:
    """A row of ``current_subscriptions`` of ``(product_id, cycle, currency)``: MRR from the
    subscriptions out of trial."""
    product_id, cycle, currency = key
    monthly = prices.get(key)
    return {
        "product_id": product_id,
        "cycle": cycle,
        "currency": currency,
        "active": active,
        "trialing": trialing,
        "unpriced": 0 if monthly is not None else active,
        "mrr": money((active - trialing) * (monthly or 0)),
    }


class PointsBefore(Func):
    """How many of ``points`` (ascending) lie before the value (or at it when ``inclusive``;
    ``null`` when NULL): ``WIDTH_BUCKET`` on PostgreSQL, a CASE elsewhere."""

    output_field = IntegerField()

    def __init__(self, value: Any, points: list[datetime], *, inclusive: bool, null: int) -> None:
        self.points, self.inclusive, self.null = list(points), inclusive, null
        super().__init__(value)

    def as_sql(self, compiler: Any, connection: Any, *args: Any, **extra: Any) -> tuple[str, Any]:
        value = self.source_expressions[0]
        before = LessThan if self.inclusive else LessThanOrEqual
        case = Case(
            When(IsNull(value, True), then=Value(self.null)),
            *[When(before(value, p), then=Value(k)) for k, p in enumerate(self.points)],
            default=Value(len(self.points)),
            output_field=IntegerField(),
        )
        return compiler.compile(case)

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        value_sql, params = compiler.compile(self.source_expressions[0])
        shift = timedelta(0) if self.inclusive else timedelta(microseconds=1)
        points = [p + shift for p in self.points]
        return (
            f"COALESCE(WIDTH_BUCKET({value_sql}, %s::timestamptz[]), %s)",
            [*params, points, self.null],
        )


def subscription_history(period: Period, prices: Prices | None = None) -> Rows:
    """Per product, currency and month: active at its start, new (and reactivated among
    them), cancellations and MRR at its end. One query buckets each subscription against the
    month boundaries."""
    return with_mrr(subscription_counts(period), price_table() if prices is None else prices)


def with_mrr(counts: Rows, prices: Prices, names: tuple[str, ...] = HISTORY_COUNTS) -> Rows:
    """``names`` of rows per cycle (``subscription_counts``, the rollups) added up per product,
    currency and month, with MRR: the subscriptions paying at the month's end times their
    cycle's monthly price."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in counts:
        key = (r["product_id"], r["currency"], r["month"])
        blank = dict(zip(("product_id", "currency", "month"), key, strict=True))
        row = out.setdefault(key, {**blank, **dict.fromkeys(names, 0), "mrr": Decimal(0)})
        for name in names:
            row[name] += r[name]
        monthly = prices.get((r["product_id"], r["cycle"], r["currency"]), Decimal(0))
        row["mrr"] += r["paying_end"] * monthly
    for row in out.values():
        row["mrr"] = money(row["mrr"])
    return sorted(out.values(), key=lambda r: (r["month"], str(r["product_id"]), r["currency"]))


def subscription_counts(
    period: Period, qs: QuerySet[Any] | None = None, at: datetime | None = None
) -> Rows:
    """Per product, billing cycle, currency and month: active at its start and at its end,
    new, reactivated (among the new), cancellations, and paying (active and out of trial) at
    its end. One query buckets each subscription against the month boundaries. ``qs``: these
    subscriptions only (their customers' other subscriptions all count for reactivation);
    ``at``: the instant the active rule is judged at (default: the period's end)."""
    points = [*period.starts, period.now]
    first = points[0]
    size = len(points) + 1  # bucket values 0 .. N + 1

    up = partial(PointsBefore, points=points, inclusive=False, null=len(points))
    month = partial(PointsBefore, points=points, inclusive=True, null=len(points))

    at = at or period.now
    qs = _subscriptions(period, qs).annotate(
        started=started_at(),
        ended=ended_at(at),
        out_of_trial=Greatest(
            started_at(), Coalesce("trial_end_date", started_at()), output_field=DateTimeField()
        ),
    )
    # started before the period and out of trial at its start: up 0, month 0, paying 0
    quiet = Q(started__lt=first, out_of_trial__lte=first)
    columns = ("product_id", "selected_billing_cycle", "selected_currency", "kind")
    zero = Value(0, output_field=IntegerField())
    starts = {
        "kind": zero,
        "up": up(F("started")),
        "month": month(F("started")),
        "paying": up(F("out_of_trial")),
    }
    branches = [
        # kind 2: counted in both histograms (ended before the period too), else 0
        qs.filter(quiet).annotate(
            kind=Case(
                When(ended__lt=first, then=Value(2)), default=Value(0), output_field=IntegerField()
            ),
            up=zero,
            month=zero,
            paying=zero,
            back=zero,
        ),
        # started in the period, or before it with a trial ending in it: an index range each;
        # back 1: a reactivated one (new in the period: checked for these only)
        qs.filter(started__gte=first).annotate(
            **starts, back=Case(When(came_back(at), then=Value(1)), default=zero)
        ),
        qs.filter(started__lt=first, trial_end_date__gt=first).annotate(**starts, back=zero),
        qs.filter(ended__isnull=False)
        .exclude(quiet & Q(ended__lt=first))
        .annotate(
            kind=Value(1, output_field=IntegerField()),
            up=up(Greatest("started", "ended", output_field=DateTimeField())),
            month=month(F("ended")),
            paying=up(Greatest("out_of_trial", "ended", output_field=DateTimeField())),
            back=zero,
        ),
    ]
    grouped = [
        b.values(*columns, "up", "month", "paying", "back").annotate(
            code=Upper(Min("selected_currency")), n=Count("pk")
        )
        for b in branches
    ]
    rows = grouped[0].union(*grouped[1:], all=True)
    # per (product, cycle, code): histograms of starts (0) / ends (1) by up, paying, month
    groups: dict[tuple[Any, ...], dict[str, list[int]]] = {}
    for r in rows:
        key = (r["product_id"], r["selected_billing_cycle"], r["code"])
        names = ("up0", "up1", "paying0", "paying1", "month0", "month1", "back")
        g = groups.setdefault(key, {name: [0] * size for name in names})
        for kind in (0, 1) if r["kind"] == 2 else (r["kind"],):
            for name in ("up", "paying", "month"):
                g[f"{name}{kind}"][r[name]] += r["n"]
        if r["back"]:  # by the month it is new in
            g["back"][r["month"]] += r["n"]
    months = [month_key(start) for start in period.starts]
    out: Rows = []
    for (product_id, cycle, currency), g in groups.items():
        active = list(accumulate(map(sub, g["up0"], g["up1"])))  # active at b_k
        paying = list(accumulate(map(sub, g["paying0"], g["paying1"])))  # and out of trial
        for i, month_i in enumerate(months):
            out.append(
                {
                    "product_id": product_id,
                    "cycle": cycle,
                    "currency": currency,
                    "month": month_i,
                    "active_start": active[i],
                    "active_end": active[i + 1],
                    # month value i + 1: at or after b_i and before b_(i+1)
                    "new": g["month0"][i + 1],
                    "reactivated": g["back"][i + 1],
                    "cancellations": g["month1"][i + 1],
                    "paying_end": paying[i + 1],
                }
            )
    return out


def trial_history(period: Period, after: datetime | None = None) -> Rows:
    """Per product, currency and month: trials ended, and converted: a completed payment of the
    trial's subscription, or of the same customer for the same product since the trial started
    (a checkout that converted a trial made by ``start_trial``). ``after``: only the trials
    that ended after that instant."""
    paid = Payment.objects.filter(status=PaymentStatus.COMPLETED).filter(
        Q(subscription=OuterRef("pk"))
        | Q(
            customer=OuterRef("customer"),
            product=OuterRef("product"),
            remote_created__gte=OuterRef("started"),
        )
    )
    rows = (
        _subscriptions(period)
        .filter(trial_end_date__gte=period.start, trial_end_date__lte=period.now)
        .filter(**({} if after is None else {"trial_end_date__gt": after}))
        .annotate(started=started_at())
        .annotate(month=TruncMonth("trial_end_date"), converted=Exists(paid))
        .values("product_id", "selected_currency", "month")
        .annotate(
            code=Upper(Min("selected_currency")),
            trials_ended=Count("pk"),
            trials_converted=Count("pk", filter=Q(converted=True)),
        )
    )
    counts = ("trials_ended", "trials_converted")
    return [
        {**r, "month": month_key(r["month"])}
        for r in _merge_codes(rows, ("product_id", "month"), counts)
    ]


def payment_history(period: Period, after: datetime | None = None) -> Rows:
    """Per product, currency and month: payments completed / failed / canceled and amounts.
    One query (a UNION ALL of one index range per month). ``after``: only the payments after
    that instant."""
    completed, failed = Q(status=PaymentStatus.COMPLETED), Q(status=PaymentStatus.FAILED)
    parts = []
    bounds = period.bounds()
    for i, (start, end) in enumerate(bounds):
        qs = _records(Payment, period, lifetime=True).filter(at__gte=start)
        if after is not None:
            qs = qs.filter(at__gt=after)
        if i < len(bounds) - 1:  # the current month ends at now, included
            qs = qs.filter(at__lt=end)
        parts.append(
            qs.annotate(month=Value(i, output_field=IntegerField()))
            .values("product_id", "code", "month")
            .annotate(
                # status, not pk: the covering index has it (an index-only scan)
                completed=Count("status", filter=completed),
                failed=Count("status", filter=failed),
                canceled=Count("status", filter=Q(status=PaymentStatus.CANCELED)),
                paid=Sum("amount", filter=completed),
                failed_amount=Sum("amount", filter=failed),
            )
        )
    months = [month_key(start) for start, _end in bounds]
    return [
        {
            "product_id": r["product_id"],
            "currency": r["code"],
            "month": months[r["month"]],
            "payments_completed": r["completed"],
            "payments_failed": r["failed"],
            "payments_canceled": r["canceled"],
            "paid_amount": money(r["paid"]),
            "failed_amount": money(r["failed_amount"]),
        }
        for r in parts[0].union(*parts[1:], all=True)
    ]


def refund_history(period: Period, after: datetime | None = None) -> Rows:
    """Per product (of the subscription, else of the payment), currency and month: approved
    refunds (count, amount) and initiated ones. One query; the subquery runs only when needed.
    ``after``: only the refunds after that instant."""
    product = Coalesce(
        "subscription__product_id",
        Subquery(Payment.objects.filter(pk=OuterRef("payment_id")).order_by().values("product_id")),
        output_field=IntegerField(),
    )
    rows = (
        _records(Refund, period, product=product)
        .filter(status__in=(RefundStatus.APPROVED, RefundStatus.INITIATED))
        .filter(**({} if after is None else {"at__gt": after}))
        .annotate(month=TruncMonth("at"))
        .values("product_ref", "code", "month")
        .annotate(
            approved=Count("pk", filter=Q(status=RefundStatus.APPROVED)),
            approved_amount=Sum("amount", filter=Q(status=RefundStatus.APPROVED)),
            pending=Count("pk", filter=Q(status=RefundStatus.INITIATED)),
        )
    )
    return [
        {
            "product_id": r["product_ref"],
            "currency": r["code"],
            "month": month_key(r["month"]),
            "refunds": r["approved"],
            "refunded_amount": money(r["approved_amount"]),
            "refunds_pending": r["pending"],
        }
        for r in rows
    ]


def flow_history(period: Period, after: datetime | None = None) -> Rows:
    """The trials, payments and refunds of ``period`` (``after``: since that instant)."""
    return [
        *trial_history(period, after),
        *payment_history(period, after),
        *refund_history(period, after),
    ]


def _ranked_customers(payments: QuerySet[Any], limit: int) -> RawSQL:
    """The customers of the first ``limit`` (customer, currency) pairs by lifetime paid. Raw SQL
    for what the ORM cannot express: a common table expression, so the ranking runs once."""
    ranked = (
        payments.filter(status=PaymentStatus.COMPLETED, amount__isnull=False)
        .values("customer_id", "code")
        .annotate(paid=Sum("amount"))
        .order_by(F("paid").desc(nulls_last=True), "customer_id", "code")[:limit]
    )
    unpaid = (
        payments.values("customer_id", "code")
        .annotate(paid=Sum("amount", filter=Q(status=PaymentStatus.COMPLETED)))
        .filter(paid__isnull=True)
        .order_by("customer_id", "code")[:limit]
    )
    ranked_sql, ranked_params = ranked.query.get_compiler(using=ranked.db).as_sql()
    unpaid_sql, unpaid_params = unpaid.query.get_compiler(using=unpaid.db).as_sql()
    # the ORM's compiled SQL; every value is a parameter
    sql = (
        f"WITH ranked (customer_id, code, paid) AS ({ranked_sql}), "  # noqa: S608
        f"unpaid (customer_id, code, paid) AS ({unpaid_sql}) "
        "SELECT customer_id FROM ranked UNION ALL "
        "SELECT customer_id FROM unpaid WHERE (SELECT COUNT(*) FROM ranked) < %s"
    )
    return RawSQL(sql, (*ranked_params, *unpaid_params, limit))  # noqa: S611


def customer_figures(payments: QuerySet[Any], *keys: str) -> QuerySet[Any]:
    """Per ``keys`` (``customer_id``, ``code``, ...) of ``payments`` (``_records``): paid,
    failed (count and amount) and the last payment's date."""
    return payments.values(*keys).annotate(
        paid=Sum("amount", filter=Q(status=PaymentStatus.COMPLETED)),
        failed=Count("status", filter=Q(status=PaymentStatus.FAILED)),
        failed_amount=Sum("amount", filter=Q(status=PaymentStatus.FAILED)),
        last_payment_at=Max("at"),
    )


def lifetime_payments(period: Period) -> QuerySet[Any]:
    """The payments of customers up to ``period.now``, in the period's filter."""
    return _records(Payment, period, lifetime=True).filter(customer__isnull=False)


def customer_summary(period: Period, limit: int | None = 25) -> Rows:
    """Per customer and currency (lifetime): paid, failed, active subscriptions, last payment;
    top ``limit`` by paid amount (``None``: all)."""
    payments = lifetime_payments(period)
    figures = customer_figures(payments, "customer_id", "code").order_by(
        F("paid").desc(nulls_last=True), "customer_id", "code"
    )
    if limit is None:
        rows = list(figures)
    elif limit <= 0:
        rows = []
    else:
        # the pairs of the ranked customers, ordered again: the first ``limit`` are the ranking's
        rows = list(figures.filter(customer_id__in=_ranked_customers(payments, limit))[:limit])
    return with_customer_details(rows, period, limit is not None)


def with_customer_details(rows: Rows, period: Period, listed_only: bool = True) -> Rows:
    """Rows of ``customer_figures`` (``customer_id``, ``code``, ...) as the customers table:
    with the identifier, the last payment's status and the active subscriptions. One query
    (for the listed customers only, when ``listed_only``)."""
    payments = Payment.objects.filter(customer=OuterRef("pk")).order_by()
    active = Subscription.objects.active(period.now)
    if period.product:
        payments = payments.filter(product_id=period.product)
        active = active.filter(product_id=period.product)
    details_qs = Customer.objects.annotate(
        last_status=Subquery(payments.order_by("-remote_created", "-pk").values("status")[:1]),
        active_n=_count(active),
    ).values_list("pk", "identifier", "last_status", "active_n")
    if listed_only:
        details_qs = details_qs.filter(pk__in=[r["customer_id"] for r in rows])
    details = {pk: (ident, last, n) for pk, ident, last, n in details_qs}
    return [
        {
            "customer_id": r["customer_id"],
            "identifier": ident,
            "currency": r["code"],
            "lifetime_paid": money(r["paid"]),
            "failed_payments": r["failed"],
            "failed_amount": money(r["failed_amount"]),
            "active_subscriptions": n,
            "last_payment_status": last or "",
            "last_payment_at": r["last_payment_at"],
        }
        for r in rows
        for ident, last, n in [details.get(r["customer_id"], ("", "", 0))]
    ]


def _count(qs: QuerySet[Any]) -> Coalesce:
    """The number of rows of ``qs`` for the outer customer (0 when none)."""
    qs = qs.filter(customer=OuterRef("pk")).order_by().values("customer")
    return Coalesce(Subquery(qs.annotate(n=Count("pk")).values("n")), 0)


def _at_risk(period: Period) -> tuple[QuerySet[Any], dict[str, Any]]:
    """Customers with an active subscription whose last payment failed, or with an unpaid or
    uncollectable invoice."""
    subs = Subscription.objects.active(period.now).filter(last_payment_status=PaymentStatus.FAILED)
    invoices = Invoice.objects.exclude(status__in=SETTLED_INVOICE_STATUSES)
    if period.product:
        subs = subs.filter(product_id=period.product)
        invoices = invoices.filter(product_id=period.product)
    if period.currency:
        subs = subs.annotate(c=Upper("selected_currency")).filter(c=period.currency)
        invoices = invoices.annotate(c=Upper("currency")).filter(c=period.currency)
    subs, invoices = subs.order_by(), invoices.order_by()
    customers = Customer.objects.filter(
        Q(pk__in=subs.values("customer_id")) | Q(pk__in=invoices.values("customer_id"))
    )
    return customers, {
        "failing_subscriptions": _count(subs),
        "unsettled_invoices": _count(invoices),
        "uncollectable_invoices": _count(invoices.filter(status=InvoiceStatus.UNCOLLECTABLE)),
    }


def customers_at_risk_count(period: Period) -> int:
    """How many customers are at risk. One query."""
    return _at_risk(period)[0].order_by().count()


def customers_at_risk(period: Period, limit: int | None = 50) -> Rows:
    """The customers at risk by identifier, with the reasons. One query."""
    customers, counts = _at_risk(period)
    qs = (
        customers.order_by("identifier", "pk")
        .annotate(**counts)
        .values("pk", "identifier", "first_name", "last_name", "email", *counts)
    )
    if limit is not None:
        qs = qs[:limit]
    return [
        at_risk_row(
            {**r, "customer_id": r["pk"], "name": f"{r['first_name']} {r['last_name']}".strip()}
        )
        for r in qs
    ]


def at_risk_row(r: Mapping[str, Any]) -> dict[str, Any]:
    """A row of the customers at risk table from ``customer_id``, ``identifier``, ``name``,
    ``email`` and the counts ``failing_subscriptions``, ``unsettled_invoices`` (every invoice
    not paid, void or deleted, the uncollectable ones too) and ``uncollectable_invoices``."""
    failing, uncollectable = r["failing_subscriptions"], r["uncollectable_invoices"]
    unpaid = r["unsettled_invoices"] - uncollectable
    reasons = [
        ("failed payment", failing),
        ("uncollectable invoice", uncollectable),
        ("unpaid invoice", unpaid),
    ]
    return {
        "customer_id": r["customer_id"],
        "identifier": r["identifier"],
        "name": r["name"],
        "email": r["email"],
        "failing_subscriptions": failing,
        "unpaid_invoices": unpaid,
        "uncollectable_invoices": uncollectable,
        "reasons": ", ".join(k for k, n in reasons if n),
    }


def at_risk_reasons(now: datetime) -> QuerySet[Any]:
    """Why each customer is at risk at ``now``, per product and currency code (``failing``,
    ``unsettled``, ``uncollectable``, as ``_at_risk``), ordered by identifier then customer so
    that a customer's rows are consecutive. The customers at risk of a filter are those with a
    row of its product and currency, their reasons the sums of those rows."""
    zero = Value(0, output_field=IntegerField())
    subs = (
        Subscription.objects.active(now)
        .filter(last_payment_status=PaymentStatus.FAILED, customer__isnull=False)
        .annotate(code=Upper("selected_currency"), identifier=F("customer__identifier"))
        .values("customer_id", "product_id", "code", "identifier")
        .annotate(failing=Count("pk"), unsettled=zero, uncollectable=zero)
    )
    invoices = (
        Invoice.objects.exclude(status__in=SETTLED_INVOICE_STATUSES)
        .filter(customer__isnull=False)
        .annotate(code=Upper("currency"), identifier=F("customer__identifier"))
        .values("customer_id", "product_id", "code", "identifier")
        .annotate(
            failing=zero,
            unsettled=Count("pk"),
            uncollectable=Count("pk", filter=Q(status=InvoiceStatus.UNCOLLECTABLE)),
        )
    )
    return (
        subs.order_by().union(invoices.order_by(), all=True).order_by("identifier", "customer_id")
    )
