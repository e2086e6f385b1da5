"""Only the cycles and prices the service acknowledged are offered and sold: a cycle or price
added or changed here is sold once the push that carried it is answered 2xx; while it waits,
or after the service refused it, checkout refuses it before any call to the service, and the
pricing page and the button's ``{price}`` show the service's price."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import transaction

from billing_integration.checkout.services import ProductUnavailable, start_checkout
from billing_integration.models import BillingCycle, CheckoutSession, OutboxEntry, Price, Product
from billing_integration.outbox.push import PushOutcome, push_entry

from .conftest import make_product, push_open_entries
from .test_one_purchase import URL, button

pytestmark = pytest.mark.django_db(transaction=True)

NOT_CONFIRMED = "This billing option is not on sale yet: the payment service has not confirmed it."


def add_cycle(product: Product, code: str = "months-3", **prices: str) -> BillingCycle:
    unit, frequency = code.split("-")
    with transaction.atomic():
        cycle = BillingCycle.objects.create(product=product, unit=unit, frequency=int(frequency))
        for currency_id, amount in (prices or {"1": "25000"}).items():
            Price.objects.create(cycle=cycle, currency_id=int(currency_id), amount=Decimal(amount))
    return cycle


def assert_refused_locally(sandbox, client, user, product, cycle, currency="XOF") -> None:
    """Refused with ``option_not_confirmed`` by ``start_checkout``, the view (409, the
    message) and the button, with nothing sent to the service."""
    sandbox.clear_requests()
    with pytest.raises(ProductUnavailable) as info:
        start_checkout(user, product, cycle, currency)
    assert (info.value.code, info.value.status) == ("option_not_confirmed", 409)
    response = client.post(URL, {"product": product.pk, "cycle": cycle, "currency": currency})
    page = response.content.decode()
    assert response.status_code == 409 and 'data-error-code="option_not_confirmed"' in page
    assert NOT_CONFIRMED in page and "You have not been charged." in page
    assert sandbox.requests() == []  # no checkout, no customer, not even a token
    assert not CheckoutSession.objects.exists()
    html = button(product, user, cycle=cycle, currency=currency)
    assert "<form" not in html and "billing-checkout-unavailable" in html


def test_a_cycle_added_is_sold_once_the_service_acknowledges_it(billing_sandbox, logged_in, user):
    product = make_product()
    assert product.confirmed_cycles == {
        "months-1": {"1": "10000.00", "2": "19.99"},
        "years-1": {"1": "100000.00"},
    }
    add_cycle(product, "months-3", **{"1": "25000"})
    product.refresh_from_db()
    assert OutboxEntry.objects.open().count() == 1  # its push waits (no worker here)

    assert_refused_locally(billing_sandbox, logged_in, user, product, "months-3")
    html = logged_in.get("/pricing/").content.decode()
    assert 'data-cycle="months-1"' in html and 'data-cycle="months-3"' not in html

    push_open_entries()  # the service answers 2xx to the PATCH carrying the cycle
    product.refresh_from_db()
    assert product.confirmed_cycles["months-3"] == {"1": "25000.00"}
    assert 'data-cycle="months-3"' in logged_in.get("/pricing/").content.decode()
    response = logged_in.post(URL, {"product": product.pk, "cycle": "months-3", "currency": "XOF"})
    assert response.status_code == 302
    [sent] = billing_sandbox.requests(operation="create_checkout_session")
    assert sent["body"]["selected_billing_cycle"] == "months-3"


def test_a_cycle_the_service_refused_is_not_sold(billing_sandbox, logged_in, user):
    product = make_product()
    add_cycle(product, "months-3")
    billing_sandbox.faults(operation="update_product", status=400, count=1)
    [entry] = OutboxEntry.objects.open()
    assert push_entry(entry.pk).status == PushOutcome.FAILED
    product.refresh_from_db()
    assert product.sync_state == "failed" and "months-3" not in product.confirmed_cycles

    assert_refused_locally(billing_sandbox, logged_in, user, product, "months-3")
    # what the service holds is still sold
    assert logged_in.post(URL, {"product": product.pk, "cycle": "months-1"}).status_code == 302


def test_a_currency_added_to_a_cycle_waits_for_the_service_too(billing_sandbox, logged_in, user):
    product = make_product()
    yearly = product.cycles.get(unit="years")
    Price.objects.create(cycle=yearly, currency_id=2, amount=Decimal("199"))
    assert_refused_locally(billing_sandbox, logged_in, user, product, "years-1", "USD")
    assert (
        'data-cycle="years-1" data-currency="USD"'
        not in logged_in.get("/pricing/").content.decode()
    )
    # the same cycle in a confirmed currency is sold
    assert start_checkout(user, product, "years-1", "XOF").remote_id is not None


def test_a_changed_price_is_shown_at_the_services_amount_until_acknowledged(
    billing_sandbox, logged_in, user
):
    product = make_product()
    price = Price.objects.get(cycle__product=product, cycle__unit="months", currency_id=1)
    price.amount = Decimal("12000")
    price.save()
    assert OutboxEntry.objects.open().count() == 1

    page = logged_in.get("/pricing/").content.decode()
    assert "XOF\xa010,000" in page and "12,000" not in page  # what the hosted page charges
    html = button(product, user, cycle="months-1", currency="XOF", label="Buy for {price}")
    assert "Buy for XOF\xa010,000" in html
    assert product.sold_prices(product.cycles.get(unit="months")) == {
        1: Decimal("10000.00"),
        2: Decimal("19.99"),
    }

    push_open_entries()
    product.refresh_from_db()
    assert "XOF\xa012,000" in logged_in.get("/pricing/").content.decode()


def test_a_one_time_product_is_sold_at_the_services_root_prices(billing_sandbox, logged_in, user):
    """PATCH cannot carry a one-time product's prices: a local repricing is never sent, so
    the service's price (its answers' root ``prices``) is the one shown and charged, and a
    currency the service has no price in is not sold."""
    product = make_product("Ebook", one_time=True)
    assert product.sold_prices() == {1: Decimal("5000.00")}
    price = product.root_prices.get()
    price.amount = Decimal("6000")
    price.save()
    Price.objects.create(product=product, currency_id=2, amount=Decimal("10"))
    push_open_entries()
    product.refresh_from_db()
    assert product.sync_state == "not_sent"

    html = button(product, user, currency="XOF", label="Buy for {price}")
    assert "Buy for XOF\xa05,000" in html and "6,000" not in html
    assert_refused_locally(billing_sandbox, logged_in, user, product, "", "USD")


def test_a_product_made_pushed_by_hand_sells_its_cycles_as_they_are(user):
    """A remote id set without a push from here (a data import, a host's test fixture): what
    the service holds was never recorded (``confirmed_cycles`` null), so its cycles and a
    one-time product's root prices are sold as they are here, as before the record existed;
    its first acknowledged push records them."""
    import uuid

    with transaction.atomic():
        plan = Product.objects.create(name="Imported", status="published", selected_currencies=[1])
        add_cycle(plan, "months-1", **{"1": "7000"})
        ebook = Product.objects.create(
            name="Imported ebook", status="published", product_type="one_time"
        )
        Price.objects.create(product=ebook, currency_id=1, amount=Decimal("300"))
    for product in (plan, ebook):
        Product.objects.filter(pk=product.pk).update(remote_id=uuid.uuid4(), sync_state="synced")
    plan.refresh_from_db()
    ebook.refresh_from_db()
    assert plan.confirmed_cycles is None
    assert plan.sold_prices(plan.cycles.get()) == {1: Decimal("7000.00")}
    assert ebook.sold_prices() == {1: Decimal("300.00")}
