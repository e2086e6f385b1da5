"""Reporting rollups: the figures of every closed month (and of the current month up to the
last refresh) per product, billing cycle and currency, and the customer tables, computed ahead
of time by the very queries of ``metrics`` and read by the report instead of every row.

Maintained by recomputing, never by counting: a change marks its months dirty
(``touch_reports``) and ``refresh`` recomputes them from the rows as they are, so replays,
out-of-order events and concurrent workers give the same result. See docs/reporting.md."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import date, datetime
from itertools import groupby
from operator import itemgetter
from typing import Any

from django.db import connection, transaction
from django.db.models import F, Max, Min, Q, QuerySet, Sum
from django.db.models.signals import post_delete, post_save
from django.utils import timezone

from ..models import (
    Customer,
    Payment,
    Refund,
    ReportAtRisk,
    ReportAtRiskCount,
    ReportCustomer,
    ReportMonth,
    ReportState,
    Subscription,
    active_statuses,
    mark_reports_dirty,
    month_of,
    touch_reports,
)
from ..models.reports import AMOUNT_FIELDS, COUNT_FIELDS, EPSILON, SUBSCRIPTION_FIELDS
from . import metrics
from .metrics import Period, Prices, Rows, changed_at, started_at

logger = logging.getLogger(__name__)

#: Months recomputed per batch (one pass over the subscriptions, one range of payments each).
BATCH_MONTHS = 12
#: Customers at risk kept per filter (the first by identifier): the dashboard lists 50.
AT_RISK_LISTED = 50


def basis_of(now: datetime) -> datetime:
    """The first instant (local time) of the month of ``now``: rollups cover the months
    before it."""
    return metrics.month_starts(1, now)[0]


def _local_start(month: date) -> datetime:
    return timezone.make_aware(datetime(month.year, month.month, 1))


def _add_months(month: date, n: int) -> date:
    i = month.year * 12 + month.month - 1 + n
    return date(i // 12, i % 12 + 1, 1)


def _months_between(first: date, end: date) -> int:
    return (end.year - first.year) * 12 + end.month - first.month


# --- computing -------------------------------------------------------------------------------
def compute(first: date, end: date, at: datetime) -> list[ReportMonth]:
    """The rollup rows of the months ``first`` .. ``end`` (excluded), the active rule judged
    at ``at``. Four grouped queries (the ``metrics`` ones), whatever the number of rows."""
    n = _months_between(first, end)
    if n <= 0:
        return []
    # n + 1 months up to the start of ``end``: the last one is empty and dropped
    period = Period(months=n + 1, now=_local_start(end))
    rows = _rollup_rows(metrics.subscription_counts(period, at=at), metrics.flow_history(period))
    return [r for r in rows if first <= r.month < end]


def _rollup_rows(subscriptions: Rows, flows: Rows) -> list[ReportMonth]:
    """``ReportMonth`` rows of ``subscription_counts`` rows (per cycle) and of trial, payment
    and refund rows (on the row of cycle ``""``)."""
    rows: dict[tuple[Any, ...], ReportMonth] = {}

    for r in [*subscriptions, *flows]:
        month = datetime.strptime(r["month"], "%Y-%m").date()
        cycle = r.get("cycle", "")  # flows have no cycle
        key = (month, r["product_id"], cycle, r["currency"])
        if key not in rows:
            rows[key] = ReportMonth(
                month=month, product_id=r["product_id"], cycle=cycle, currency=r["currency"]
            )
        for name in (*COUNT_FIELDS, *AMOUNT_FIELDS):
            if name in r:
                setattr(rows[key], name, getattr(rows[key], name) + r[name])
    return list(rows.values())


def compute_customers(now: datetime) -> None:
    """Replace the customer rollups: each customer's payments up to ``now`` per product and
    currency, then per currency for every product (from those rows). Two ``INSERT ...
    SELECT`` of the ORM's compiled queries: the rows never go through Python (``bulk_create``
    was far slower: benchmarks/RESULTS.md)."""
    ReportCustomer.objects.all().delete()
    payments = metrics.lifetime_payments(Period(months=1, now=now))
    per_product = metrics.customer_figures(payments, "customer_id", "product_id", "code")
    _insert_customers(per_product.order_by(), every=False)
    every_product = (
        ReportCustomer.objects.filter(all_products=False)
        .values("customer_id", code=F("currency"))
        .annotate(
            paid=Sum("paid"),
            failed=Sum("failed"),
            failed_amount=Sum("failed_amount"),
            last_payment_at=Max("last_payment_at"),
        )
        .order_by()
    )
    _insert_customers(every_product, every=True)


def _insert_customers(figures: QuerySet[Any], every: bool) -> None:
    table = ReportCustomer._meta.db_table
    sql, params = figures.query.sql_with_params()
    product = "NULL" if every else "q.product_id"
    columns = "customer_id, product_id, all_products, currency, paid, unpaid, failed, "
    columns += "failed_amount, last_payment_at"
    with connection.cursor() as cursor:
        # the ORM's compiled SQL; every value is a parameter
        cursor.execute(
            f"INSERT INTO {table} ({columns}) "  # noqa: S608
            f"SELECT q.customer_id, {product}, %s, q.code, q.paid, q.paid IS NULL, q.failed, "
            f"q.failed_amount, q.last_payment_at FROM ({sql}) q",
            (every, *params),
        )


def earliest_month(end: date) -> date:
    """The first month any subscription, payment or refund counts in (``end`` when there is
    none). Three aggregate queries."""
    subs = Subscription.objects.order_by().aggregate(
        a=Min(started_at()), b=Min(changed_at()), c=Min("cycle_end_date"), d=Min("trial_end_date")
    )
    found = [*subs.values()]
    for model in (Payment, Refund):
        found.append(model._default_manager.order_by().aggregate(a=Min(started_at()))["a"])
    months = [month_of(t - EPSILON) for t in found if t is not None]
    return min([*months, end])


def _lapsed_in_trial_between(old: datetime, new: datetime) -> QuerySet[Subscription]:
    """The subscriptions whose figures change when the active rule is judged at ``new`` instead
    of ``old``: a lapsed cycle (ended by ``old``) whose trial ended in between."""
    return Subscription.objects.filter(
        status__in=active_statuses(),
        cycle_end_date__lte=old,
        trial_end_date__gt=old,
        trial_end_date__lte=new,
    )


def _flipped_since(old: datetime, new: datetime) -> date | None:
    """The first month whose figures change when the active rule is judged at ``new`` instead
    of ``old``."""
    found = (
        _lapsed_in_trial_between(old, new)
        .order_by()
        .aggregate(first=Min("cycle_end_date"))["first"]
    )
    return month_of(found - EPSILON) if found else None


def _take_dirty() -> date | None:
    """Read and clear the dirty month (its own short transaction: a change marked after this
    is recomputed by the next refresh)."""
    ReportState.objects.get_or_create(name=ReportState.DIRTY)
    rows = ReportState.objects.filter(name=ReportState.DIRTY)
    while True:
        month = rows.values_list("month", flat=True).first()
        if month is None or rows.filter(month=month).update(month=None):
            return month


@dataclass
class Refreshed:
    months: int  # months recomputed
    first: date | None  # the first of them
    basis: date  # the rollups now cover the months before this one


def refresh(
    now: datetime | None = None,
    *,
    full: bool = False,
    recent_months: int = 0,
) -> Refreshed | None:
    """Bring the rollups up to date for ``now``: recompute the dirty months, the months closed
    since the last refresh, the last ``recent_months`` closed months (the reconciliation), or
    every month (``full``). ``None`` when another refresh holds the rollups: event processing
    never waits, it only marks months dirty, on another row."""
    now = now or timezone.now()
    basis = basis_of(now)
    end = basis.date()
    dirty = _take_dirty()
    try:
        with transaction.atomic():
            ReportState.objects.get_or_create(name=ReportState.ROLLUPS)
            state = (
                ReportState.objects.select_for_update(skip_locked=True)
                .filter(name=ReportState.ROLLUPS)
                .first()
            )
            if state is None:  # another refresh is running: it or the next one does these
                mark_reports_dirty(dirty)
                return None
            candidates = [dirty]
            if recent_months > 0:
                candidates.append(_add_months(end, -recent_months))
            if full or state.month is None or state.month > end:
                candidates.append(earliest_month(end))
            elif state.month < end:
                candidates += [state.month, _flipped_since(_local_start(state.month), basis)]
            first = min((m for m in candidates if m is not None), default=None)
            done = 0
            if first is not None:
                ReportMonth.objects.filter(month__gte=first).delete()
                start = first
                while start < end:  # ``BATCH_MONTHS`` at a time
                    stop = min(_add_months(start, BATCH_MONTHS), end)
                    ReportMonth.objects.bulk_create(compute(start, stop, basis), batch_size=1000)
                    done += _months_between(start, stop)
                    start = stop
                compute_customers(now)
            _snapshot_current_month(now)
            compute_at_risk(now)
            state.month, state.verified_at = end, timezone.now()
            state.save(update_fields=["month", "verified_at"])
    except BaseException:
        mark_reports_dirty(dirty)
        raise
    if done:
        logger.info("Report rollups: %d month(s) recomputed from %s.", done, first)
    return Refreshed(months=done, first=first, basis=end)


def _snapshot_current_month(now: datetime) -> None:
    """Store the current month's figures up to ``now`` (its ``ReportMonth`` rows and the
    ``current`` state row): the report then adds only what happened since. Redone by every
    refresh, since the month goes on."""
    end = basis_of(now).date()
    period = Period(months=1, now=now)
    closed = ReportMonth.objects.filter(month=_add_months(end, -1)).exclude(cycle="").order_by()
    closing = {  # the last closed month's subscription figures, per cycle
        (r["product_id"], r["cycle"], r["currency"]): r
        for r in closed.values("product_id", "cycle", "currency", *SUBSCRIPTION_FIELDS)
    }
    rows = _rollup_rows(current_month(period, closing), metrics.flow_history(period))
    ReportMonth.objects.filter(month__gte=end).delete()
    ReportMonth.objects.bulk_create(rows, batch_size=1000)
    ReportState.objects.update_or_create(
        name=ReportState.CURRENT, defaults={"month": end, "verified_at": now}
    )


def _at_risk_filters(product_id: int | None, code: str) -> list[tuple[int | None, str]]:
    """The filters of the report a (product, currency) counts in: ``None`` / ``""`` for every
    product / currency (there is no filter on a missing product or an empty code)."""
    products = [None] if product_id is None else [None, product_id]
    codes = [""] if not code else ["", code]
    return [(p, c) for p in products for c in codes]


def compute_at_risk(now: datetime) -> None:
    """Replace the customers at risk rollups with those at ``now``: per filter of the report
    (product, currency, both, none) their number and the first ``AT_RISK_LISTED`` by
    identifier. One pass over ``metrics.at_risk_reasons``, whose rows come grouped by customer,
    so the memory is the listed rows, not the customers."""
    totals: dict[tuple[int | None, str], int] = {}
    rows: dict[tuple[int | None, str], list[ReportAtRisk]] = {}
    reasons = metrics.at_risk_reasons(now).iterator(chunk_size=2000)
    for customer_id, group in groupby(reasons, key=itemgetter("customer_id")):
        counts: dict[tuple[int | None, str], list[int]] = {}
        identifier = ""
        for r in group:
            identifier = r["identifier"]
            for key in _at_risk_filters(r["product_id"], r["code"]):
                found = counts.setdefault(key, [0, 0, 0])
                for i, name in enumerate(("failing", "unsettled", "uncollectable")):
                    found[i] += r[name]
        for key, (failing, unsettled, uncollectable) in counts.items():
            totals[key] = totals.get(key, 0) + 1
            listed_rows = rows.setdefault(key, [])
            if len(listed_rows) < AT_RISK_LISTED:
                listed_rows.append(
                    ReportAtRisk(
                        product_id=key[0],
                        currency=key[1],
                        position=len(listed_rows) + 1,
                        customer_id=customer_id,
                        identifier=identifier,
                        failing_subscriptions=failing,
                        unsettled_invoices=unsettled,
                        uncollectable_invoices=uncollectable,
                    )
                )
    everyone = [r for listed_rows in rows.values() for r in listed_rows]
    details = {
        pk: (f"{first} {last}".strip(), email)
        for pk, first, last, email in Customer.objects.filter(
            pk__in={r.customer_id for r in everyone}
        ).values_list("pk", "first_name", "last_name", "email")
    }
    for r in everyone:
        r.name, r.email = details.get(r.customer_id, ("", ""))
    ReportAtRisk.objects.all().delete()
    ReportAtRiskCount.objects.all().delete()
    ReportAtRisk.objects.bulk_create(everyone, batch_size=1000)
    ReportAtRiskCount.objects.bulk_create(
        [ReportAtRiskCount(product_id=p, currency=c, customers=n) for (p, c), n in totals.items()],
        batch_size=1000,
    )
    ReportState.objects.update_or_create(name=ReportState.AT_RISK, defaults={"verified_at": now})


def rebuild(since: date | None = None, now: datetime | None = None) -> Refreshed | None:
    """Recompute the rollups of every month (``since``: of that month and after)."""
    if since is None:
        return refresh(now, full=True)
    mark_reports_dirty(since)
    return refresh(now)


# --- reading ---------------------------------------------------------------------------------
def status() -> dict[str, Any]:
    """What the rollups cover: ``basis`` (the months before it), ``verified_at`` (when last
    recomputed), ``current_month`` and ``current_at`` (they hold that month up to that
    instant), ``at_risk_at`` (the customers at risk rollups are as of that instant), and
    ``pending_from`` (the first month a change since touched, or ``None``). One query."""
    rows = ReportState.objects.order_by().values_list("name", "month", "verified_at")
    state = defaultdict(lambda: (None, None), {name: (month, at) for name, month, at in rows})
    return {
        "at_risk_at": state[ReportState.AT_RISK][1],
        "basis": state[ReportState.ROLLUPS][0],
        "verified_at": state[ReportState.ROLLUPS][1],
        "current_month": state[ReportState.CURRENT][0],
        "current_at": state[ReportState.CURRENT][1],
        "pending_from": state[ReportState.DIRTY][0],
    }


def snapshot_at(period: Period, state: dict[str, Any]) -> datetime | None:
    """The instant the rollups hold the current month of ``period`` up to (the last
    refresh), or ``None`` when they do not (another month, or a report of an earlier
    instant)."""
    at = state.get("current_at")
    if at is None or state.get("current_month") != basis_of(period.now).date():
        return None
    return at if at <= period.now else None


def closed_months(
    period: Period,
    prices: Prices,
    state: dict[str, Any] | None = None,
    current: Rows | None = None,
) -> Rows | None:
    """The rows (as the ``metrics`` histories) of the period's closed months from the rollups,
    and of its current month: its subscription figures at the last refresh (else the last
    closed month's end) corrected by the subscriptions that moved since, and its trials,
    payments and refunds up to the last refresh (the report adds those since). ``None`` when
    the rollups are not for the month of ``period.now``. ``state``: ``status()`` when already
    read; ``current`` receives the current month's subscription figures per cycle."""
    basis = basis_of(period.now)
    end = basis.date()
    state = state or status()
    if state["basis"] != end:
        return None
    since = snapshot_at(period, state)
    last = _add_months(end, -1)
    shown = month_of(period.start)
    qs = ReportMonth.objects.filter(month__gte=min(shown, last), month__lte=end)
    if period.product:
        qs = qs.filter(product_id=period.product)
    if period.currency:
        qs = qs.filter(currency=period.currency)
    names = (*COUNT_FIELDS, *AMOUNT_FIELDS)
    flow_names = tuple(n for n in names if n not in SUBSCRIPTION_FIELDS)
    carried: dict[tuple[Any, ...], dict[str, Any]] = {}  # per cycle: see current_month
    flows: Rows = []  # the current month's trials, payments and refunds up to ``since``
    shown_rows: Rows = []
    for r in qs.order_by().values("month", "product_id", "cycle", "currency", *names):
        key3 = (r["product_id"], r["cycle"], r["currency"])
        if r["month"] == end:
            if since is not None and r["cycle"]:
                carried[key3] = r
            elif since is not None:
                flow = {n: r[n] for n in ("product_id", "currency", *flow_names)}
                flows.append({**flow, "month": metrics.month_key(basis)})
            continue
        if r["month"] == last and since is None and r["cycle"]:
            carried[key3] = r
        if r["month"] >= shown:
            shown_rows.append({**r, "month": r["month"].strftime("%Y-%m")})
    out = {
        (r["product_id"], r["currency"], r["month"]): r
        for r in metrics.with_mrr(shown_rows, prices, names)
    }
    for correction in _lapsed_in_trial(period, basis):
        fixed = out.get((correction["product_id"], correction["currency"], correction["month"]))
        if fixed is not None:
            for name in LAPSE_CORRECTED:
                fixed[name] += correction[name]
    subscriptions = current_month(period, carried, since)
    if current is not None:
        current.extend(subscriptions)
    return [*out.values(), *metrics.with_mrr(subscriptions, prices), *flows]


def touching(start: datetime, now: datetime) -> QuerySet[Subscription]:
    """The subscriptions whose figures may differ between ``start`` (the rules judged then)
    and any instant up to ``now``: started since, ended since (a status or a lapsed cycle),
    or out of trial since. Index ranges, bounded by the activity since ``start``."""
    active = active_statuses()
    return Subscription.objects.alias(started=started_at(), changed=changed_at()).filter(
        Q(started__gte=start)
        | (~Q(status__in=active) & Q(changed__gte=start))
        | Q(status__in=active, cycle_end_date__gte=start, cycle_end_date__lte=now)
        | Q(trial_end_date__gt=start, trial_end_date__lte=now)
    )


def current_month(
    period: Period, carried: dict[tuple[Any, ...], dict[str, Any]], since: datetime | None = None
) -> Rows:
    """The current month's ``metrics.subscription_counts`` rows at ``period.now`` without
    reading every subscription: ``carried``, the figures at ``since`` (the last refresh) or,
    with ``since`` ``None``, the last closed month's (its end is this month's start),
    corrected by the subscriptions that ``touching`` finds."""
    basis = basis_of(period.now)
    start = basis if since is None else since
    moved = touching(start, period.now)

    def counts(at: datetime) -> dict[tuple[Any, ...], dict[str, Any]]:
        month = replace(period, months=1, now=at)
        rows = metrics.subscription_counts(month, qs=moved, at=at)
        return {(r["product_id"], r["cycle"], r["currency"]): r for r in rows}

    then, now = counts(start), counts(period.now)  # the moved ones at the start, and now
    month = metrics.month_key(basis)
    rows = []
    for key in {*carried, *then, *now}:
        old, new, before = then.get(key, {}), now.get(key, {}), carried.get(key, {})
        if since is not None:  # the figures at ``since``, the moved ones replaced
            figures = {
                n: before.get(n, 0) - old.get(n, 0) + new.get(n, 0) for n in SUBSCRIPTION_FIELDS
            }
        else:  # the last closed month's end, the moved ones replaced by their figures now
            steady = before.get("active_end", 0) - old.get("active_end", 0)
            paying = before.get("paying_end", 0) - old.get("paying_end", 0)
            base = {"active_start": steady, "active_end": steady, "paying_end": paying}
            figures = {n: base.get(n, 0) + new.get(n, 0) for n in SUBSCRIPTION_FIELDS}
        rows.append(
            {"product_id": key[0], "cycle": key[1], "currency": key[2], "month": month, **figures}
        )
    return rows


def current_subscriptions(period: Period, prices: Prices, counts: Rows) -> Rows:
    """``metrics.current_subscriptions`` from the current month's figures at ``period.now``
    (``current_month`` rows): active now is active at the month's end, in trial is active
    but not paying; plus the active subscriptions that start after now (one index range)."""
    rows = metrics.current_subscriptions(period, prices, future_only=True)
    for r in counts:
        active, trialing = r["active_end"], r["active_end"] - r["paying_end"]
        key = (r["product_id"], r["cycle"], r["currency"])
        rows.append(metrics.current_row(key, active, trialing, prices))
    return rows


def at_risk_as_of(period: Period, state: dict[str, Any], limit: int | None) -> datetime | None:
    """The instant the customers at risk rollups hold ``period``'s figures as of (the last
    refresh), or ``None`` when they cannot give them: never computed, of another month than
    ``period.now`` or after it (a report of an earlier instant), or more rows asked than they
    keep (``limit`` ``None``: every customer, as the CSV export)."""
    at: datetime | None = state.get("at_risk_at")
    if at is None or limit is None or limit > AT_RISK_LISTED:
        return None
    if at > period.now or basis_of(at) != basis_of(period.now):
        return None
    return at


def customers_at_risk(period: Period, limit: int) -> tuple[Rows, int]:
    """``metrics.customers_at_risk`` (the first ``limit``, at most ``AT_RISK_LISTED``) and
    ``metrics.customers_at_risk_count`` of ``period``'s filter from the rollups, as of the
    last refresh (``at_risk_as_of``). Two queries, index ranges of the filter."""
    key = {"product_id": period.product or None, "currency": period.currency or ""}
    total = ReportAtRiskCount.objects.filter(**key).values_list("customers", flat=True).first() or 0
    listed = ReportAtRisk.objects.filter(**key, position__lte=max(limit, 0)).order_by("position")
    rows = [metrics.at_risk_row(r) for r in listed.values()]
    return rows, total


def customer_summary(period: Period, limit: int | None = 25) -> Rows:
    """``metrics.customer_summary`` from the customer rollups: the figures up to the last
    refresh, ranked through an index; the details of the listed customers live."""
    qs = ReportCustomer.objects.filter(all_products=not period.product)
    qs = qs.filter(product_id=period.product or None)
    if period.currency:
        qs = qs.filter(currency=period.currency)
    # the index's order from its first column: PostgreSQL does not take ``product_id IS
    # NULL`` as an equality, so without it it sorts every row of the filter (140 ms at
    # 10,000,000 payments, 0.3 ms so; benchmarks/RESULTS.md)
    qs = qs.order_by(
        "all_products", "product_id", "unpaid", F("paid").desc(), "customer_id", "currency"
    )
    if limit is not None:
        qs = qs[: max(limit, 0)]
    rows = [
        {**r, "code": r["currency"]}
        for r in qs.values(
            "customer_id", "currency", "paid", "failed", "failed_amount", "last_payment_at"
        )
    ]
    return metrics.with_customer_details(rows, period, limit is not None)


#: The figures ``_lapsed_in_trial`` corrects.
LAPSE_CORRECTED = ("active_start", "active_end", "reactivated", "cancellations", "mrr")


def _lapsed_in_trial(period: Period, basis: datetime) -> Rows:
    """The change to the closed months between the active rule judged at ``basis`` and at
    ``period.now``: a lapsed cycle whose trial ended since, and the reactivations of its
    customer's later subscriptions, which it no longer holds back. Rare: one query, five more
    only when there is one."""
    if period.now <= basis or period.start >= basis:
        return []
    qs = _lapsed_in_trial_between(basis, period.now)
    if not qs.exists():
        return []
    closed = replace(period, now=basis)
    prices = metrics.price_table()
    # the customers' subscriptions: only their reactivation changes (came_back)
    theirs = Subscription.objects.filter(customer__in=qs.values("customer_id"))
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    own = tuple(n for n in LAPSE_CORRECTED if n != "reactivated")
    for changed, names in ((qs, own), (theirs, ("reactivated",))):
        before, after = (
            metrics.with_mrr(metrics.subscription_counts(closed, qs=changed, at=at), prices)
            for at in (basis, period.now)
        )
        old = {(r["product_id"], r["currency"], r["month"]): r for r in before}
        for r in after:
            key = (r["product_id"], r["currency"], r["month"])
            o = old.get(key, {})
            row = out.setdefault(key, {**r, **dict.fromkeys(LAPSE_CORRECTED, 0)})
            for name in names:
                row[name] += r[name] - o.get(name, 0)
    return list(out.values())


# --- keeping them up to date -----------------------------------------------------------------
def record_saved(sender: Any, instance: Any, **kwargs: Any) -> None:
    """A subscription, payment or refund saved or deleted: its months are dirty."""
    if kwargs.get("raw"):
        return
    touch_reports([instance], using=kwargs.get("using") or "default")


for _model in (Subscription, Payment, Refund):
    post_save.connect(record_saved, sender=_model, dispatch_uid=f"billing_reports_{_model}")
    post_delete.connect(record_saved, sender=_model, dispatch_uid=f"billing_reports_{_model}_del")


__all__ = [
    "Refreshed",
    "at_risk_as_of",
    "closed_months",
    "compute_at_risk",
    "customer_summary",
    "customers_at_risk",
    "rebuild",
    "refresh",
    "status",
    "touch_reports",
]
