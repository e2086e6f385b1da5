"""The report: every figure of the dashboard for one filter, in a constant number of queries.

    from billing_integration.reporting.report import Period, build_report
    report = build_report(Period(months=12, product=None, currency="XOF"))
    report.tables()["monthly"].rows

Queries (always the same eleven, whatever the data size): products, prices (normalised to a
month), current subscriptions, subscription history, trials, payments, refunds, top
customers (figures, then details), customers at risk, and the count of customers at risk.
Python merges the grouped rows (a few per product, currency and month) into tables; money
stays per currency.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone

from ..display import format_money
from ..models import Product
from . import metrics
from .metrics import Period

__all__ = ["ALL_PRODUCTS", "Column", "Period", "Report", "Table", "build_report", "display"]

ALL_PRODUCTS = "All products"


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    kind: str = "int"  # int | money | rate | text | datetime


@dataclass
class Table:
    name: str
    title: str
    columns: list[Column]
    rows: list[dict[str, Any]]

    def values(self) -> list[list[Any]]:
        return [[row.get(c.key) for c in self.columns] for row in self.rows]


COUNTS = (
    "new",
    "cancellations",
    "trials_ended",
    "trials_converted",
    "payments_completed",
    "payments_failed",
    "payments_canceled",
    "refunds",
    "refunds_pending",
)
AMOUNTS = ("mrr", "paid_amount", "failed_amount", "refunded_amount")

#: Payments and refunds of a period: the same columns in the overview and the monthly table.
PAYMENT_FLOW_COLUMNS = [
    Column("payments_completed", "Payments completed"),
    Column("paid_amount", "Paid", "money"),
    Column("payments_failed", "Payments failed"),
    Column("failed_amount", "Failed", "money"),
    Column("refunds", "Refunds"),
    Column("refunded_amount", "Refunded", "money"),
]
OVERVIEW_COLUMNS = [
    Column("product", "Product", "text"),
    Column("currency", "Currency", "text"),
    Column("active", "Active subscriptions"),
    Column("trialing", "In trial"),
    Column("mrr", "MRR", "money"),
    Column("new", "New"),
    Column("cancellations", "Cancellations"),
    Column("churn_rate", "Churn (period)", "rate"),
    Column("trials_ended", "Trials ended"),
    Column("trials_converted", "Trials converted"),
    *PAYMENT_FLOW_COLUMNS,
]
MONTHLY_COLUMNS = [
    Column("month", "Month", "text"),
    Column("product", "Product", "text"),
    Column("currency", "Currency", "text"),
    Column("active_start", "Active at start"),
    Column("new", "New"),
    Column("cancellations", "Cancellations"),
    Column("churn_rate", "Churn", "rate"),
    Column("mrr", "MRR (end)", "money"),
    Column("trials_ended", "Trials ended"),
    Column("trials_converted", "Trials converted"),
    *PAYMENT_FLOW_COLUMNS,
]
CUSTOMER_COLUMNS = [
    Column("identifier", "Customer", "text"),
    Column("currency", "Currency", "text"),
    Column("lifetime_paid", "Lifetime paid", "money"),
    Column("active_subscriptions", "Current subscriptions"),
    Column("last_payment_status", "Last payment", "text"),
    Column("last_payment_at", "Last payment at", "datetime"),
    Column("failed_payments", "Failed payments"),
    Column("failed_amount", "Failed", "money"),
]
AT_RISK_COLUMNS = [
    Column("identifier", "Customer", "text"),
    Column("name", "Name", "text"),
    Column("email", "Email", "text"),
    Column("reasons", "Why", "text"),
    Column("failing_subscriptions", "Subscriptions with a failed payment"),
    Column("unpaid_invoices", "Unpaid invoices"),
    Column("uncollectable_invoices", "Uncollectable invoices"),
]


def _rate(numerator: int, denominator: int) -> Decimal | None:
    if not denominator:
        return None
    return (Decimal(numerator) / Decimal(denominator)).quantize(Decimal("0.0001"))


@dataclass
class Report:
    period: Period
    products: dict[int, str]
    months: list[str]
    overview: list[dict[str, Any]]
    monthly: list[dict[str, Any]]
    monthly_by_product: list[dict[str, Any]]
    customers: list[dict[str, Any]]
    at_risk: list[dict[str, Any]]
    at_risk_total: int
    currencies: list[str] = field(default_factory=list)

    def product_name(self, product_id: int | None) -> str:
        return _name(self.products, product_id)

    def totals(self, currency: str) -> dict[str, Any]:
        """The "All products" overview row of one currency."""
        for row in self.overview:
            if row["product"] == ALL_PRODUCTS and row["currency"] == currency:
                return row
        return {}

    def series(self, currency: str, key: str) -> list[tuple[str, Any]]:
        """``[(month, value), ...]`` of one monthly figure of one currency (all products)."""
        rows = {r["month"]: r for r in self.monthly if r["currency"] == currency}
        return [(m, rows.get(m, {}).get(key) or 0) for m in self.months]

    def tables(self) -> dict[str, Table]:
        return {
            "overview": Table(
                "overview", "By product and currency", OVERVIEW_COLUMNS, self.overview
            ),
            "monthly": Table(
                "monthly",
                "Month by month (all products in the filter)",
                MONTHLY_COLUMNS,
                self.monthly,
            ),
            "monthly_by_product": Table(
                "monthly_by_product",
                "Month by month, per product",
                MONTHLY_COLUMNS,
                self.monthly_by_product,
            ),
            "customers": Table(
                "customers", "Customers (top by lifetime paid)", CUSTOMER_COLUMNS, self.customers
            ),
            "at_risk": Table("at_risk", "Customers at risk", AT_RISK_COLUMNS, self.at_risk),
        }


def _blank(**keys: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict(keys)
    row.update({k: 0 for k in COUNTS})
    row.update({k: Decimal("0.00") for k in AMOUNTS})
    return row


def _merge(target: dict[str, Any], source: dict[str, Any], keys: Iterable[str]) -> None:
    for key in keys:
        if key in source:
            target[key] = target.get(key, 0) + source[key]


def build_report(
    period: Period, *, customer_limit: int | None = 25, at_risk_limit: int | None = 50
) -> Report:
    """Run the report queries for ``period`` and assemble the tables."""
    products = dict(Product.objects.order_by().values_list("pk", "name"))
    prices = metrics.price_table()
    current = metrics.current_subscriptions(period, prices)
    history = metrics.subscription_history(period, prices)
    trials = metrics.trial_history(period)
    payments = metrics.payment_history(period)
    refunds = metrics.refund_history(period)
    customers = metrics.customer_summary(period, limit=customer_limit)
    at_risk = metrics.customers_at_risk(period, limit=at_risk_limit)
    at_risk_total = metrics.customers_at_risk_count(period)
    months = [metrics.month_key(m) for m in period.starts]

    # --- monthly, per product and per currency -------------------------------------------
    by_product: dict[tuple[Any, ...], dict[str, Any]] = {}
    first_month, last_month = months[0], months[-1]

    def monthly_row(product_id: Any, currency: str, month: str) -> dict[str, Any]:
        key = (product_id, currency, month)
        if key not in by_product:
            by_product[key] = _blank(
                product_id=product_id, currency=currency, month=month, active_start=0, active_end=0
            )
        return by_product[key]

    for source in (history, trials, payments, refunds):
        for r in source:
            if first_month <= r["month"] <= last_month:
                _merge(
                    monthly_row(r["product_id"], r["currency"], r["month"]),
                    r,
                    (*COUNTS, *AMOUNTS, "active_start", "active_end"),
                )

    def finish(row: dict[str, Any]) -> dict[str, Any]:
        row["churn_rate"] = _rate(row["cancellations"], row["active_start"])
        return row

    monthly_by_product = sorted(
        (finish({**r, "product": _name(products, r["product_id"])}) for r in by_product.values()),
        key=lambda r: (r["month"], r["product"], r["currency"]),
    )
    overall: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in by_product.values():
        key = (r["currency"], r["month"])
        if key not in overall:
            overall[key] = _blank(
                product=ALL_PRODUCTS, currency=key[0], month=key[1], active_start=0, active_end=0
            )
        _merge(overall[key], r, (*COUNTS, *AMOUNTS, "active_start", "active_end"))
    monthly = sorted(
        (finish(r) for r in overall.values()), key=lambda r: (r["currency"], r["month"])
    )

    # --- overview: per product and currency, plus "All products" per currency -------------
    overview: dict[tuple[Any, ...], dict[str, Any]] = {}

    def overview_row(product: str, product_id: Any, currency: str) -> dict[str, Any]:
        key = (product, currency)
        if key not in overview:
            overview[key] = _blank(
                product=product,
                product_id=product_id,
                currency=currency,
                active=0,
                trialing=0,
                unpriced=0,
                active_start=0,
            )
        return overview[key]

    def overview_rows_of(r: dict[str, Any]) -> list[dict[str, Any]]:
        """The row of the product and the "All products" row of the currency."""
        own = overview_row(_name(products, r["product_id"]), r["product_id"], r["currency"])
        return [own, overview_row(ALL_PRODUCTS, None, r["currency"])]

    for r in current:
        for row in overview_rows_of(r):
            _merge(row, r, ("active", "trialing", "unpriced", "mrr"))
    for r in by_product.values():
        for row in overview_rows_of(r):
            _merge(row, r, tuple(k for k in (*COUNTS, *AMOUNTS) if k != "mrr"))
            if r["month"] == first_month:
                row["active_start"] += r["active_start"]
    for row in overview.values():
        row["churn_rate"] = _rate(row["cancellations"], row["active_start"])
    overview_rows = sorted(
        overview.values(),
        key=lambda r: (r["currency"], r["product"] == ALL_PRODUCTS, r["product"]),
    )
    currencies = sorted({r["currency"] for r in overview_rows})
    return Report(
        period=period,
        products=products,
        months=months,
        overview=overview_rows,
        monthly=monthly,
        monthly_by_product=monthly_by_product,
        customers=customers,
        at_risk=at_risk,
        at_risk_total=at_risk_total,
        currencies=currencies,
    )


def _name(products: dict[int, str], product_id: Any) -> str:
    if product_id is None:
        return "(unknown product)"
    return products.get(product_id, f"#{product_id}")


def display(value: Any, kind: str, currency: str | None = None) -> str:
    """A cell as text for a person (the dashboard and ``billing_report``): money in its row's
    currency, rates in per cent, local times; the CSV export keeps plain numbers."""
    if value is None:
        return "-"
    if kind == "money":
        if currency:
            return format_money(value, currency)
        return f"{Decimal(value):,.2f}"
    if kind == "rate":
        return f"{Decimal(value) * 100:.1f}%"
    if kind == "datetime" and isinstance(value, datetime):
        return timezone.localtime(value).strftime("%Y-%m-%d %H:%M")
    if kind == "int":
        return f"{value:,}"
    return str(value)
