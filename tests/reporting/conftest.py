"""A small hand-made billing history (built directly in the DB, no outbox, no signals).

``NOW`` is 2025-06-15 12:00 UTC; a 12-month report covers 2024-07 .. 2025-06.
Currencies: XOF (id 1) and USD (id 2), the default ``BILLING['CURRENCIES']``.

Products and prices (per month after normalisation):
  Pro  (P1): months-1 XOF 5000 / USD 10.00; years-1 XOF 54000 (4500/mo) / USD 120.00 (10/mo)
  Team (P2): months-3 XOF 15000 (5000/mo) / USD 30.00 (10/mo)

Subscriptions (start = remote_created; end = remote_updated when canceled, cycle_end when lapsed):
  S1 P1 months-1 XOF C1 start 2024-09-10, active (cycle to 2025-07-10), last payment completed
  S2 P1 years-1  XOF C2 start 2025-01-05, active (cycle to 2026-01-05)
  S3 P1 months-1 USD C3 start 2024-11-20, canceled 2025-03-15
  S4 P2 months-3 XOF C1 start 2025-02-03, trial to 2025-03-03 (converted: paid), active
  S5 P2 months-3 USD C4 start 2025-04-10, trial to 2025-05-10 (not converted), canceled 2025-05-12
  S6 P1 years-1  USD C5 start 2023-06-01, active (cycle to 2026-06-01), last payment failed
  S7 P1 months-1 XOF C2 start 2024-05-01, lapsed: cycle ended 2025-04-03 without renewal
  S8 P2 months-3 XOF C3 start 2025-06-05, in trial to 2025-07-05
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from billing_integration.models import (
    BillingCycle,
    Customer,
    Invoice,
    Payment,
    Price,
    Product,
    Refund,
    Subscription,
)

NOW = datetime(2025, 6, 15, 12, 0, tzinfo=UTC)
XOF, USD = 1, 2


def dt(y: int, m: int, d: int, h: int = 10) -> datetime:
    return datetime(y, m, d, h, tzinfo=UTC)


@dataclass
class World:
    p1: Product
    p2: Product
    customers: dict[str, Customer]
    subs: dict[str, Subscription]
    payments: dict[str, Payment]


def make_subscription(product: Any, customer: Any, start: datetime, **fields: Any) -> Subscription:
    """A remote subscription started at ``start``: months-1, XOF, published unless ``fields``
    say otherwise."""
    values = {
        "selected_billing_cycle": "months-1",
        "selected_currency": "XOF",
        "status": "published",
        **fields,
    }
    return Subscription.objects.create(
        product=product, customer=customer, remote_id=uuid.uuid4(), remote_created=start, **values
    )


def make_product(name: str, cycles: dict[tuple[str, int], dict[int, str]]) -> Product:
    product = Product.objects.bulk_create(
        [Product(name=name, status="published", selected_currencies=[XOF, USD])]
    )[0]
    for (unit, frequency), prices in cycles.items():
        cycle = BillingCycle.objects.bulk_create(
            [BillingCycle(product=product, unit=unit, frequency=frequency)]
        )[0]
        Price.objects.bulk_create(
            [Price(cycle=cycle, currency_id=cid, amount=Decimal(a)) for cid, a in prices.items()]
        )
    return product


def build_world() -> World:
    p1 = make_product(
        "Pro",
        {("months", 1): {XOF: "5000", USD: "10.00"}, ("years", 1): {XOF: "54000", USD: "120.00"}},
    )
    p2 = make_product("Team", {("months", 3): {XOF: "15000", USD: "30.00"}})
    customers = {
        c: Customer(
            identifier=c, first_name=c.upper(), email=f"{c}@example.com", remote_id=uuid.uuid4()
        )
        for c in ("c1", "c2", "c3", "c4", "c5")
    }
    Customer.objects.bulk_create(customers.values())
    customers = {c.identifier: c for c in Customer.objects.all()}

    def sub(
        product,
        cycle,
        cur,
        cust,
        start,
        *,
        status="published",
        cycle_end=None,
        trial_end=None,
        updated=None,
        last=None,
    ) -> Subscription:
        return Subscription(
            product=product,
            customer=customers[cust],
            selected_billing_cycle=cycle,
            selected_currency=cur,
            status=status,
            remote_id=uuid.uuid4(),
            remote_created=start,
            remote_updated=updated,
            cycle_start_date=start,
            cycle_end_date=cycle_end,
            trial_end_date=trial_end,
            last_payment_status=last,
        )

    subs = {
        "S1": sub(
            p1,
            "months-1",
            "XOF",
            "c1",
            dt(2024, 9, 10),
            cycle_end=dt(2025, 7, 10),
            last="completed",
        ),
        "S2": sub(
            p1, "years-1", "XOF", "c2", dt(2025, 1, 5), cycle_end=dt(2026, 1, 5), last="completed"
        ),
        "S3": sub(
            p1,
            "months-1",
            "USD",
            "c3",
            dt(2024, 11, 20),
            status="canceled",
            cycle_end=dt(2025, 4, 20),
            updated=dt(2025, 3, 15),
            last="completed",
        ),
        "S4": sub(
            p2,
            "months-3",
            "XOF",
            "c1",
            dt(2025, 2, 3),
            trial_end=dt(2025, 3, 3),
            cycle_end=dt(2025, 9, 3),
            last="completed",
        ),
        "S5": sub(
            p2,
            "months-3",
            "usd",
            "c4",
            dt(2025, 4, 10),
            status="canceled",
            trial_end=dt(2025, 5, 10),
            cycle_end=dt(2025, 5, 10),
            updated=dt(2025, 5, 12),
            last="failed",
        ),
        "S6": sub(
            p1, "years-1", "USD", "c5", dt(2023, 6, 1), cycle_end=dt(2026, 6, 1), last="failed"
        ),
        "S7": sub(
            p1, "months-1", "XOF", "c2", dt(2024, 5, 1), cycle_end=dt(2025, 4, 3), last="completed"
        ),
        "S8": sub(p2, "months-3", "XOF", "c3", dt(2025, 6, 5), trial_end=dt(2025, 7, 5)),
    }
    Subscription.objects.bulk_create(subs.values())
    subs = {k: Subscription.objects.get(remote_id=s.remote_id) for k, s in subs.items()}

    def pay(key, when, status, amount, cur, sub_key) -> Payment:
        s = subs[sub_key]
        return Payment(
            remote_id=uuid.uuid4(),
            remote_created=when,
            status=status,
            amount=Decimal(amount),
            currency=cur,
            customer=s.customer,
            subscription=s,
            product=s.product,
        )

    payments = {
        "PM1": pay("PM1", dt(2025, 3, 3), "completed", "15000", "XOF", "S4"),
        "PM2": pay("PM2", dt(2025, 4, 10), "completed", "5000", "XOF", "S1"),
        "PM3": pay("PM3", dt(2025, 5, 10), "failed", "5000", "XOF", "S1"),
        "PM4": pay("PM4", dt(2025, 5, 11), "completed", "5000", "XOF", "S1"),
        "PM5": pay("PM5", dt(2025, 5, 10), "failed", "30.00", "USD", "S5"),
        "PM6": pay("PM6", dt(2025, 6, 1), "failed", "120.00", "USD", "S6"),
        "PM7": pay("PM7", dt(2025, 1, 5), "completed", "54000", "XOF", "S2"),
        "PM8": pay("PM8", dt(2024, 12, 20), "completed", "10.00", "USD", "S3"),
        "PM9": pay("PM9", dt(2024, 5, 1), "completed", "5000", "XOF", "S7"),
        "PM10": pay("PM10", dt(2025, 6, 2), "canceled", "120.00", "USD", "S6"),
    }
    Payment.objects.bulk_create(payments.values())
    payments = {k: Payment.objects.get(remote_id=p.remote_id) for k, p in payments.items()}

    def refund(when, status, amount, cur, pm, sub_key) -> Refund:
        s = subs[sub_key]
        return Refund(
            remote_id=uuid.uuid4(),
            remote_created=when,
            status=status,
            amount=Decimal(amount),
            currency=cur,
            customer=s.customer,
            subscription=s,
            payment=payments[pm],
        )

    Refund.objects.bulk_create(
        [
            refund(dt(2025, 4, 20), "approved", "5000", "XOF", "PM2", "S1"),
            refund(dt(2025, 1, 10), "initiated", "10.00", "USD", "PM8", "S3"),
            refund(dt(2025, 5, 20), "rejected", "1000", "XOF", "PM4", "S1"),
        ]
    )
    Invoice.objects.bulk_create(
        [
            Invoice(
                remote_id=uuid.uuid4(),
                remote_created=dt(2025, 5, 10),
                status="uncollectable",
                amount=Decimal("30"),
                currency="USD",
                customer=customers["c4"],
                product=p2,
                subscription=subs["S5"],
            ),
            Invoice(
                remote_id=uuid.uuid4(),
                remote_created=dt(2025, 6, 5),
                status="open",
                amount=Decimal("15000"),
                currency="XOF",
                customer=customers["c3"],
                product=p2,
                subscription=subs["S8"],
            ),
            Invoice(
                remote_id=uuid.uuid4(),
                remote_created=dt(2025, 5, 11),
                status="paid",
                amount=Decimal("5000"),
                currency="XOF",
                customer=customers["c1"],
                product=p1,
                subscription=subs["S1"],
            ),
        ]
    )
    return World(p1=p1, p2=p2, customers=customers, subs=subs, payments=payments)


@pytest.fixture
def world(db) -> World:
    return build_world()
