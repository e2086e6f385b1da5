"""A product created in code is sold in the currencies of its prices (the model's rule, the
admin uses it), so its push carries them and its checkout accepts them."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import transaction

from billing_integration.models import BillingCycle, Price, Product
from billing_integration.outbox import from_remote

from .conftest import push_open_entries

pytestmark = pytest.mark.django_db(transaction=True)


def product_without_currencies(name: str = "Coded plan") -> Product:
    with transaction.atomic():
        product = Product.objects.create(name=name, status="published")
        cycle = BillingCycle.objects.create(product=product, unit="months", frequency=1)
        Price.objects.create(cycle=cycle, currency_id=1, amount=Decimal("10000"))
    return product


def test_code_created_product_is_pushed_and_sold_in_its_prices_currencies(
    billing_sandbox, logged_in
):
    product = product_without_currencies()
    assert product.selected_currencies == [1]  # the instance in hand knows it too

    push_open_entries()
    [call] = billing_sandbox.requests(operation="create_product")
    assert call["status"] == 200
    assert call["body"]["selected_currencies"] == ["1"]

    response = logged_in.post(
        "/billing/checkout/", {"product": product.pk, "cycle": "months-1", "currency": "XOF"}
    )
    assert response.status_code == 302, response.content.decode()[:500]
    assert response["Location"].startswith(f"{billing_sandbox.checkout_url}/checkout/")


def test_a_new_price_currency_is_added_and_pushed(billing_sandbox):
    product = product_without_currencies()
    push_open_entries()
    cycle = product.cycles.get()
    Price.objects.create(cycle=cycle, currency_id=2, amount=Decimal("19.99"))
    assert Product.objects.get(pk=product.pk).selected_currencies == [1, 2]

    push_open_entries()
    [patch] = billing_sandbox.requests(operation="update_product")
    assert patch["status"] == 200
    assert patch["body"]["selected_currencies"] == ["1", "2"]


def test_a_stale_instance_drops_no_priced_currency(transactional_db):
    product = product_without_currencies()
    stale = Product.objects.get(pk=product.pk)
    Price.objects.create(cycle=product.cycles.get(), currency_id=3, amount=Decimal("15"))
    stale.name = "Renamed"
    stale.save()
    assert Product.objects.get(pk=product.pk).selected_currencies == [1, 3]


def test_one_time_product_root_prices(transactional_db):
    with transaction.atomic():
        product = Product.objects.create(name="Setup fee", product_type="one_time")
        Price.objects.create(product=product, currency_id=2, amount=Decimal("5"))
    assert Product.objects.get(pk=product.pk).selected_currencies == [2]


def test_saves_from_the_service_keep_its_currencies(transactional_db):
    product = Product.objects.create(name="Pulled", selected_currencies=[1])
    with from_remote():
        cycle = BillingCycle.objects.create(product=product, unit="months", frequency=1)
        Price.objects.create(cycle=cycle, currency_id=2, amount=Decimal("19.99"))
        product.save()
    assert Product.objects.get(pk=product.pk).selected_currencies == [1]
