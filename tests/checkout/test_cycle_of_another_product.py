"""A ``BillingCycle`` given to checkout must be one of the product's: another product's cycle is
refused (400 ``unknown_cycle``), never replaced by the product's only cycle."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest

from billing_integration import billing
from billing_integration.models import BillingCycle, Price, Product
from billing_integration.outbox import from_remote


def single_cycle_product(name: str, unit: str) -> tuple[Product, BillingCycle]:
    with from_remote():
        product = Product.objects.create(
            name=name, status="published", selected_currencies=[1], remote_id=uuid.uuid4()
        )
        cycle = BillingCycle.objects.create(product=product, unit=unit, frequency=1)
        Price.objects.create(cycle=cycle, currency_id=1, amount=Decimal("10000"))
    return product, cycle


def test_another_products_cycle_is_refused(user):
    monthly, _ = single_cycle_product("Monthly plan", "months")
    _, yearly_cycle = single_cycle_product("Yearly plan", "years")

    with pytest.raises(billing.InvalidChoice) as refused:  # nothing sent: refused first
        billing.checkout_url(user, monthly, yearly_cycle, "XOF")
    assert (refused.value.status, refused.value.code) == (400, "unknown_cycle")
