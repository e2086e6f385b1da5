"""The reporting queries give exactly the figures of the reference implementation
(``reference.py``: the straightforward conditional-count / TruncMonth / full-aggregate
queries they replace) on data full of edge cases: instants exactly on a month boundary or
at ``now``, future starts, ends and payments, ends before starts, lapsed cycles, trials ending
on a boundary, mixed-case currency codes, missing products, customers and amounts, ties in
the customer ranking, and a time zone with daylight saving time."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.utils import timezone

from billing_integration.models import Customer, Payment, Refund, Subscription
from billing_integration.reporting import metrics
from billing_integration.reporting.report import Period

from . import reference
from .conftest import NOW, World, build_world, dt

pytestmark = pytest.mark.django_db

MIDNIGHT = datetime(2025, 6, 1, 0, 0, tzinfo=UTC)  # "now" exactly on a month start


def add_edge_cases(world: World) -> None:
    p1, p2 = world.p1, world.p2
    extra = {c: Customer(identifier=c, remote_id=uuid.uuid4()) for c in ("c6", "c7", "c8")}
    Customer.objects.bulk_create(extra.values())
    customers = {c.identifier: c for c in Customer.objects.all()}

    def sub(product, cycle, cur, cust, start, **kw) -> Subscription:
        return Subscription(
            product=product,
            customer=customers[cust],
            selected_billing_cycle=cycle,
            selected_currency=cur,
            remote_id=uuid.uuid4(),
            remote_created=start,
            cycle_start_date=start,
            status=kw.pop("status", "published"),
            **kw,
        )

    subs = [
        sub(p1, "months-1", "XOF", "c6", dt(2025, 3, 1, 0)),  # starts on a boundary
        sub(p1, "months-1", "XOF", "c7", dt(2024, 7, 1, 0)),  # ... the first of 12 months
        sub(p2, "months-3", "USD", "c8", dt(2025, 4, 1, 0)),  # ... the first of 3 months
        sub(
            p1,
            "months-1",
            "XOF",
            "c6",
            dt(2024, 12, 1, 0),
            status="canceled",
            remote_updated=dt(2025, 2, 1, 0),
        ),  # ends on a boundary
        sub(p2, "months-3", "XOF", "c7", dt(2025, 7, 1)),  # starts after now
        sub(
            p1,
            "years-1",
            "USD",
            "c7",
            dt(2025, 1, 10),
            status="canceled",
            remote_updated=dt(2025, 8, 1),
        ),  # ends after now
        sub(p1, "months-1", "XOF", "c8", dt(2024, 10, 3), cycle_end_date=dt(2025, 5, 1, 0)),
        sub(
            p2,
            "months-3",
            "Xof",
            "c8",
            dt(2025, 3, 15),
            trial_end_date=dt(2025, 4, 1, 0),
            cycle_end_date=dt(2025, 9, 1),
        ),  # trial ends on a boundary
        sub(None, "months-1", "xof", "c6", dt(2024, 8, 5)),  # no product
        sub(p1, "months-1", "XOF", "c7", NOW),  # starts at now
        sub(
            p1,
            "months-1",
            "XOF",
            "c7",
            dt(2025, 3, 10),
            status="canceled",
            remote_updated=dt(2025, 2, 10),
        ),  # ends before it starts
        sub(
            p2,
            "months-3",
            "USD",
            "c8",
            dt(2023, 1, 1),
            status="paused",
            remote_updated=dt(2024, 6, 1),
        ),  # ended before any period
        sub(
            p2,
            "months-3",
            "USD",
            "c6",
            dt(2025, 5, 20),
            trial_end_date=dt(2025, 6, 20),
            cycle_end_date=dt(2025, 6, 10),
        ),  # cycle passed but still in trial
        sub(
            p1,
            "months-1",
            "usd",
            "c6",
            dt(2024, 7, 1, 0),
            trial_end_date=NOW,
            cycle_end_date=dt(2025, 8, 1),
        ),  # starts on the first boundary, trial ends now
        sub(
            p1,
            "years-1",
            "XOF",
            "c8",
            dt(2024, 6, 30, 23),
            status="expired",
            remote_updated=dt(2025, 6, 1, 0),
        ),  # ends exactly at MIDNIGHT
        sub(p2, "months-3", "XOF", "c7", dt(2025, 5, 31, 23), cycle_end_date=MIDNIGHT),
        # statuses outside the allow-list (BILLING['ACTIVE_STATUSES']): ended when last changed
        sub(
            p1,
            "months-1",
            "XOF",
            "c6",
            dt(2024, 9, 1),
            status="past_due",
            remote_updated=dt(2025, 4, 1, 0),
        ),
        sub(
            p2,
            "months-3",
            "USD",
            "c8",
            dt(2025, 2, 1),
            status="",
            remote_updated=dt(2025, 5, 15),
            cycle_end_date=dt(2025, 9, 1),
        ),
        sub(p1, "months-1", "XOF", "c7", dt(2025, 1, 1), status="pending"),  # ended: updated_at
    ]
    Subscription.objects.bulk_create(subs)
    subs = list(Subscription.objects.filter(customer__identifier__in=("c6", "c7", "c8")))
    s_p1 = next(s for s in subs if s.product_id == p1.pk)
    s_none = next(s for s in subs if s.product_id is None)

    def pay(when, status, amount, cur, cust, sub=s_p1, product=p1, **kw) -> Payment:
        return Payment(
            remote_id=uuid.uuid4(),
            remote_created=when,
            status=status,
            amount=None if amount is None else Decimal(amount),
            currency=cur,
            customer=customers[cust] if cust else None,
            subscription=sub,
            product=product,
            **kw,
        )

    payments = [
        pay(dt(2025, 3, 1, 0), "completed", "700", "XOF", "c6"),  # on a boundary
        pay(NOW, "completed", "300", "XOF", "c6"),  # at now
        pay(MIDNIGHT, "failed", "40", "XOF", "c6"),
        pay(dt(2025, 7, 1), "completed", "999", "XOF", "c6"),  # after now: not counted
        pay(dt(2025, 2, 2), "completed", None, "USD", "c4"),  # no amount
        pay(dt(2025, 2, 3), "pending", "5", "XOF", "c7"),  # another state
        pay(dt(2025, 2, 4), "completed", "1000", "XOF", None),  # no customer
        pay(dt(2025, 2, 5), "completed", "1000", "xof", "c7", product=None),  # lower case
        pay(dt(2024, 7, 1, 0), "completed", "1000", "XOF", "c8"),  # first boundary
        pay(dt(2023, 1, 5), "completed", "1000", "Xof", "c8"),  # long ago
        pay(dt(2025, 4, 9), "failed", "77", "USD", "c8"),  # c8 USD: nothing paid
        pay(dt(2025, 4, 9), "canceled", "12", "USD", "c7", sub=s_none, product=None),
    ]
    Payment.objects.bulk_create(payments)
    # no remote date: created_at (today, after NOW) decides
    Payment.objects.create(
        remote_id=uuid.uuid4(),
        status="completed",
        amount=Decimal(3),
        currency="XOF",
        customer=customers["c6"],
        product=p1,
    )
    pm = Payment.objects.filter(customer=customers["c6"]).first()
    Refund.objects.bulk_create(
        [
            Refund(
                remote_id=uuid.uuid4(),
                remote_created=dt(2025, 3, 1, 0),
                status="approved",
                amount=Decimal(70),
                currency="XOF",
                customer=customers["c6"],
                payment=pm,
            ),
            Refund(
                remote_id=uuid.uuid4(),
                remote_created=dt(2025, 5, 5),
                status="initiated",
                amount=Decimal(9),
                currency="xof",
                customer=customers["c6"],
                payment=pm,
                subscription=s_none,
            ),  # subscription without product: the payment's
        ]
    )


@pytest.fixture
def edges() -> World:
    world = build_world()
    add_edge_cases(world)
    return world


def periods(world: World) -> list[Period]:
    return [
        Period(now=NOW),
        Period(now=NOW, months=1),
        Period(now=NOW, months=3),
        Period(now=NOW, months=24),
        Period(now=NOW, months=36),
        Period(now=NOW, currency="XOF"),
        Period(now=NOW, currency="usd"),
        Period(now=NOW, product=world.p1.pk),
        Period(now=NOW, product=world.p2.pk, months=6),
        Period(now=MIDNIGHT),
        Period(now=MIDNIGHT, months=2, currency="XOF"),
    ]


def by_key(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: tuple(str(r[k]) for k in sorted(r)))


@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
def test_subscription_figures_match_the_reference(edges, zone):
    with timezone.override(zone):
        for period in periods(edges):
            assert by_key(metrics.current_subscriptions(period)) == by_key(
                reference.current_subscriptions(period)
            ), period
            assert metrics.subscription_history(period) == reference.subscription_history(period), (
                period
            )
            assert by_key(metrics.trial_history(period)) == by_key(
                reference.trial_history(period)
            ), period


@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
def test_payment_and_refund_figures_match_the_reference(edges, zone):
    with timezone.override(zone):
        for period in periods(edges):
            assert by_key(metrics.payment_history(period)) == by_key(
                reference.payment_history(period)
            ), period
            assert by_key(metrics.refund_history(period)) == by_key(
                reference.refund_history(period)
            ), period


def test_customer_ranking_matches_the_reference(edges):
    # c6/c7 tie on XOF; c8 has paid XOF and an unpaid USD pair; c4 a completed payment
    # without amount (nothing paid)
    Payment.objects.filter(customer__identifier="c7", status="pending").update(
        status="completed", amount=Decimal(995)
    )  # c7 XOF: 995 + 1000 - like c6 (700+300+995)
    Payment.objects.filter(
        customer__identifier="c6", status="completed", remote_created=NOW
    ).update(amount=Decimal(995 + 1000 - 700))
    for period in periods(edges):
        everyone = reference.customer_summary(period, limit=None)
        assert metrics.customer_summary(period, limit=None) == everyone, period
        for limit in range(len(everyone) + 2):
            assert metrics.customer_summary(period, limit=limit) == reference.customer_summary(
                period, limit=limit
            ), (period, limit)
    paid = {
        (c["identifier"], c["currency"]): c["lifetime_paid"]
        for c in metrics.customer_summary(Period(now=NOW), limit=None)
    }
    assert paid[("c6", "XOF")] == paid[("c7", "XOF")]  # the tie is really there
    assert paid[("c8", "USD")] == Decimal("0.00")
