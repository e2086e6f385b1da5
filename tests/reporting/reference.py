"""The reporting queries as they were before the histogram / ranking rewrite (metrics.py of
commit ece7782: conditional counts per month, TruncMonth, the full customer aggregate), kept
as the reference the current ones must agree with exactly (``test_equivalence``); and the
customers at risk read live from the mirror (metrics.py of commit a86ccca), the definition the
rollups of ``test_rollups`` must give. Slow on
large data, plain on purpose; not used by the app."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import (
    Count,
    DateTimeField,
    Exists,
    F,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.functions import Coalesce, TruncMonth, Upper

from billing_integration.models import (
    Customer,
    Invoice,
    InvoiceStatus,
    Payment,
    PaymentStatus,
    Refund,
    RefundStatus,
    Subscription,
)
from billing_integration.reporting.metrics import (
    Period,
    ended_at,
    money,
    month_key,
    price_table,
    started_at,
)


def active_at(t: datetime) -> Q:
    return Q(started__lte=t) & (Q(ended__isnull=True) | Q(ended__gt=t))


def _subscriptions(period: Period, qs: QuerySet | None = None) -> QuerySet:
    qs = Subscription.objects.all() if qs is None else qs
    qs = qs.annotate(currency=Upper("selected_currency"))
    if period.product:
        qs = qs.filter(product_id=period.product)
    if period.currency:
        qs = qs.filter(currency=period.currency)
    return qs.order_by()


def _records(
    model: type, period: Period, *, product: Any = None, lifetime: bool = False
) -> QuerySet:
    qs = model.objects.annotate(
        at=Coalesce("remote_created", "created_at", output_field=DateTimeField()),
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


def current_subscriptions(period: Period, prices: dict | None = None) -> list[dict[str, Any]]:
    """As before the rewrite."""
    now = period.now
    rows = (
        _subscriptions(period, Subscription.objects.active(now))
        .values("product_id", "selected_billing_cycle", "currency")
        .annotate(
            active=Count("pk"),
            trialing=Count("pk", filter=Q(trial_end_date__gt=now)),
        )
    )
    prices = price_table() if prices is None else prices
    return [
        {
            "product_id": r["product_id"],
            "cycle": r["selected_billing_cycle"],
            "currency": r["currency"],
            "active": r["active"],
            "trialing": r["trialing"],
            "unpriced": 0 if monthly is not None else r["active"],
            "mrr": money((r["active"] - r["trialing"]) * (monthly or 0)),
        }
        for r in rows
        for monthly in [prices.get((r["product_id"], r["selected_billing_cycle"], r["currency"]))]
    ]


def subscription_history(period: Period, prices: dict | None = None) -> list[dict[str, Any]]:
    """As before the rewrite."""
    bounds = period.bounds()
    aggregates: dict[str, Any] = {}
    # active at the start of month i = active at the end of month i - 1 (the same instant):
    # only the first start is counted on its own (11 fewer conditional counts for 12 months).
    aggregates["s0"] = Count("pk", filter=active_at(bounds[0][0]))
    for i, (start, end) in enumerate(bounds):
        aggregates[f"e{i}"] = Count("pk", filter=active_at(end))
        aggregates[f"n{i}"] = Count("pk", filter=Q(started__gte=start, started__lt=end))
        aggregates[f"c{i}"] = Count("pk", filter=Q(ended__gte=start, ended__lt=end))
        aggregates[f"p{i}"] = Count("pk", filter=active_at(end) & ~Q(trial_end_date__gt=end))
    rows = (
        _subscriptions(period)
        .annotate(started=started_at(), ended=ended_at(period.now))
        .values("product_id", "selected_billing_cycle", "currency")
        .annotate(**aggregates)
    )
    prices = price_table() if prices is None else prices
    back = reactivated(period)
    out: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        key = (r["product_id"], r["selected_billing_cycle"], r["currency"])
        monthly = prices.get(key, Decimal(0))
        for i, (start, _end) in enumerate(bounds):
            key = (r["product_id"], r["currency"], month_key(start))
            row = out.setdefault(
                key,
                {
                    "product_id": key[0],
                    "currency": key[1],
                    "month": key[2],
                    "active_start": 0,
                    "active_end": 0,
                    "new": 0,
                    "reactivated": back.get(key, 0),
                    "cancellations": 0,
                    "mrr": Decimal(0),
                },
            )
            row["active_start"] += r[f"s{i}"] if i == 0 else r[f"e{i - 1}"]
            row["active_end"] += r[f"e{i}"]
            row["new"] += r[f"n{i}"]
            row["cancellations"] += r[f"c{i}"]
            row["mrr"] += r[f"p{i}"] * monthly
    for row in out.values():
        row["mrr"] = money(row["mrr"])
    return sorted(out.values(), key=lambda r: (r["month"], str(r["product_id"]), r["currency"]))


def reactivated(period: Period) -> dict[tuple, int]:
    """Per (product, currency, month): the subscriptions new in the month whose customer had
    another subscription that started and ended at or before its start, and none active at
    its start (started at or before it and not ended at it). In Python, from every
    subscription's start and end (``ended_at(period.now)``), customer by customer."""
    every = Subscription.objects.annotate(started=started_at(), ended=ended_at(period.now))
    theirs: dict[Any, list[dict[str, Any]]] = {}
    for s in every.values("pk", "customer_id", "started", "ended"):
        theirs.setdefault(s["customer_id"], []).append(s)
    shown = _subscriptions(period).annotate(started=started_at())
    out: dict[tuple, int] = {}
    for s in shown.values("pk", "customer_id", "product_id", "currency", "started"):
        month = next((a for a, b in period.bounds() if a <= s["started"] < b), None)
        if month is None or s["customer_id"] is None:
            continue
        t = s["started"]
        earlier = [o for o in theirs[s["customer_id"]] if o["pk"] != s["pk"] and o["started"] <= t]
        churned = any(o["ended"] is not None and o["ended"] <= t for o in earlier)
        holding = any(o["ended"] is None or o["ended"] > t for o in earlier)
        if churned and not holding:
            key = (s["product_id"], s["currency"], month_key(month))
            out[key] = out.get(key, 0) + 1
    return out


