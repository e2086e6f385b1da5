"""What staff read in the admin (issue 14): customers by name, human statuses and cycles,
money in its currency's minor units, currencies as codes, "Auto renew", full breadcrumbs."""

from __future__ import annotations

import re
import uuid
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from billing_integration.models import Customer, Payment, Subscription

from .conftest import make_product, make_subscription, product_form_data

pytestmark = pytest.mark.django_db


def text(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).replace("\u202f", " ").split())


def named_customer() -> Customer:
    user = get_user_model().objects.create_user("ada", first_name="Ada", last_name="Lovelace")
    return Customer.objects.create(
        subscriber=user,
        identifier=f"auth.user:{user.pk}",
        remote_id=uuid.uuid4(),
        sync_state="synced",
    )


def test_subscription_list_and_change_page_read_humanly(admin_client):
    product = make_product(remote=True)
    sub = make_subscription(product)
    customer = named_customer()
    Subscription.objects.filter(pk=sub.pk).update(
        customer=customer, auto_renew=False, selected_billing_cycle="months-3"
    )
    listing = admin_client.get(reverse("admin:billing_integration_subscription_changelist"))
    html = listing.content.decode()
    results = html.split('class="results"')[1].split("</table>")[0]
    row = text(results)
    assert "Ada Lovelace" in row and "auth.user:" not in row
    assert "Active" in row and "Every 3 months" in row and ">published<" not in results
    assert "Auto renew" in text(html.split("<thead>")[1].split("</thead>")[0])
    change = admin_client.get(
        reverse("admin:billing_integration_subscription_change", args=[sub.pk])
    ).content.decode()
    assert "Ada Lovelace" in text(change) and "Every 3 months" in text(change)


def test_customer_list_shows_the_subscribers_name(admin_client):
    user = get_user_model().objects.create_user("grace")
    Customer.objects.create(subscriber=user, identifier=f"auth.user:{user.pk}")
    named_customer()
    html = admin_client.get(
        reverse("admin:billing_integration_customer_changelist")
    ).content.decode()
    rows = text(html.split('class="results"')[1])
    assert "Ada Lovelace" in rows and "grace" in rows


def test_payment_amounts_in_minor_units_and_reasons(admin_client):
    customer = named_customer()
    pay = Payment.objects.create(
        remote_id=uuid.uuid4(),
        status="failed",
        currency="XOF",
        amount=Decimal("5000.0000"),
        customer=customer,
        failure_reason="insufficient_funds",
    )
    Payment.objects.create(
        remote_id=uuid.uuid4(),
        status="completed",
        currency="USD",
        amount=Decimal("9.5000"),
        customer=customer,
    )
    html = admin_client.get(
        reverse("admin:billing_integration_payment_changelist")
    ).content.decode()
    rows = text(html.split('class="results"')[1])
    assert "XOF 5,000" in rows and "USD 9.50" in rows and "5000.0000" not in html
    assert "Insufficient funds" in rows and "Ada Lovelace" in rows
    change = admin_client.get(
        reverse("admin:billing_integration_payment_change", args=[pay.pk])
    ).content.decode()
    assert "XOF 5,000" in text(change) and "5000.0000" not in change


def test_price_currency_is_a_code(admin_client):
    product = make_product(remote=True)
    cycle = product.cycles.get()
    html = admin_client.get(
        reverse("admin:billing_integration_billingcycle_change", args=[cycle.pk])
    ).content.decode()
    select = html.split('name="prices-0-currency_id"')[1].split("</select>")[0]
    assert '<option value="1" selected>XOF</option>' in select
    assert '<option value="2">USD</option>' in select


def test_pricing_confirmation_breadcrumbs_are_complete(admin_client):
    product = make_product(remote=True)
    make_subscription(product)
    data = product_form_data(product, **{"cycles-0-prices": "XOF 12000"})
    html = admin_client.post(
        reverse("admin:billing_integration_product_change", args=[product.pk]), data
    ).content.decode()
    crumbs = html.split('<div class="breadcrumbs">')[1].split("</div>")[0]
    assert 'href="/admin/billing_integration/"' in crumbs
    assert 'href="/admin/billing_integration/product/"' in crumbs
