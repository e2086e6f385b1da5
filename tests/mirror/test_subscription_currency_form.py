"""``BILLING['GUESSES']['subscription_currency_form']``: POST /subscriptions sends the
currency code by default, or the currency id written as a string; against the sandbox over
real HTTP."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from billing_integration.checks import check_billing_settings
from billing_integration.customers import get_or_create_customer
from billing_integration.exceptions import BillingConfigurationError
from billing_integration.mapping import subscriptions as subscription_map
from billing_integration.models import BillingCycle, OutboxEntry, Price, Product, Subscription
from billing_integration.outbox.push import PushOutcome, push_entry

pytestmark = pytest.mark.django_db(transaction=True)


def push_new_subscription(currency: str = "XOF") -> Subscription:
    with transaction.atomic():
        product = Product.objects.create(name="Pro", selected_currencies=[1, 2])
        cycle = BillingCycle.objects.create(product=product, unit="months", frequency=1)
        Price.objects.create(cycle=cycle, currency_id=1, amount=Decimal("10000"))
        Price.objects.create(cycle=cycle, currency_id=2, amount=Decimal("19.99"))
    product.publish()
    user = get_user_model().objects.create(username="payer", email="p@example.com")
    customer, _ = get_or_create_customer(user)
    sub = Subscription.objects.create(
        product=product,
        customer=customer,
        selected_currency=currency,
        selected_billing_cycle="months-1",
        auto_renew=True,
    )
    entry = OutboxEntry.objects.for_object(sub).get()
    assert push_entry(entry.pk).status == PushOutcome.DONE
    sub.refresh_from_db()
    return sub


def test_the_default_form_sends_the_code(billing_sandbox):
    sub = push_new_subscription()
    [call] = billing_sandbox.requests(operation="create_subscription")
    assert call["body"]["selected_currency"] == "XOF"
    assert sub.remote_id is not None and sub.selected_currency == "XOF"


@pytest.mark.parametrize(("code", "wire"), [("XOF", "1"), ("usd", "2")])
def test_the_id_form_sends_the_id_as_a_string(billing_sandbox, settings, code, wire):
    settings.BILLING = {**settings.BILLING, "GUESSES": {"subscription_currency_form": "id"}}
    sub = push_new_subscription(code)
    [call] = billing_sandbox.requests(operation="create_subscription")
    assert call["status"] == 200
    assert call["body"]["selected_currency"] == wire  # a string, not the integer
    remote = billing_sandbox.object("subscription", str(sub.remote_id))
    assert remote["selected_currency"] == code.upper()  # created with that currency
    assert sub.selected_currency == code.upper()  # the answer carries the code


def test_an_unknown_form_is_refused(settings):
    settings.BILLING = {**settings.BILLING, "GUESSES": {"subscription_currency_form": "number"}}
    [error] = [e for e in check_billing_settings() if e.id == "billing_integration.E013"]
    assert "BILLING['GUESSES']['subscription_currency_form']" in error.msg
    with pytest.raises(BillingConfigurationError, match=r"\['subscription_currency_form'\]"):
        subscription_map.wire_currency("XOF")
