"""Local changes no request of the interface can carry are kept and marked "not sent" (never a
silent "synced"); cycles declared for a pulled product are not pushed unasked."""

from __future__ import annotations

import importlib
import uuid
from decimal import Decimal
from pathlib import Path

import pytest
from django.apps import apps
from django.db import transaction

from billing_integration.models import BillingCycle, OutboxEntry, Price, Product
from billing_integration.outbox import from_remote
from billing_integration.outbox.push import PushOutcome, push_entry
from billing_integration.sync.pull import pull_products, upsert_products

pytestmark = pytest.mark.django_db(transaction=True)


def push_all() -> list[str]:
    return [push_entry(pk).status for pk in OutboxEntry.objects.open().values_list("pk", flat=True)]


def pushed_one_time(amount: str = "2500") -> Product:
    with transaction.atomic():
        product = Product.objects.create(
            name="Setup fee", product_type="one_time", selected_currencies=[1]
        )
        Price.objects.create(product=product, currency_id=1, amount=Decimal(amount))
    assert push_all() == [PushOutcome.DONE]
    product.refresh_from_db()
    assert product.sync_state == "synced"
    return product


def reprice(product: Product, amount: str) -> None:
    price = product.root_prices.get()
    price.amount = Decimal(amount)
    price.save()


def test_reprice_and_rename_in_one_batch_sends_the_name_and_says_the_price_is_not_sent(
    billing_sandbox,
):
    product = pushed_one_time()
    billing_sandbox.clear_requests()
    reprice(product, "3000")
    product.name = "Setup fee (2027)"
    product.save()
    entries = list(OutboxEntry.objects.open().values_list("pk", flat=True))
    assert len(entries) == 1  # collapsed
    assert [push_entry(pk).status for pk in entries] == [PushOutcome.DONE]

    [patch] = billing_sandbox.requests(operation="update_product")
    assert patch["body"] == {"name": "Setup fee (2027)"}  # PATCH has no `prices`
    product.refresh_from_db()
    assert product.sync_state == "not_sent"
    assert product.sync_error == (
        "Not sent: the service has no way to change a one-time product's prices; "
        "local 3000 XOF, service 2500 XOF."
    )
    assert product.remote_data["name"] == "Setup fee (2027)"


def test_putting_the_price_back_makes_it_synced_again(billing_sandbox):
    product = pushed_one_time()
    reprice(product, "3000")
    assert push_all() == [PushOutcome.DONE]
    product.refresh_from_db()
    assert product.sync_state == "not_sent"
    reprice(product, "2500")
    assert push_all() == [PushOutcome.DONE]
    product.refresh_from_db()
    assert (product.sync_state, product.sync_error) == ("synced", "")


def test_a_pull_keeps_the_not_sent_state_until_the_service_has_the_price(billing_sandbox):
    from billing_integration.client import get_client

    product = pushed_one_time()
    reprice(product, "3000")
    push_all()
    client = get_client()
    # Changed on the service (not the price): the pull stores the new JSON, still not sent.
    client.update_product(str(product.remote_id), {"description": "set on the service"})
    pull_products()
    product.refresh_from_db()
    assert product.description == "set on the service"
    assert product.sync_state == "not_sent" and "local 3000 XOF" in product.sync_error
    # The service now has the local price (set there by other means; the interface has no
    # request for it): the pulled JSON clears the state.
    data = client.get_product(str(product.remote_id))
    upsert_products(
        [
            {
                **data,
                "prices": [{"currency": 1, "amount": 3000}],
                "date_updated": "2030-01-01T00:00:00.000Z",
            }
        ]
    )
    product.refresh_from_db()
    assert (product.sync_state, product.sync_error) == ("synced", "")


