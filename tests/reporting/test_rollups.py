"""The rollups give the figures of the definition (``reference.py``, the from-scratch queries)
for every month: on the hand-made edge cases, and over randomised histories applied as a
worker would (saves, so the change hooks run) with events out of order, replays, subscriptions
that change product, cycle or currency, customers coming back after churning (reactivated),
late payments for closed months, instants on month
boundaries, and a time zone with daylight saving time; and the customers at risk, as of each
refresh, equal to the live query (``reference.customers_at_risk``) for every filter, with
invoices, several customers and the rollups' bound reached. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any
from unittest.mock import patch

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import HealthCheck, Phase, event, example, given, settings, target
from hypothesis import strategies as st

from billing_integration.models import (
    Customer,
    Invoice,
    Payment,
    Refund,
    ReportMonth,
    ReportState,
    Subscription,
)
from billing_integration.reporting import rollups
from billing_integration.reporting.metrics import Period
from billing_integration.reporting.report import MONTHLY, build_report
from billing_integration.reporting.rollups import refresh

from . import reference
from .conftest import NOW, build_world, dt, make_product, make_subscription
from .test_equivalence import MIDNIGHT, add_edge_cases

pytestmark = pytest.mark.django_db

FIGURES = tuple(k for k in MONTHLY if k not in ("payments_canceled", "refunds_pending"))


def _merged(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Rows per (product, currency, month), the non-zero figures only (a missing row and a
    row of zeros say the same)."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        key = (r.get("product_id"), r["currency"], r["month"])
        slot = out.setdefault(key, {})
        for name in MONTHLY:
            if name in r:
                slot[name] = slot.get(name, 0) + r[name]
    return {k: {n: v for n, v in s.items() if v} for k, s in out.items() if any(s.values())}


def oracle(period: Period) -> dict[tuple[Any, ...], dict[str, Any]]:
    return _merged(
        [
            *reference.subscription_history(period),
            *reference.trial_history(period),
            *reference.payment_history(period),
            *reference.refund_history(period),
        ]
    )


def from_rollups(period: Period) -> dict[tuple[Any, ...], dict[str, Any]]:
    report = build_report(period, customer_limit=0, at_risk_limit=0)
    return _merged(report.monthly_by_product)


def assert_at_risk_as_of(period: Period, at: datetime, *, page: bool = True) -> None:
    """The customers at risk of ``period``'s filter, read from the rollups, are those of the
    definition at ``at`` (the last refresh): the count, and the list as the page shows it
    (``limit`` ``AT_RISK_LISTED``, through ``build_report`` when ``page``) and shorter."""
    definition = Period(
        months=period.months, product=period.product, currency=period.currency, now=at
    )
    total = reference.customers_at_risk_count(definition)
    if page:
        report = build_report(period, customer_limit=0, at_risk_limit=rollups.AT_RISK_LISTED)
        assert report.at_risk_at == at, period
        listed = reference.customers_at_risk(definition, rollups.AT_RISK_LISTED)
        assert (report.at_risk, report.at_risk_total) == (listed, total), period
    for limit in (rollups.AT_RISK_LISTED, 1, 0):
        assert rollups.at_risk_as_of(period, rollups.status(), limit) == at
        listed = reference.customers_at_risk(definition, limit)
        assert rollups.customers_at_risk(period, limit) == (listed, total), (period, limit)


def assert_equal_to_the_definition(period: Period, customers: bool = True) -> None:
    """The monthly figures; and the customers table and the customers at risk (as of the last
    refresh: ``customers`` when that was at ``period.now``), the table whole and its top 3."""
    assert rollups.closed_months(period, {}) is not None, "the report must read the rollups"
    assert from_rollups(period) == oracle(period), period
    if customers:
        for limit in (None, 3):
            report = build_report(period, customer_limit=limit, at_risk_limit=0)
            assert report.rollups["used"]
            assert report.customers == reference.customer_summary(period, limit), (period, limit)
        assert_at_risk_as_of(period, period.now)


# --- the hand-made edge cases ----------------------------------------------------------------
@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
@pytest.mark.parametrize("now", [NOW, MIDNIGHT, MIDNIGHT + timedelta(microseconds=1)])
def test_the_rollups_give_the_definition_on_the_edge_cases(zone, now):
    world = build_world()
    add_edge_cases(world)
    with timezone.override(zone):
        refresh(now)
        assert ReportMonth.objects.exists()
        for period in [
            Period(now=now),
            Period(now=now, months=1),
            Period(now=now, months=36),
            Period(now=now, currency="usd"),
            Period(now=now, product=world.p1.pk, months=6),
        ]:
            assert_equal_to_the_definition(period)


def test_the_report_reads_the_rollups_and_a_change_marks_its_month_dirty():
    world = build_world()
    refresh(NOW)
    period = Period(now=NOW)
    march = world.payments["PM1"]  # 2025-03-03, the payment of S4 (trial ended 2025-03-03)
    # a change the hooks do not see (a queryset update): the rollups keep the old figure
    Payment.objects.filter(pk=march.pk).update(amount=Decimal(1))
    assert from_rollups(period) != oracle(period)
    assert build_report(period).monthly != build_report(period, rollups=False).monthly
    # a save marks March dirty; the refresh recomputes March and after, not before
    march.save()
    assert ReportState.objects.get(name=ReportState.DIRTY).month == date(2025, 3, 1)
    february = list(ReportMonth.objects.filter(month=date(2025, 2, 1)).values_list("pk"))
    done = refresh(NOW)
    assert done is not None and (done.first, done.months) == (date(2025, 3, 1), 3)
    assert list(ReportMonth.objects.filter(month=date(2025, 2, 1)).values_list("pk")) == february
    assert ReportState.objects.get(name=ReportState.DIRTY).month is None
    assert from_rollups(period) == oracle(period)


def test_the_reconciliation_recomputes_the_last_closed_months_whatever_was_marked():
    """A change no hook saw (a queryset update) stays in the rollups until the hourly
    reconciliation recomputes the last closed months, marked or not."""
    world = build_world()
    refresh(NOW)
    period = Period(now=NOW)
    march = world.payments["PM1"]  # 2025-03-03
    Payment.objects.filter(pk=march.pk).update(amount=Decimal(1))
    assert refresh(NOW).months == 0  # nothing marked: nothing recomputed
    assert from_rollups(period) != oracle(period)
    done = refresh(NOW, recent_months=2)  # April and May: March stays as it was
    assert (done.first, done.months) == (date(2025, 4, 1), 2)
    assert from_rollups(period) != oracle(period)
    done = refresh(NOW, recent_months=4)
    assert (done.first, done.months) == (date(2025, 2, 1), 4)
    assert from_rollups(period) == oracle(period)


def test_the_beat_schedule_reconciles_the_last_closed_months_every_hour():
    from billing_integration.reporting.tasks import refresh_report_rollups
    from billing_integration.schedule import BEAT_SCHEDULE, RECONCILED_MONTHS

    entry = BEAT_SCHEDULE["billing-reconcile-report-rollups"]
    assert entry["task"] == refresh_report_rollups.name
    assert (entry["schedule"], entry["kwargs"]) == (3600.0, {"recent_months": RECONCILED_MONTHS})
    with patch.object(rollups, "refresh", return_value=None) as called:
        refresh_report_rollups(**entry["kwargs"])
    called.assert_called_once_with(recent_months=RECONCILED_MONTHS)


def test_the_next_month_is_computed_when_it_closes_and_a_lapsed_trial_is_corrected_live():
    world = build_world()
    refresh(NOW)
    # a cycle that ended in May while in a trial that ends after the rollups' basis (June 1)
    make_subscription(
        world.p1,
        world.customers["c1"],
        dt(2025, 4, 1),
        cycle_end_date=dt(2025, 5, 1),
        trial_end_date=dt(2025, 6, 10),
    )
    refresh(NOW - timedelta(days=10))  # June 5: in trial, so not ended (the basis: June 1)
    assert rollups._lapsed_in_trial(Period(now=NOW), rollups.basis_of(NOW))
    # June 15: the trial has ended since (the customers are those of June 5)
    assert_equal_to_the_definition(Period(now=NOW), customers=False)
    refresh(dt(2025, 7, 2))  # July: June closes
    assert ReportMonth.objects.filter(month=date(2025, 6, 1)).exists()
    assert_equal_to_the_definition(Period(now=dt(2025, 7, 2)))


def test_a_report_of_another_month_than_the_rollups_is_computed_live():
    build_world()
    refresh(NOW)
    assert rollups.closed_months(Period(now=dt(2025, 4, 20)), {}) is None
    report = build_report(Period(now=dt(2025, 4, 20)))
    assert report.monthly == build_report(Period(now=dt(2025, 4, 20)), rollups=False).monthly


def test_a_refresh_while_another_holds_the_rollups_keeps_the_dirty_month(django_db_blocker):
    build_world()
    refresh(NOW)
    Payment.objects.first().save()
    dirty = ReportState.objects.get(name=ReportState.DIRTY).month
    assert dirty is not None
    # the rollups row is locked by "another refresh": simulated by removing it from view
    ReportState.objects.filter(name=ReportState.ROLLUPS).update(name="held")
    original = ReportState.objects.get_or_create

    def held(**kwargs: Any) -> Any:
        ReportState.objects.filter(name=ReportState.ROLLUPS).delete()
        return (None, False)

    ReportState.objects.get_or_create = held  # type: ignore[method-assign]
    try:
        assert refresh(NOW) is None
    finally:
        ReportState.objects.get_or_create = original  # type: ignore[method-assign]
    assert ReportState.objects.get(name=ReportState.DIRTY).month == dirty


def test_billing_report_rebuild_since_a_month(capsys):
    build_world()
    call_command("billing_report", "--rebuild")
    first = capsys.readouterr().out
    assert "month(s) of rollups" in first
    assert ReportMonth.objects.filter(month=date(2023, 6, 1)).exists()  # S6 started then
    kept = set(ReportMonth.objects.filter(month__lt=date(2025, 1, 1)).values_list("pk", flat=True))
    call_command("billing_report", "--rebuild", "--since", "2025-01")
    assert "from 2025-01" in capsys.readouterr().out
    assert kept <= set(ReportMonth.objects.values_list("pk", flat=True))
    with pytest.raises(Exception, match="not a month"):
        call_command("billing_report", "--rebuild", "--since", "January")


def test_the_hooks_add_a_constant_number_of_statements_per_saved_record():
    world = build_world()
    refresh(NOW)
    sub = world.subs["S1"]
    counts = []
    for _ in range(3):
        with CaptureQueriesContext(connection) as ctx:
            Payment.objects.create(
                remote_id=uuid.uuid4(),
                remote_created=dt(2025, 5, 2),
                status="completed",
                amount=Decimal(5),
                currency="XOF",
                subscription=sub,
                product=world.p1,
            )
        counts.append(sum("report" in q["sql"] or "trial_end" in q["sql"] for q in ctx))
    # the earliest trial end the payment may convert, the UPDATE of the dirty month (that
    # matches nothing once the month is as early)
    assert counts == [2, 2, 2]
    assert ReportState.objects.get(name=ReportState.DIRTY).month == date(2025, 5, 1)


def test_a_payment_marks_the_month_of_the_trial_it_converts_through_the_customer_and_product():
    """Issue 25: a completed payment converts the trials of its customer for its product that
    started before it (``metrics.trial_history``), not only its own subscription's: its save
    marks the month such a trial ended in, or that month keeps the trial unconverted."""
    world = build_world()
    customer = Customer.objects.create(identifier="t25", remote_id=uuid.uuid4())
    make_subscription(  # a trial that ended in June 2024, never paid for itself
        world.p2,
        customer,
        dt(2024, 5, 21, 11),
        selected_currency="usd",
        status="expired",
        remote_updated=dt(2024, 12, 24, 21),
        trial_end_date=dt(2024, 6, 17, 11),
        cycle_end_date=dt(2024, 11, 10, 11),
    )
    later = make_subscription(  # another subscription of the customer, later
        world.p2,
        customer,
        dt(2024, 7, 20),
        selected_billing_cycle="months-3",
        trial_end_date=dt(2024, 7, 26),
    )
    with timezone.override("Europe/Paris"):
        refresh(NOW)
        period = Period(now=NOW, months=15)
        june = (world.p2.pk, "USD", "2024-06")
        assert "trials_converted" not in from_rollups(period)[june]
        Payment.objects.create(  # paid in August for the later subscription: converts both
            remote_id=uuid.uuid4(),
            remote_created=dt(2024, 8, 1, 0),
            status="completed",
            amount=Decimal(5000),
            currency="XOF",
            customer=customer,
            subscription=later,
            product=world.p2,
        )
        assert ReportState.objects.get(name=ReportState.DIRTY).month == date(2024, 6, 1)
        refresh(NOW)
        assert from_rollups(period)[june]["trials_converted"] == 1
        assert_equal_to_the_definition(period, customers=False)


def test_a_change_marks_the_months_a_subscription_counted_in_before_it():
    """A trial end before the start counts in an earlier month than the start: moving it
    marks that month dirty too, whether the subscription was read from the database or is
    the instance last saved."""
    world = build_world()
    start = dt(2024, 11, 10)
    sub = make_subscription(
        world.p1,
        world.customers["c1"],
        start,
        trial_end_date=start - timedelta(days=15),  # October 26
    )
    period = Period(now=NOW, months=15)
    october = (world.p1.pk, "XOF", "2024-10")
    refresh(NOW)
    assert from_rollups(period)[october]["trials_ended"] == oracle(period)[october]["trials_ended"]
    read = Subscription.objects.get(pk=sub.pk)  # read: the October trial end is known
    read.trial_end_date = None
    read.save()
    assert ReportState.objects.get(name=ReportState.DIRTY).month == date(2024, 10, 1)
    refresh(NOW)
    assert_equal_to_the_definition(period, customers=False)
    sub.trial_end_date = start - timedelta(days=40)  # the instance saved first: October again
    sub.save()
    refresh(NOW)
    assert_equal_to_the_definition(period, customers=False)
    sub.trial_end_date = start  # and back (the instance knows the month it last marked)
    sub.save()
    assert ReportState.objects.get(name=ReportState.DIRTY).month == date(2024, 10, 1)
    refresh(NOW)
    assert_equal_to_the_definition(period, customers=False)


# --- randomised histories --------------------------------------------------------------------
ZONES = ("UTC", "America/Sao_Paulo", "Europe/Paris")
BASE = datetime(2025, 6, 1, tzinfo=UTC)

#: The fields the subscriptions of the issue 25 example share.
ISSUE_25 = {
    "product": 1,
    "cycle": "months-1",
    "currency": "XOF",
    "status": "expired",
    "ended": None,
    "trial_days": None,
    "cycle_days": None,
    "customer": 0,
    "last_payment": None,
}


@st.composite
def instants(draw: Any) -> datetime:
    """An instant from 14 months before BASE to 2 months after: often exactly a month's
    first instant in the site's time zone, else some hours into a month."""
    month = draw(st.integers(min_value=-14, max_value=2))
    i = BASE.year * 12 + BASE.month - 1 + month
    start = timezone.make_aware(datetime(i // 12, i % 12 + 1, 1))
    if draw(st.booleans()):
        return start
    return start + timedelta(hours=draw(st.integers(min_value=1, max_value=24 * 30)))


subscription_states = st.fixed_dictionaries(
    {
        "product": st.sampled_from([0, 1, None]),
        "cycle": st.sampled_from(["months-1", "years-1", "months-3"]),
        "currency": st.sampled_from(["XOF", "USD", "usd"]),
        "status": st.sampled_from(["published", "canceled", "expired", "paused"]),
        "ended": st.none() | instants(),
        "trial_days": st.none() | st.integers(min_value=-20, max_value=60),
        "cycle_days": st.none() | st.integers(min_value=1, max_value=400),
        "customer": st.sampled_from([0, 1, 2, 3, None]),
        "last_payment": st.sampled_from(["failed", "completed", None]),
    }
)
operations = st.one_of(
    st.tuples(st.just("subscription"), st.integers(0, 3), subscription_states),
    st.tuples(
        st.just("payment"),
        st.integers(0, 3),
        st.fixed_dictionaries(
            {
                "at": instants(),
                "status": st.sampled_from(["completed", "failed", "canceled", "pending"]),
                "amount": st.sampled_from([Decimal(5000), Decimal("10.50"), None]),
            }
        ),
    ),
    st.tuples(
        st.just("refund"),
        st.integers(0, 3),
        st.fixed_dictionaries(
            {"days": st.integers(0, 200), "status": st.sampled_from(["approved", "initiated"])}
        ),
    ),
    st.tuples(
        st.just("invoice"),
        st.integers(0, 3),
        st.fixed_dictionaries(
            {
                "status": st.sampled_from(
                    ["paid", "void", "deleted", "uncollectable", "open", "unpaid"]
                ),
                "currency": st.sampled_from(["XOF", "usd", "USD", ""]),
                "product": st.sampled_from([0, 1, None]),
                "customer": st.sampled_from([0, 1, 2, 3, None]),
            }
        ),
    ),
    # the subscription of a slot (made when missing) ends and its customer subscribes again
    # (another slot, from 4): a reactivation, unless the customer holds another one then
    st.tuples(
        st.just("return"),
        st.integers(0, 3),
        st.fixed_dictionaries(
            {
                "lasted": st.integers(0, 200),
                "gap": st.sampled_from([timedelta(0), timedelta(hours=1), timedelta(days=40)]),
                "product": st.sampled_from([0, 1, None]),
            }
        ),
    ),
    st.tuples(st.just("replay"), st.integers(0, 50), st.just({})),
    st.tuples(st.just("refresh"), st.just(0), st.just({})),
)


@pytest.fixture
def catalogue() -> dict[str, Any]:
    p1 = make_product("Pro", {("months", 1): {1: "5000", 2: "10.00"}, ("years", 1): {1: "54000"}})
    p2 = make_product("Team", {("months", 3): {1: "15000", 2: "30.00"}})
    customers = [
        Customer.objects.create(identifier=identifier, remote_id=uuid.uuid4(), **names)
        for identifier, names in [
            ("h1", {}),
            ("h2", {"first_name": "Awa", "email": "awa@example.com"}),
            ("h2", {"last_name": "Diop"}),  # the same identifier: ordered by pk
            ("a0", {"first_name": "Ibou", "last_name": "Sarr", "email": "i@example.com"}),
        ]
    ]
    return {"products": [p1, p2], "customer": customers[0], "customers": customers}


def assert_at_risk_equal_to_the_definition(refreshed: datetime, products: list[Any]) -> None:
    """Every filter of products and currencies (one with nobody at risk), read just after the
    refresh at ``refreshed`` and a minute later (still as of ``refreshed``); the rollups keep
    two customers per filter here, so the bound is reached."""
    for product in (None, *products):
        for currency in (None, "USD", "xof", "EUR"):
            for later in (0, 60):
                period = Period(
                    now=refreshed + timedelta(seconds=later),
                    product=product and product.pk,
                    currency=currency,
                )
                page = product is None and currency is None
                assert_at_risk_as_of(period, refreshed, page=page)


@settings(
    max_examples=int(os.environ.get("ROLLUP_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
)
@given(
    zone=st.sampled_from(ZONES),
    starts=st.lists(instants(), min_size=4, max_size=4),
    ops=st.lists(operations, min_size=1, max_size=25),
    now_shift=st.sampled_from([0, 1, 14 * 24 * 3600 + 7]),
)
@example(  # issue 25: the August payment converts the June trial (same customer, product)
    zone="Europe/Paris",
    starts=[
        datetime(2024, 5, 21, 11, tzinfo=UTC),
        datetime(2024, 8, 19, tzinfo=UTC),
        datetime(2025, 6, 1, tzinfo=UTC),
        datetime(2024, 11, 1, tzinfo=UTC),
    ],
    ops=[
        ("subscription", 0, {**ISSUE_25, "trial_days": 27, "cycle_days": 173, "currency": "usd"}),
        (
            "subscription",
            2,
            {
                **ISSUE_25,
                "status": "published",
                "cycle": "months-3",
                "ended": datetime(2024, 9, 1, tzinfo=UTC),
                "trial_days": 6,
            },
        ),
        ("refund", 0, {"status": "approved", "days": 35}),
        ("refund", 1, {"status": "approved", "days": 109}),
        (
            "subscription",
            1,
            {
                **ISSUE_25,
                "cycle": "months-3",
                "currency": "usd",
                "ended": datetime(2024, 12, 24, 21, tzinfo=UTC),
            },
        ),
        ("refresh", 0, {}),
        ("refund", 3, {"status": "approved", "days": 131}),
        ("refund", 1, {"status": "initiated", "days": 1}),
        (
            "payment",
            2,
            {
                "at": datetime(2024, 8, 1, tzinfo=UTC),
                "amount": Decimal(5000),
                "status": "completed",
            },
        ),
    ],
    now_shift=1,
)
def test_randomised_histories_give_the_definition(catalogue, zone, starts, ops, now_shift):
    for model in (Refund, Payment, Invoice, Subscription, ReportMonth, ReportState):
        model.objects.all().delete()
    products, customer = catalogue["products"], catalogue["customer"]
    people = catalogue["customers"]
    invoices: dict[int, Invoice] = {}
    with timezone.override(zone):
        now = timezone.make_aware(datetime(2025, 6, 1)) + timedelta(seconds=now_shift)
        subs: dict[int, Subscription] = {}
        saved: list[Any] = []
        periods = [Period(now=now, months=m) for m in (1, 2, 15)]
        periods += [Period(now=now, currency="USD"), Period(now=now, product=products[0].pk)]
        for kind, slot, state in ops:
            if kind == "subscription":
                start = starts[slot]
                sub = subs.get(slot) or Subscription(
                    customer=customer, remote_id=uuid.uuid4(), remote_created=start
                )
                sub.customer = None if state["customer"] is None else people[state["customer"]]
                sub.last_payment_status = state["last_payment"]
                sub.product = None if state["product"] is None else products[state["product"]]
                sub.selected_billing_cycle = state["cycle"]
                sub.selected_currency = state["currency"]
                sub.status = state["status"]
                # an end, when there is one, is not before the start
                sub.remote_updated = max(state["ended"], start) if state["ended"] else None
                days = state["trial_days"]
                sub.trial_end_date = None if days is None else start + timedelta(days=days)
                days = state["cycle_days"]
                sub.cycle_end_date = None if days is None else start + timedelta(days=days)
                sub.save()
                subs[slot] = sub
                saved.append(sub)
            elif kind == "return":
                sub = subs.get(slot) or Subscription(
                    customer=people[slot],
                    remote_id=uuid.uuid4(),
                    remote_created=starts[slot],
                    product=products[0],
                    selected_billing_cycle="months-1",
                    selected_currency="XOF",
                )
                subs[slot] = sub
                sub.status = "expired"
                sub.remote_updated = sub.remote_created + timedelta(days=state["lasted"])
                sub.save()
                again = Subscription.objects.create(
                    customer=sub.customer,
                    remote_id=uuid.uuid4(),
                    remote_created=sub.remote_updated + state["gap"],
                    product=None if state["product"] is None else products[state["product"]],
                    selected_billing_cycle="months-1",
                    selected_currency=sub.selected_currency,
                    status="published",
                    cycle_end_date=sub.remote_updated + timedelta(days=60),
                )
                subs[4 + slot] = again
                saved += [sub, again]
            elif kind == "payment" and slot in subs:
                sub = subs[slot]
                payment = Payment.objects.create(
                    remote_id=uuid.uuid4(),
                    remote_created=state["at"],
                    status=state["status"],
                    amount=state["amount"],
                    currency=sub.selected_currency,
                    customer=customer,
                    subscription=sub,
                    product=sub.product,
                )
                saved.append(payment)
            elif kind == "refund" and slot in subs:
                sub = subs[slot]
                payment = sub.payments.order_by("pk").first()
                refund = Refund.objects.create(
                    remote_id=uuid.uuid4(),
                    remote_created=sub.remote_created + timedelta(days=state["days"]),
                    status=state["status"],
                    amount=Decimal(7),
                    currency=sub.selected_currency,
                    subscription=sub,
                    payment=payment,
                )
                saved.append(refund)
            elif kind == "invoice":
                invoice = invoices.get(slot) or Invoice(remote_id=uuid.uuid4(), amount=Decimal(9))
                invoice.status, invoice.currency = state["status"], state["currency"]
                invoice.product = None if state["product"] is None else products[state["product"]]
                invoice.customer = None if state["customer"] is None else people[state["customer"]]
                invoice.save()
                invoices[slot] = invoice
            elif kind == "replay" and saved:
                saved[slot % len(saved)].save()  # the same event applied again
            elif kind == "refresh":
                with patch.object(rollups, "AT_RISK_LISTED", 2):
                    refresh(now)
                    assert_at_risk_equal_to_the_definition(now, products)
                for period in periods:
                    assert_equal_to_the_definition(period)
        with patch.object(rollups, "AT_RISK_LISTED", 2):
            refresh(now)
            assert_at_risk_equal_to_the_definition(now, products)
        refresh(now)
        for period in periods:
            assert_equal_to_the_definition(period)
        # customers coming back after churning: the search aims for histories that have some
        back = sum(r["reactivated"] for r in reference.subscription_history(periods[2]))
        event(f"reactivated: {min(back, 2)}")
        target(float(back), label="reactivated")


@pytest.mark.django_db(transaction=True)
def test_a_pull_marks_the_months_of_the_pulled_subscriptions(billing_sandbox):
    from billing_integration.sync.pull import pull_customers, pull_products, pull_subscriptions

    billing_sandbox.seed(customers=2, subscriptions=3)
    ReportState.objects.update_or_create(name=ReportState.DIRTY, defaults={"month": None})
    pull_products()
    pull_customers()
    assert ReportState.objects.get(name=ReportState.DIRTY).month is None  # no subscription yet
    assert pull_subscriptions().created == 3  # bulk writes: no signal, the pull's own call
    starts = [s.remote_created or s.created_at for s in Subscription.objects.all()]
    first = min(starts) - timedelta(microseconds=1)
    assert ReportState.objects.get(name=ReportState.DIRTY).month == (
        timezone.localtime(first).date().replace(day=1)
    )
    now = timezone.now()
    refresh(now)
    assert ReportState.objects.get(name=ReportState.DIRTY).month is None
    assert_equal_to_the_definition(Period(now=now))
    assert oracle(Period(now=now, months=1))  # the pulled subscriptions are in the figures


def test_the_current_month_is_the_last_refresh_plus_what_happened_since():
    world = build_world()
    refreshed = NOW - timedelta(days=5)  # June 10
    refresh(refreshed)
    assert ReportMonth.objects.filter(month=date(2025, 6, 1)).exists()
    assert rollups.status()["current_at"] == refreshed
    # since the refresh: a subscription starts (in trial until June 14), pays, is refunded;
    # another one is paused
    sub = make_subscription(
        world.p1,
        world.customers["c1"],
        NOW - timedelta(days=3),
        cycle_end_date=dt(2025, 7, 12),
        trial_end_date=NOW - timedelta(days=1),
    )
    payment = Payment.objects.create(
        remote_id=uuid.uuid4(),
        remote_created=NOW - timedelta(days=1),
        status="completed",
        amount=Decimal(5000),
        currency="XOF",
        customer=world.customers["c1"],
        subscription=sub,
        product=world.p1,
    )
    Refund.objects.create(
        remote_id=uuid.uuid4(),
        remote_created=NOW - timedelta(hours=3),
        status="approved",
        amount=Decimal(7),
        currency="XOF",
        subscription=sub,
        payment=payment,
    )
    active = Subscription.objects.active(NOW).filter(selected_currency="XOF")
    canceled = active.exclude(pk=sub.pk).order_by("pk").first()
    assert canceled is not None
    canceled.status = "paused"
    canceled.save()  # the hooks; then the date of the event (``save`` keeps the stored one)
    Subscription.objects.filter(pk=canceled.pk).update(remote_updated=NOW - timedelta(days=2))
    for period in (Period(now=NOW), Period(now=NOW, months=1), Period(now=NOW, currency="XOF")):
        report = build_report(period, customer_limit=0, at_risk_limit=0)
        assert report.rollups["current_used"]
        assert from_rollups(period) == oracle(period)
        # active now, in trial, MRR: from the rollups' figures, as computed live
        assert report.overview == build_report(period, rollups=False).overview
    june = {r["currency"]: r for r in build_report(Period(now=NOW)).monthly}["XOF"]
    before = {r["currency"]: r for r in build_report(Period(now=refreshed)).monthly}["XOF"]
    assert june["new"] == before["new"] + 1
    assert june["cancellations"] == before["cancellations"] + 1
    assert june["payments_completed"] == before["payments_completed"] + 1
    assert (june["trials_ended"], june["trials_converted"]) == (1, 1)
    assert june["refunds"] == before["refunds"] + 1
    # a report of an instant before the refresh reads the month from the last closed one
    earlier = Period(now=refreshed - timedelta(days=1))
    assert not build_report(earlier, customer_limit=0).rollups["current_used"]
    assert from_rollups(earlier) == oracle(earlier)


def test_a_late_record_for_the_current_month_waits_for_the_next_refresh():
    world = build_world()
    refresh(NOW)
    late = Payment.objects.create(  # dated before the refresh, applied after it
        remote_id=uuid.uuid4(),
        remote_created=NOW - timedelta(days=2),
        status="completed",
        amount=Decimal(5000),
        currency="XOF",
        customer=world.customers["c1"],
        product=world.p1,
    )
    period = Period(now=NOW + timedelta(minutes=1))
    report = build_report(period)
    assert report.rollups["pending_from"] == date(2025, 6, 1)  # said on the dashboard
    assert from_rollups(period) != oracle(period)
    refresh(period.now)
    assert from_rollups(period) == oracle(period)
    june = {r["currency"]: r for r in build_report(period).monthly}["XOF"]
    assert june["paid_amount"] >= late.amount


# --- reactivated -----------------------------------------------------------------------------
def _sub(product: Any, customer: Any, start: datetime, **state: Any) -> Subscription:
    values = {"selected_billing_cycle": "months-3", "cycle_end_date": dt(2026, 1, 1), **state}
    return make_subscription(product, customer, start, **values)


def _march(period: Period, *, rollups: bool = True) -> dict[str, Any]:
    """The Team / XOF row of March 2025, per product."""
    report = build_report(period, customer_limit=0, at_risk_limit=0, rollups=rollups)
    rows = [r for r in report.monthly_by_product if r["month"] == "2025-03"]
    return next(r for r in rows if r["product"] == "Team" and r["currency"] == "XOF")


def test_a_customer_coming_back_after_churning_is_reactivated_an_upgrade_is_not(capsys):
    pro = make_product("Pro", {("months", 1): {1: "5000"}})
    team = make_product("Team", {("months", 3): {1: "15000"}})
    back, upgrading, holding = (
        Customer.objects.create(identifier=i, remote_id=uuid.uuid4()) for i in ("b", "u", "h")
    )
    canceled = {"status": "expired", "remote_updated": dt(2025, 2, 5)}
    # churned in February, back in March on another product: reactivated
    churned = _sub(pro, back, dt(2025, 1, 10), **canceled)
    _sub(team, back, dt(2025, 3, 3))
    # an upgrade: the old subscription ends after the new one starts
    _sub(pro, upgrading, dt(2025, 1, 10), status="expired", remote_updated=dt(2025, 3, 4))
    _sub(team, upgrading, dt(2025, 3, 3))
    # one ended before, another still active at the new one's start
    _sub(pro, holding, dt(2025, 1, 10), **canceled)
    _sub(pro, holding, dt(2024, 12, 1))
    _sub(team, holding, dt(2025, 3, 3))
    period = Period(now=NOW)
    live = _march(period, rollups=False)
    assert (live["new"], live["reactivated"]) == (3, 1)
    refresh(NOW)
    assert _march(period) == live
    assert_equal_to_the_definition(period, customers=False)
    assert {r["currency"]: r for r in build_report(period).overview if r["product"] == "Team"}[
        "XOF"
    ]["reactivated"] == 1
    # shown: the CSV export and billing_report
    call_command("billing_report", "--csv", "monthly_by_product", "--at", NOW.isoformat())
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split(",")
    march = next(line.split(",") for line in lines if line.startswith("2025-03,Team,XOF"))
    assert march[header.index("reactivated")] == "1"
    call_command("billing_report", "--at", NOW.isoformat(), "--customers", "0")
    assert "Reactivated" in capsys.readouterr().out
    # the earlier subscription of the customer is live again (an event): its months are dirty
    # (from its start, before the new one's), and the next refresh drops the reactivation
    churned.status, churned.remote_updated = "published", None
    churned.save()
    assert ReportState.objects.get(name=ReportState.DIRTY).month == date(2025, 1, 1)
    refresh(NOW)
    assert _march(period)["reactivated"] == 0
    assert_equal_to_the_definition(period, customers=False)
    # and deleted: the customer came back after nothing, so not reactivated either
    churned.delete()
    refresh(NOW)
    assert (_march(period)["new"], _march(period)["reactivated"]) == (3, 0)


def test_a_reactivation_a_trial_ending_since_the_basis_reveals_is_corrected_live():
    team = make_product("Team", {("months", 3): {1: "15000"}})
    customer = Customer.objects.create(identifier="t", remote_id=uuid.uuid4())
    # a cycle that ended in February while in a trial that ends after the basis (June 1)
    _sub(
        team,
        customer,
        dt(2025, 1, 10),
        cycle_end_date=dt(2025, 2, 10),
        trial_end_date=dt(2025, 6, 10),
    )
    _sub(team, customer, dt(2025, 3, 3))
    refresh(NOW - timedelta(days=10))  # June 5: in trial, so still holding the customer
    assert ReportMonth.objects.get(month=date(2025, 3, 1)).reactivated == 0
    assert _march(Period(now=NOW - timedelta(days=10)))["reactivated"] == 0
    # June 15: the trial has ended, the cycle lapsed in February: back in March
    assert _march(Period(now=NOW))["reactivated"] == 1
    assert_equal_to_the_definition(Period(now=NOW), customers=False)
