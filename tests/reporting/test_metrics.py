"""Figures of the report against hand-computed expectations (see conftest.World)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal as D

import pytest
from django.test import override_settings

from billing_integration.models import Subscription
from billing_integration.reporting import metrics
from billing_integration.reporting.report import ALL_PRODUCTS, Period, build_report

from .conftest import NOW

pytestmark = pytest.mark.django_db

MONTHS = [
    "2024-07",
    "2024-08",
    "2024-09",
    "2024-10",
    "2024-11",
    "2024-12",
    "2025-01",
    "2025-02",
    "2025-03",
    "2025-04",
    "2025-05",
    "2025-06",
]

# Worked out by hand from the fixture table in conftest.py.
XOF_ACTIVE_START = [1, 1, 1, 2, 2, 2, 2, 3, 4, 4, 3, 3]
XOF_NEW = [0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1]  # S1 09, S2 01, S4 02, S8 06
XOF_CANCEL = [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0]  # S7 lapsed 2025-04-03
# MRR at month end: S7 5000 until it lapses, S1 5000 from 09, S2 4500 (54000/12) from 01,
# S4 5000 (15000/3) once its trial ended (03-03); S8 still in trial in 06.
XOF_MRR = [
    "5000",
    "5000",
    "10000",
    "10000",
    "10000",
    "10000",
    "14500",
    "14500",
    "19500",
    "14500",
    "14500",
    "14500",
]
USD_ACTIVE_START = [1, 1, 1, 1, 1, 2, 2, 2, 2, 1, 2, 1]
USD_NEW = [0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0]  # S3 11, S5 04
USD_CANCEL = [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0]  # S3 03-15, S5 05-12
USD_MRR = ["10", "10", "10", "10", "20", "20", "20", "20", "10", "10", "10", "10"]


@pytest.fixture
def report(world):
    return build_report(Period(now=NOW))


def test_months_of_the_period():
    assert [metrics.month_key(m) for m in Period(now=NOW).starts] == MONTHS
    assert [metrics.month_key(m) for m in Period(months=3, now=NOW).starts] == [
        "2025-04",
        "2025-05",
        "2025-06",
    ]


def test_current_active_subscriptions_and_mrr(report, world):
    rows = {(r["product"], r["currency"]): r for r in report.overview}
    assert rows[("Pro", "XOF")]["active"] == 2  # S1, S2
    assert rows[("Pro", "XOF")]["mrr"] == D("9500.00")  # 5000 + 54000/12
    assert rows[("Pro", "USD")]["active"] == 1  # S6 (S3 canceled)
    assert rows[("Pro", "USD")]["mrr"] == D("10.00")  # 120/12
    assert rows[("Team", "XOF")]["active"] == 2  # S4, S8 (trial)
    assert rows[("Team", "XOF")]["trialing"] == 1
    assert rows[("Team", "XOF")]["mrr"] == D("5000.00")  # 15000/3, S8 in trial adds nothing
    assert rows[("Team", "USD")]["active"] == 0  # S5 canceled
    assert rows[(ALL_PRODUCTS, "XOF")]["active"] == 4
    assert rows[(ALL_PRODUCTS, "XOF")]["mrr"] == D("14500.00")
    assert rows[(ALL_PRODUCTS, "USD")]["active"] == 1
    assert rows[(ALL_PRODUCTS, "USD")]["mrr"] == D("10.00")
    assert report.currencies == ["USD", "XOF"]


def test_active_now_is_the_documented_rule(world):
    """The report's active count is ``Subscription.objects.active()`` and the history's
    reconstruction agrees with it at ``now``."""
    active = Subscription.objects.active(NOW)
    assert set(active.values_list("pk", flat=True)) == {
        world.subs[k].pk for k in ("S1", "S2", "S4", "S6", "S8")
    }
    current = sum(r["active"] for r in metrics.current_subscriptions(Period(now=NOW)))
    history = metrics.subscription_history(Period(now=NOW))
    assert current == active.count() == 5
    assert sum(r["active_end"] for r in history if r["month"] == "2025-06") == 5


#: Under ``ACCESS_AFTER_CANCEL = "period_end"`` (the default): S3 (canceled 03-15) keeps access
#: until its cycle end 04-20, S5 (canceled 05-12) until 05-10; the other rows are as above.
USD_ACTIVE_START_PERIOD_END = [1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 1]
USD_CANCEL_PERIOD_END = [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0]


@pytest.fixture(autouse=True)
def cancel_ends_access(settings):
    """The hand-worked figures above count a cancel when it happens (``"immediately"``)."""
    settings.BILLING = {**settings.BILLING, "ACCESS_AFTER_CANCEL": "immediately"}


def test_a_cancel_counts_at_the_cycle_end_under_period_end(world, settings):
    settings.BILLING = {**settings.BILLING, "ACCESS_AFTER_CANCEL": "period_end"}
    report = build_report(Period(now=NOW))
    assert [v for _, v in report.series("USD", "active_start")] == USD_ACTIVE_START_PERIOD_END
    assert [v for _, v in report.series("USD", "cancellations")] == USD_CANCEL_PERIOD_END
    assert [v for _, v in report.series("XOF", "active_start")] == XOF_ACTIVE_START
    # S3 is canceled with its cycle ended: no grace at NOW, the active count is unchanged
    assert sum(r["active"] for r in metrics.current_subscriptions(Period(now=NOW))) == 5
    in_grace = datetime(2025, 4, 1, tzinfo=UTC)
    assert world.subs["S3"] in Subscription.objects.active(in_grace)
    assert world.subs["S3"] not in Subscription.objects.active(datetime(2025, 4, 21, tzinfo=UTC))


def test_monthly_figures_per_currency(report):
    for cur, active, new, cancel, mrr in (
        ("XOF", XOF_ACTIVE_START, XOF_NEW, XOF_CANCEL, XOF_MRR),
        ("USD", USD_ACTIVE_START, USD_NEW, USD_CANCEL, USD_MRR),
    ):
        assert [m for m, _ in report.series(cur, "active_start")] == MONTHS
        assert [v for _, v in report.series(cur, "active_start")] == active, cur
        assert [v for _, v in report.series(cur, "new")] == new, cur
        assert [v for _, v in report.series(cur, "cancellations")] == cancel, cur
        assert [v for _, v in report.series(cur, "mrr")] == [D(x) for x in mrr], cur


def test_churn_rate(report):
    rows = {(r["currency"], r["month"]): r for r in report.monthly}
    assert rows[("XOF", "2025-04")]["churn_rate"] == D("0.2500")  # 1 of 4
    assert rows[("USD", "2025-03")]["churn_rate"] == D("0.5000")  # 1 of 2
    assert rows[("USD", "2025-05")]["churn_rate"] == D("0.5000")  # 1 of 2
    assert rows[("XOF", "2025-05")]["churn_rate"] == D("0.0000")
    overview = {(r["product"], r["currency"]): r for r in report.overview}
    # period churn: cancellations of the 12 months / active at the start of the period
    assert overview[(ALL_PRODUCTS, "USD")]["cancellations"] == 2
    assert overview[(ALL_PRODUCTS, "USD")]["churn_rate"] == D("2.0000")  # 2 of 1 at start
    assert overview[(ALL_PRODUCTS, "XOF")]["churn_rate"] == D("1.0000")  # 1 of 1
    assert overview[("Team", "XOF")]["churn_rate"] is None  # nobody at the start


def test_trials(report):
    rows = {(r["product"], r["currency"], r["month"]): r for r in report.monthly_by_product}
    assert rows[("Team", "XOF", "2025-03")]["trials_ended"] == 1  # S4
    assert rows[("Team", "XOF", "2025-03")]["trials_converted"] == 1  # paid PM1
    assert rows[("Team", "USD", "2025-05")]["trials_ended"] == 1  # S5
    assert rows[("Team", "USD", "2025-05")]["trials_converted"] == 0  # only a failed payment
    # S8's trial ends in July: not counted
    assert sum(r["trials_ended"] for r in report.monthly) == 2
    assert sum(r["trials_converted"] for r in report.monthly) == 1


def test_payments(report):
    rows = {(r["currency"], r["month"]): r for r in report.monthly}
    assert rows[("XOF", "2025-05")]["payments_completed"] == 1
    assert rows[("XOF", "2025-05")]["payments_failed"] == 1
    assert rows[("XOF", "2025-05")]["failed_amount"] == D("5000.00")
    assert rows[("XOF", "2025-01")]["paid_amount"] == D("54000.00")
    assert rows[("USD", "2025-06")]["payments_failed"] == 1
    assert rows[("USD", "2025-06")]["failed_amount"] == D("120.00")
    assert rows[("USD", "2025-06")]["payments_canceled"] == 1
    overview = {(r["product"], r["currency"]): r for r in report.overview}
    xof, usd = overview[(ALL_PRODUCTS, "XOF")], overview[(ALL_PRODUCTS, "USD")]
    # PM9 (2024-05) is before the period
    assert (xof["payments_completed"], xof["paid_amount"]) == (4, D("79000.00"))
    assert (xof["payments_failed"], xof["failed_amount"]) == (1, D("5000.00"))
    assert (usd["payments_completed"], usd["paid_amount"]) == (1, D("10.00"))
    assert (usd["payments_failed"], usd["failed_amount"]) == (2, D("150.00"))
    assert overview[("Team", "USD")]["failed_amount"] == D("30.00")


def test_refunds(report):
    rows = {(r["currency"], r["month"]): r for r in report.monthly}
    assert rows[("XOF", "2025-04")]["refunds"] == 1
    assert rows[("XOF", "2025-04")]["refunded_amount"] == D("5000.00")
    assert rows[("USD", "2025-01")]["refunds"] == 0
    assert rows[("USD", "2025-01")]["refunds_pending"] == 1
    overview = {(r["product"], r["currency"]): r for r in report.overview}
    assert overview[("Pro", "XOF")]["refunded_amount"] == D("5000.00")  # the rejected one: 0
    assert overview[(ALL_PRODUCTS, "USD")]["refunded_amount"] == D("0.00")


def test_customers(report):
    assert [(c["identifier"], c["currency"], c["lifetime_paid"]) for c in report.customers] == [
        ("c2", "XOF", D("59000.00")),  # PM7 + PM9 (lifetime, before the period too)
        ("c1", "XOF", D("25000.00")),  # PM1 + PM2 + PM4
        ("c3", "USD", D("10.00")),
        ("c4", "USD", D("0.00")),
        ("c5", "USD", D("0.00")),
    ]
    by = {c["identifier"]: c for c in report.customers}
    assert by["c1"]["active_subscriptions"] == 2  # S1, S4
    assert by["c1"]["failed_payments"] == 1
    assert by["c1"]["failed_amount"] == D("5000.00")
    assert by["c1"]["last_payment_status"] == "completed"  # PM4 after PM3
    assert by["c4"]["last_payment_status"] == "failed"
    assert by["c4"]["active_subscriptions"] == 0
    assert by["c5"]["last_payment_status"] == "canceled"  # PM10 after PM6
    assert by["c5"]["failed_amount"] == D("120.00")


def test_customers_at_risk(report):
    assert [(c["identifier"], c["reasons"]) for c in report.at_risk] == [
        ("c3", "unpaid invoice"),  # invoice "open"
        ("c4", "uncollectable invoice"),  # S5 failed too, but it is canceled
        ("c5", "failed payment"),  # S6 active, last payment failed
    ]
    assert report.at_risk_total == 3


def test_filters(world):
    report = build_report(Period(now=NOW, product=world.p2.pk))
    assert {r["product"] for r in report.overview} == {"Team", ALL_PRODUCTS}
    team = {(r["product"], r["currency"]): r for r in report.overview}
    assert team[(ALL_PRODUCTS, "XOF")]["mrr"] == D("5000.00")
    assert team[(ALL_PRODUCTS, "USD")]["failed_amount"] == D("30.00")
    assert [c["identifier"] for c in report.at_risk] == ["c3", "c4"]

    usd = build_report(Period(now=NOW, currency="usd"))
    assert usd.currencies == ["USD"]
    assert [v for _, v in usd.series("USD", "cancellations")] == USD_CANCEL
    assert {c["currency"] for c in usd.customers} == {"USD"}
    assert [c["identifier"] for c in usd.at_risk] == ["c4", "c5"]

    short = build_report(Period(now=NOW, months=3))
    assert short.months == ["2025-04", "2025-05", "2025-06"]
    overview = {(r["product"], r["currency"]): r for r in short.overview}
    assert overview[(ALL_PRODUCTS, "XOF")]["new"] == 1  # S8 only
    assert overview[(ALL_PRODUCTS, "XOF")]["active_start"] == 4


@override_settings(BILLING={"CURRENCIES": {7: "XOF", 8: "USD"}})
def test_mrr_follows_the_currency_mapping(world):
    """Prices are stored by currency id: with another mapping, no price matches the codes."""
    from billing_integration.models import Price

    rows = metrics.current_subscriptions(Period(now=NOW))
    assert sum(r["mrr"] for r in rows) == 0
    assert sum(r["unpriced"] for r in rows) == 5
    Price.objects.filter(currency_id=1).update(currency_id=7)
    rows = metrics.current_subscriptions(Period(now=NOW))
    assert sum(r["mrr"] for r in rows if r["currency"] == "XOF") == D("14500.00")


def test_empty_database():
    report = build_report(Period(now=NOW))
    assert report.overview == [] and report.monthly == [] and report.customers == []
    assert report.at_risk_total == 0


def test_a_version_from_the_future_does_not_keep_a_canceled_subscription_active(world):
    """A canceled subscription stopped when it last changed (``remote_updated``); one from a
    clock ahead (2099) is not trusted, the rule of the version guard, and the time it was
    stored here (``updated_at``) is read instead: S3 still counts canceled in 2025-03."""
    future = datetime(2099, 1, 1, tzinfo=UTC)
    Subscription.objects.filter(pk=world.subs["S3"].pk).update(
        remote_updated=future, updated_at=datetime(2025, 3, 15, tzinfo=UTC)
    )
    report = build_report(Period(now=NOW))
    assert [v for _, v in report.series("USD", "cancellations")] == USD_CANCEL
    assert [v for _, v in report.series("USD", "active_start")] == USD_ACTIVE_START