def trial_history(period: Period) -> list[dict[str, Any]]:
    """As before the rewrite; converted also by a completed payment of the customer for the
    product since the trial started (a checkout that converted it, issue 27)."""
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
        .annotate(started=Coalesce("remote_created", "created_at"))
        .annotate(month=TruncMonth("trial_end_date"), converted=Exists(paid))
        .values("product_id", "currency", "month")
        .annotate(ended=Count("pk"), converted_n=Count("pk", filter=Q(converted=True)))
    )
    return [
        {
            "product_id": r["product_id"],
            "currency": r["currency"],
            "month": month_key(r["month"]),
            "trials_ended": r["ended"],
            "trials_converted": r["converted_n"],
        }
        for r in rows
    ]


# --- payments and refunds --------------------------------------------------------------------
def payment_history(period: Period) -> list[dict[str, Any]]:
    """As before the rewrite."""
    rows = (
        _records(Payment, period)
        .annotate(month=TruncMonth("at"))
        .values("product_id", "code", "month")
        .annotate(
            completed=Count("status", filter=Q(status=PaymentStatus.COMPLETED)),
            completed_amount=Sum("amount", filter=Q(status=PaymentStatus.COMPLETED)),
            failed=Count("status", filter=Q(status=PaymentStatus.FAILED)),
            failed_amount=Sum("amount", filter=Q(status=PaymentStatus.FAILED)),
            canceled=Count("status", filter=Q(status=PaymentStatus.CANCELED)),
        )
    )
    return [
        {
            "product_id": r["product_id"],
            "currency": r["code"],
            "month": month_key(r["month"]),
            "payments_completed": r["completed"],
            "paid_amount": money(r["completed_amount"]),
            "payments_failed": r["failed"],
            "failed_amount": money(r["failed_amount"]),
            "payments_canceled": r["canceled"],
        }
        for r in rows
    ]


