"""The report: every figure of the dashboard for one filter, in a constant number of queries,
merged in Python into tables; money stays per currency. The closed months come from the
rollups (``rollups.py``), the current month from the rollups and what happened since, the
customers and the customers at risk from the rollups (as of their last refresh) when built.

    report = build_report(Period(months=12, product=None, currency="XOF"))
    report.tables()["monthly"].rows
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone

from ..display import format_money
from ..models import Product
from ..models.reports import AMOUNT_FIELDS, COUNT_FIELDS
from . import metrics
from . import rollups as rollups_module
from .metrics import Period, Rows

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


#: The counts of a month (the rollups' but the subscriptions at its start and end, and those
#: paying at its end, which MRR stands for) and its amounts.
COUNTS = tuple(n for n in COUNT_FIELDS if n not in ("active_start", "active_end", "paying_end"))
AMOUNTS = ("mrr", *AMOUNT_FIELDS)
MONTHLY = (*COUNTS, *AMOUNTS, "active_start", "active_end")

PRODUCT, CURRENCY = Column("product", "Product", "text"), Column("currency", "Currency", "text")
NEW = [
    Column("new", "New"),
    Column("reactivated", "Reactivated"),
    Column("cancellations", "Cancellations"),
]
#: Trials, payments and refunds of a period: the same columns in the overview and by month.
FLOW_COLUMNS = [
    Column("trials_ended", "Trials ended"),
    Column("trials_converted", "Trials converted"),
    Column("payments_completed", "Payments completed"),
    Column("paid_amount", "Paid", "money"),
    Column("payments_failed", "Payments failed"),
    Column("failed_amount", "Failed", "money"),
    Column("refunds", "Refunds"),
    Column("refunded_amount", "Refunded", "money"),
]
OVERVIEW_COLUMNS = [
    PRODUCT,
    CURRENCY,
    Column("active", "Active subscriptions"),
    Column("trialing", "In trial"),
    Column("mrr", "MRR", "money"),
    *NEW,
    Column("churn_rate", "Churn (period)", "rate"),
    *FLOW_COLUMNS,
]
MONTHLY_COLUMNS = [
    Column("month", "Month", "text"),
    PRODUCT,
    CURRENCY,
    Column("active_start", "Active at start"),
    *NEW,
    Column("churn_rate", "Churn", "rate"),
    Column("mrr", "MRR (end)", "money"),
    *FLOW_COLUMNS,
]
CUSTOMER_COLUMNS = [
    Column("identifier", "Customer", "text"),
    CURRENCY,
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
    #: the instant the customers at risk are as of: the rollups' last refresh, or ``None``
    #: when computed from the mirror at ``period.now``
    at_risk_at: datetime | None = None
    currencies: list[str] = field(default_factory=list)
    #: ``rollups.status()``, and ``used``: whether the closed months came from the rollups
    #: (else every month from the raw rows).
    rollups: dict[str, Any] = field(default_factory=dict)

    def product_name(self, product_id: int | None) -> str:
        return _name(self.products, product_id)

    def totals(self, currency: str) -> dict[str, Any]:
        """The "All products" overview row of one currency."""
        all_products = (r for r in self.overview if r["product"] == ALL_PRODUCTS)
        return next((r for r in all_products if r["currency"] == currency), {})

    def series(self, currency: str, key: str) -> list[tuple[str, Any]]:
        """``[(month, value), ...]`` of one monthly figure of one currency (all products)."""
        rows = {r["month"]: r for r in self.monthly if r["currency"] == currency}
        return [(m, rows.get(m, {}).get(key) or 0) for m in self.months]

    def tables(self) -> dict[str, Table]:
        return {
            name: Table(name, title, columns, getattr(self, name))
            for name, (title, columns) in TABLES.items()
        }


#: The tables of a report, by name (a ``Report`` attribute): title and columns.
TABLES = {
    "overview": ("By product and currency", OVERVIEW_COLUMNS),
    "monthly": ("Month by month (all products in the filter)", MONTHLY_COLUMNS),
    "monthly_by_product": ("Month by month, per product", MONTHLY_COLUMNS),
    "customers": ("Customers (top by lifetime paid)", CUSTOMER_COLUMNS),
    "at_risk": ("Customers at risk", AT_RISK_COLUMNS),
}


def _slot(rows: MutableMapping[Any, dict[str, Any]], key: Any, **init: Any) -> dict[str, Any]:
    """The row of ``key``, added with ``init`` and zero counts and amounts when missing."""
    if key not in rows:
        zeros = {**dict.fromkeys(COUNTS, 0), **dict.fromkeys(AMOUNTS, Decimal("0.00"))}
        rows[key] = {**init, **zeros}
    return rows[key]


def _merge(target: dict[str, Any], source: dict[str, Any], keys: Iterable[str]) -> None:
    for key in keys:
        if key in source:
            target[key] = target.get(key, 0) + source[key]


def monthly_figures(
    period: Period, prices: metrics.Prices, *, rollups: bool = True, current: Rows | None = None
) -> tuple[Rows, dict[str, Any]]:
    """The month-by-month rows of ``period``: from the rollups and what happened since their
    last refresh, or every month from the raw rows when the rollups are not for this month (or
    ``rollups=False``). And ``rollups.status()`` with ``used`` and ``current_used`` (the
    current month is from the rollups up to ``current_at``). ``current``: see
    ``rollups.closed_months``."""
    state = rollups_module.status()
    closed = rollups_module.closed_months(period, prices, state, current) if rollups else None
    if closed is None:
        since = None
        rows = [*metrics.subscription_history(period, prices), *metrics.flow_history(period)]
    else:  # the current month's subscriptions are in ``closed`` (carried over from the rollups)
        since = rollups_module.snapshot_at(period, state)
        rows = [*closed, *metrics.flow_history(replace(period, months=1), since)]
    return rows, {**state, "used": closed is not None, "current_used": since is not None}


def build_report(
    period: Period,
    *,
    customer_limit: int | None = 25,
    at_risk_limit: int | None = 50,
    rollups: bool = True,
) -> Report:
    """Run the report queries for ``period`` and assemble the tables (``rollups=False``: every
    month from the raw rows)."""
    products = dict(Product.objects.order_by().values_list("pk", "name"))
    prices = metrics.price_table()
    counts: Rows = []  # the current month's subscription figures per cycle, from the rollups
    figures, rollups_state = monthly_figures(period, prices, rollups=rollups, current=counts)
    if rollups_state["used"]:  # the customers as of the rollups' last refresh
        current = rollups_module.current_subscriptions(period, prices, counts)
        customers = rollups_module.customer_summary(period, limit=customer_limit)
    else:
        current = metrics.current_subscriptions(period, prices)
        customers = metrics.customer_summary(period, limit=customer_limit)
    at_risk_at = (
        rollups_module.at_risk_as_of(period, rollups_state, at_risk_limit) if rollups else None
    )
    if at_risk_at is not None and at_risk_limit is not None:
        at_risk, at_risk_total = rollups_module.customers_at_risk(period, at_risk_limit)
    else:  # from the mirror: every customer (the export), or no rollups for this instant
        at_risk = metrics.customers_at_risk(period, limit=at_risk_limit)
        at_risk_total = metrics.customers_at_risk_count(period)
    months = [metrics.month_key(m) for m in period.starts]

    # monthly, per product and per currency
    by_product: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in figures:
        if months[0] <= r["month"] <= months[-1]:
            key = (r["product_id"], r["currency"], r["month"])
            init = dict(zip(("product_id", "currency", "month"), key, strict=True))
            _merge(_slot(by_product, key, **init, active_start=0, active_end=0), r, MONTHLY)

    def finish(row: dict[str, Any]) -> dict[str, Any]:
        row["churn_rate"] = _rate(row["cancellations"], row["active_start"])
        return row

    monthly_by_product = sorted(
        (finish({**r, "product": _name(products, r["product_id"])}) for r in by_product.values()),
        key=lambda r: (r["month"], r["product"], r["currency"]),
    )
    overall: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in by_product.values():
        at = {"currency": r["currency"], "month": r["month"]}
        _merge(_slot(overall, tuple(at.values()), product=ALL_PRODUCTS, **at), r, MONTHLY)
    monthly = sorted(map(finish, overall.values()), key=lambda r: (r["currency"], r["month"]))

    # overview: per product and currency, plus "All products" per currency
    overview: dict[tuple[Any, ...], dict[str, Any]] = {}

    def overview_rows_of(r: dict[str, Any]) -> list[dict[str, Any]]:
        """The row of the product and the "All products" row of the currency."""
        init = {"currency": r["currency"], "active": 0, "trialing": 0, "unpriced": 0}
        name = _name(products, r["product_id"])
        return [
            _slot(overview, (p, r["currency"]), product=p, product_id=pk, **init, active_start=0)
            for p, pk in ((name, r["product_id"]), (ALL_PRODUCTS, None))
        ]

    for r in current:
        for row in overview_rows_of(r):
            _merge(row, r, ("active", "trialing", "unpriced", "mrr"))
    for r in by_product.values():
        for row in overview_rows_of(r):
            _merge(row, r, (*COUNTS, *AMOUNT_FIELDS))
            if r["month"] == months[0]:
                row["active_start"] += r["active_start"]
    overview_rows = sorted(
        map(finish, overview.values()),
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
        at_risk_at=at_risk_at,
        currencies=currencies,
        rollups=rollups_state,
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
