"""Fixtures of the "what people see" tests: the demo's seeded products (published, priced
in XOF and USD), a subscriber with every kind of record, no broker (pushes recorded)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

from billing_integration.models import (
    Customer,
    Invoice,
    Payment,
    Product,
    Refund,
    Subscription,
)
from billing_integration.outbox import from_remote


@pytest.fixture(autouse=True)
def no_broker(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from billing_integration.outbox import tasks

    calls: list[int] = []
    monkeypatch.setattr(tasks, "enqueue", lambda pk, countdown=None: calls.append(pk) or True)
    return calls


@pytest.fixture
def seeded(db, capsys: pytest.CaptureFixture) -> dict[str, Product]:
    call_command("billing_demo_seed")
    capsys.readouterr()
    return {p.name: p for p in Product.objects.all()}


def customer_of(user: Any) -> Customer:
    customer = Customer.objects.filter(subscriber=user).first()
    if customer is None:
        customer = Customer.objects.create(
            subscriber=user,
            identifier=f"auth.user:{user.pk}",
            remote_id=uuid.uuid4(),
            first_name=user.first_name,
            last_name=user.last_name,
        )
    return customer


def subscription(
    user: Any,
    product: Product,
    *,
    lapsed: bool = False,
    cycle: str = "months-1",
    currency: str = "XOF",
    status: str = "published",
    last_payment_status: str | None = None,
) -> Subscription:
    now = timezone.now()
    end = now - timedelta(days=2) if lapsed else now + timedelta(days=30)
    with from_remote():
        return Subscription.objects.create(
            remote_id=uuid.uuid4(),
            customer=customer_of(user),
            product=product,
            status=status,
            cycle_start_date=end - timedelta(days=30),
            cycle_end_date=end,
            next_billing_date=end,
            selected_billing_cycle=cycle,
            selected_currency=currency,
            last_payment_status=last_payment_status,
        )


def payment(
    sub: Subscription,
    status: str,
    amount: str,
    currency: str,
    *,
    reason: str = "",
    minutes_ago: int = 0,
) -> Payment:
    return Payment.objects.create(
        remote_id=uuid.uuid4(),
        status=status,
        amount=Decimal(amount),
        currency=currency,
        customer=sub.customer,
        subscription=sub,
        product=sub.product,
        failure_reason=reason,
        remote_created=timezone.now() - timedelta(minutes=minutes_ago),
    )


def invoice(sub: Subscription, amount: str, currency: str) -> Invoice:
    now = timezone.now()
    return Invoice.objects.create(
        remote_id=uuid.uuid4(),
        status="paid",
        amount=Decimal(amount),
        currency=currency,
        customer=sub.customer,
        subscription=sub,
        product=sub.product,
        remote_created=now,
        period_start=now,
        period_end=now + timedelta(days=30),
    )


def refund(pay: Payment, amount: str) -> Refund:
    return Refund.objects.create(
        remote_id=uuid.uuid4(),
        status="approved",
        amount=Decimal(amount),
        currency=pay.currency,
        customer=pay.customer,
        subscription=pay.subscription,
        payment=pay,
        reason="duplicate charge",
        remote_created=timezone.now(),
    )


@pytest.fixture
def demo(seeded):
    return get_user_model().objects.get(username="demo")