def test_a_type_change_of_a_pushed_product_is_not_sent(billing_sandbox):
    with transaction.atomic():
        product = Product.objects.create(name="Plan", selected_currencies=[1])
        cycle = BillingCycle.objects.create(product=product, unit="months", frequency=1)
        Price.objects.create(cycle=cycle, currency_id=1, amount=Decimal("1000"))
    push_all()
    billing_sandbox.clear_requests()
    with transaction.atomic():
        product.refresh_from_db()
        product.product_type = "one_time"
        product.save()
        cycle.delete()
        Price.objects.create(product=product, currency_id=1, amount=Decimal("900"))
    assert push_all() == [PushOutcome.DONE]
    assert billing_sandbox.requests(operation="update_product") == []
    product.refresh_from_db()
    assert product.sync_state == "not_sent"
    assert "no way to change a product's type; local one-time, service subscription" in (
        product.sync_error
    )


def test_cycles_saved_for_a_pulled_product_are_declared_and_not_pushed(billing_sandbox):
    from billing_integration.client import get_client

    remote = get_client().create_product(
        {
            "name": "Remote plan",
            "status": "published",
            "selected_currencies": ["1"],
            "subscription_blueprint": {
                "billing_type": "flat-rate",
                "billing_cycles": [
                    {"cycle": "years", "frequency": 1, "prices": [{"currency": 1, "amount": 90000}]}
                ],
            },
        }
    )
    pull_products()
    product = Product.objects.get(remote_id=remote["id"])
    assert product.blueprint_known is False and product.remote_data["prices"] is None
    billing_sandbox.clear_requests()
    with transaction.atomic():
        cycle = BillingCycle.objects.create(product=product, unit="years", frequency=1)
        Price.objects.create(cycle=cycle, currency_id=1, amount=Decimal("90000"))
    assert cycle.declared is True
    assert not OutboxEntry.objects.exists()
    # Even a product save (e.g. publish) never carries the blueprint unasked.
    product.description = "Annual"
    product.save()
    assert push_all() == [PushOutcome.DONE]
    [patch] = billing_sandbox.requests(operation="update_product")
    assert patch["body"] == {"description": "Annual"}


def test_the_migration_marks_pulled_products_without_cycles(db):
    """Products pulled before ``blueprint_known`` existed: pushed subscription products
    without cycles get it False (their declared cycles are then not pushed unasked)."""
    migrations = Path(importlib.import_module("billing_integration.migrations").__file__).parent
    [path] = migrations.glob("*_products_declared_cycles_not_sent.py")
    module = importlib.import_module(f"billing_integration.migrations.{path.stem}")
    with from_remote():
        pulled = Product.objects.create(name="Pulled", remote_id=uuid.uuid4())
        authored = Product.objects.create(name="Authored", remote_id=uuid.uuid4())
        BillingCycle.objects.create(product=authored, unit="months", frequency=1)
        draft = Product.objects.create(name="Draft")
        fee = Product.objects.create(name="Fee", product_type="one_time", remote_id=uuid.uuid4())
    module.mark_pulled_blueprints_unknown(apps, None)
    known = dict(Product.objects.values_list("name", "blueprint_known"))
    assert known == {"Pulled": False, "Authored": True, "Draft": True, "Fee": True}
    assert {pulled.pk, authored.pk, draft.pk, fee.pk} == set(
        Product.objects.values_list("pk", flat=True)
    )


def test_an_edit_of_a_pushed_customer_is_marked_not_sent(billing_sandbox):
    """The interface has no customer update: the edit is kept, the state says so."""
    from django.contrib.auth import get_user_model

    from billing_integration.customers import ensure_customer_pushed, get_or_create_customer

    user = get_user_model().objects.create_user("ada", email="ada@example.com")
    customer = ensure_customer_pushed(get_or_create_customer(user)[0])
    billing_sandbox.clear_requests()
    customer.first_name = "Ada"
    customer.save()
    assert push_all() == [PushOutcome.DONE]
    assert billing_sandbox.requests() == []
    customer.refresh_from_db()
    assert customer.first_name == "Ada"
    assert customer.sync_state == "not_sent"
    assert customer.sync_error.startswith("Not pushed: the service has no customer update")