def refund_history(period: Period) -> list[dict[str, Any]]:
    """As before the rewrite."""
    product = Coalesce("subscription__product_id", "payment__product_id")
    rows = (
        _records(Refund, period, product=product)
        .filter(status__in=(RefundStatus.APPROVED, RefundStatus.INITIATED))
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


# --- customers -------------------------------------------------------------------------------
def customer_summary(period: Period, limit: int | None = 25) -> list[dict[str, Any]]:
    """As before the rewrite."""
    figures = (
        _records(Payment, period, lifetime=True)
        .filter(customer__isnull=False)
        .values("customer_id", "code")
        .annotate(
            paid=Sum("amount", filter=Q(status=PaymentStatus.COMPLETED)),
            failed=Count("status", filter=Q(status=PaymentStatus.FAILED)),
            failed_amount=Sum("amount", filter=Q(status=PaymentStatus.FAILED)),
            last_payment_at=Max("at"),
        )
        .order_by(F("paid").desc(nulls_last=True), "customer_id", "code")
    )
    rows = list(figures if limit is None else figures[:limit])
    payments = Payment.objects.filter(customer=OuterRef("pk")).order_by()
    active = Subscription.objects.active(period.now).filter(customer=OuterRef("pk"))
    if period.product:
        payments = payments.filter(product_id=period.product)
        active = active.filter(product_id=period.product)
    details_qs = Customer.objects.annotate(
        last_status=Subquery(payments.order_by("-remote_created", "-pk").values("status")[:1]),
        active_n=Coalesce(
            Subquery(active.order_by().values("customer").annotate(n=Count("pk")).values("n")),
            0,
        ),
    ).values_list("pk", "identifier", "last_status", "active_n")
    if limit is not None:
        # the listed customers only (no query at all when there are none)
        details_qs = details_qs.filter(pk__in=[r["customer_id"] for r in rows])
    details = {pk: (ident, last, n) for pk, ident, last, n in details_qs}
    out = []
    for r in rows:
        ident, last, n = details.get(r["customer_id"], ("", "", 0))
        out.append(
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
        )
    return out


# --- customers at risk -----------------------------------------------------------------------
SETTLED = (InvoiceStatus.PAID, InvoiceStatus.VOID, InvoiceStatus.DELETED)


def _at_risk(period: Period) -> tuple[QuerySet, dict[str, Any]]:
    """Customers with an active subscription whose last payment failed, or with an invoice
    that is not paid, void or deleted; read from the mirror at ``period.now``."""
    subs = Subscription.objects.active(period.now).filter(last_payment_status=PaymentStatus.FAILED)
    invoices = Invoice.objects.exclude(status__in=SETTLED)
    if period.product:
        subs = subs.filter(product_id=period.product)
        invoices = invoices.filter(product_id=period.product)
    if period.currency:
        subs = subs.annotate(c=Upper("selected_currency")).filter(c=period.currency)
        invoices = invoices.annotate(c=Upper("currency")).filter(c=period.currency)
    subs, invoices = subs.order_by(), invoices.order_by()

    def count(qs: QuerySet) -> Coalesce:
        qs = qs.filter(customer=OuterRef("pk")).order_by().values("customer")
        return Coalesce(Subquery(qs.annotate(n=Count("pk")).values("n")), 0)

    customers = Customer.objects.filter(
        Q(pk__in=subs.values("customer_id")) | Q(pk__in=invoices.values("customer_id"))
    )
    return customers, {
        "failing_subscriptions": count(subs),
        "unpaid_invoices": count(invoices),
        "uncollectable_invoices": count(invoices.filter(status=InvoiceStatus.UNCOLLECTABLE)),
    }


def customers_at_risk_count(period: Period) -> int:
    return _at_risk(period)[0].order_by().count()


def customers_at_risk(period: Period, limit: int | None = 50) -> list[dict[str, Any]]:
    """By identifier, with the reasons."""
    customers, counts = _at_risk(period)
    qs = (
        customers.order_by("identifier", "pk")
        .annotate(**counts)
        .values("pk", "identifier", "first_name", "last_name", "email", *counts)
    )
    if limit is not None:
        qs = qs[:limit]
    out = []
    for r in qs:
        failing, uncollectable = r["failing_subscriptions"], r["uncollectable_invoices"]
        unpaid = r["unpaid_invoices"] - uncollectable
        reasons = [("failed payment", failing), ("uncollectable invoice", uncollectable)]
        out.append(
            {
                "customer_id": r["pk"],
                "identifier": r["identifier"],
                "name": f"{r['first_name']} {r['last_name']}".strip(),
                "email": r["email"],
                "failing_subscriptions": failing,
                "unpaid_invoices": unpaid,
                "uncollectable_invoices": uncollectable,
                "reasons": ", ".join(k for k, n in [*reasons, ("unpaid invoice", unpaid)] if n),
            }
        )
    return out
