"""Bad input on the product and cycle pages is a form error (nothing saved), never a push the
service refuses or a 500."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from billing_integration.models import BillingCycle, OutboxEntry, Product

from .conftest import make_product, product_form_data

pytestmark = pytest.mark.django_db

ADD = reverse("admin:billing_integration_product_add")


def cycle_page_data(cycle: BillingCycle, **overrides: Any) -> dict[str, Any]:
    """The POST of a cycle's own page, with its current prices."""
    prices = list(cycle.prices.all())
    data: dict[str, Any] = {
        "unit": cycle.unit,
        "frequency": str(cycle.frequency),
        "prices-TOTAL_FORMS": str(len(prices)),
        "prices-INITIAL_FORMS": str(len(prices)),
        "prices-MIN_NUM_FORMS": "0",
        "prices-MAX_NUM_FORMS": "1000",
        "_save": "Save",
    }
    for i, price in enumerate(prices):
        data.update(
            {
                f"prices-{i}-id": str(price.pk),
                f"prices-{i}-cycle": str(cycle.pk),
                f"prices-{i}-currency_id": str(price.currency_id),
                f"prices-{i}-amount": str(price.amount),
            }
        )
    data.update(overrides)
    return data


def new_cycle(prices: str, frequency: str = "1") -> dict[str, str]:
    """The add form's fields for one new monthly cycle."""
    return {
        "cycles-TOTAL_FORMS": "1",
        "cycles-0-unit": "months",
        "cycles-0-frequency": frequency,
        "cycles-0-prices": prices,
    }


def cycle_url(cycle: BillingCycle) -> str:
    return reverse("admin:billing_integration_billingcycle_change", args=[cycle.pk])


def test_a_cycle_frequency_below_one_is_a_form_error(admin_client):
    """The service refuses a frequency below 1 ("frequency must be >= 1")."""
    data = product_form_data(
        name="Every zero months",
        **new_cycle("XOF 1000", frequency="0"),
    )
    response = admin_client.post(ADD, data)
    assert response.status_code == 200
    assert "at least 1" in response.content.decode()
    assert not Product.objects.exists() and not OutboxEntry.objects.exists()

    cycle = make_product(remote=True).cycles.get()
    response = admin_client.post(cycle_url(cycle), cycle_page_data(cycle, frequency="0"))
    assert response.status_code == 200
    assert "at least 1" in response.content.decode()
    cycle.refresh_from_db()
    assert cycle.frequency == 1


def test_a_negative_price_in_the_price_rows_is_a_form_error(admin_client):
    """As in the compact prices field: the service refuses an amount below 0."""
    data = product_form_data(
        name="Setup fee",
        product_type="one_time",
        **{
            "root_prices-TOTAL_FORMS": "1",
            "root_prices-0-currency_id": "1",
            "root_prices-0-amount": "-5000",
        },
    )
    response = admin_client.post(ADD, data)
    assert response.status_code == 200
    assert "amounts are positive" in response.content.decode()
    assert not Product.objects.exists()

    cycle = make_product(remote=True).cycles.get()
    data = cycle_page_data(cycle, **{"prices-0-amount": "-1"})
    response = admin_client.post(cycle_url(cycle), data)
    assert response.status_code == 200
    assert "amounts are positive" in response.content.decode()
    assert [str(p.amount) for p in cycle.prices.all()] == ["10000.00"]


def test_an_amount_too_large_for_the_column_is_a_form_error(admin_client):
    """Prices are stored with 14 digits, 2 of them decimals: a larger amount in the compact
    field was saved (SQLite) and every page reading it was a 500 (PostgreSQL: the save)."""
    data = product_form_data(
        name="Too dear",
        **new_cycle("XOF 10000000000000000"),
    )
    response = admin_client.post(ADD, data)
    assert response.status_code == 200
    assert "at most 12 digits before the decimal point" in response.content.decode()
    assert not Product.objects.exists()
    # The largest amount the column holds is accepted, and its pages read it back.
    data["cycles-0-prices"] = "XOF 999999999999.99"
    assert admin_client.post(ADD, data).status_code == 302
    product = Product.objects.get()
    change = reverse("admin:billing_integration_product_change", args=[product.pk])
    assert "XOF 999999999999.99" in admin_client.get(change).content.decode()


def test_a_currency_id_too_long_to_read_is_a_form_error(admin_client):
    """More digits than Python reads as an int (4,300) named no currency, and was a 500."""
    data = product_form_data(
        name="Odd currency",
        **new_cycle("9" * 5000 + " 100"),
    )
    response = admin_client.post(ADD, data)
    assert response.status_code == 200
    assert "Unknown currency id" in response.content.decode()
    assert not Product.objects.exists()


def test_a_feature_twice_in_other_cases_is_a_form_error(admin_client):
    """Keys are stored lower-cased, once per product: "SSO" and "sso" in two new rows were an
    IntegrityError (a 500)."""
    data = product_form_data(
        name="Teams",
        **new_cycle("XOF 1000"),
        **{
            "declared_features-TOTAL_FORMS": "2",
            "declared_features-0-key": "SSO",
            "declared_features-1-key": "sso",
        },
    )
    response = admin_client.post(ADD, data)
    assert response.status_code == 200
    assert "duplicate" in response.content.decode()
    assert not Product.objects.exists()
    data["declared_features-1-key"] = "Seats"
    assert admin_client.post(ADD, data).status_code == 302
    product = Product.objects.get()
    assert sorted(product.declared_features.values_list("key", flat=True)) == ["seats", "sso"]


@pytest.mark.parametrize("status", ["published", "archived"])
def test_the_change_form_does_not_put_a_product_the_service_knows_back_to_draft(
    admin_client, status
):
    """The service moves a product draft → published → archived only (published → draft is
    refused, "invalid_transition"): the form said nothing, and the push failed."""
    product = make_product("Live plan", remote=True, status=status)
    change = reverse("admin:billing_integration_product_change", args=[product.pk])
    response = admin_client.post(change, product_form_data(product, status="draft"))
    assert response.status_code == 200
    assert "cannot go back to draft" in response.content.decode()
    product.refresh_from_db()
    assert product.status == status
    assert not OutboxEntry.objects.exists()
    # A product the service never received goes back to draft as before.
    local = make_product("Local plan", remote=False, status=status)
    change = reverse("admin:billing_integration_product_change", args=[local.pk])
    assert admin_client.post(change, product_form_data(local, status="draft")).status_code == 302
    local.refresh_from_db()
    assert local.status == "draft"


def test_a_currency_twice_in_the_price_rows_is_a_form_error(admin_client):
    """As in the compact prices field ("appears twice"): two prices in one currency were both
    saved and sent, leaving the price in that currency ambiguous."""
    data = product_form_data(
        name="Setup fee",
        product_type="one_time",
        **{
            "root_prices-TOTAL_FORMS": "2",
            "root_prices-0-currency_id": "1",
            "root_prices-0-amount": "5000",
            "root_prices-1-currency_id": "1",
            "root_prices-1-amount": "6000",
        },
    )
    response = admin_client.post(ADD, data)
    assert response.status_code == 200
    assert "Currency XOF appears twice" in response.content.decode()
    assert not Product.objects.exists()

    cycle = make_product(remote=True).cycles.get()
    data = cycle_page_data(
        cycle,
        **{
            "prices-TOTAL_FORMS": "2",
            "prices-1-cycle": str(cycle.pk),
            "prices-1-currency_id": "1",
            "prices-1-amount": "20000",
        },
    )
    response = admin_client.post(cycle_url(cycle), data)
    assert response.status_code == 200
    assert "Currency XOF appears twice" in response.content.decode()
    assert [str(p.amount) for p in cycle.prices.all()] == ["10000.00"]
    # One row removed and the other moved to its currency is no duplicate.
    data["prices-0-DELETE"] = "on"
    assert admin_client.post(cycle_url(cycle), data).status_code == 302
    assert [str(p.amount) for p in cycle.prices.all()] == ["20000.00"]


def test_a_currency_missing_from_the_table_is_kept_when_the_product_is_edited(admin_client):
    """A product pulled with a currency id that BILLING['CURRENCIES'] lacks (stored as
    received): its box was not offered, so saving any change, a new description say, dropped
    the currency and pushed the product to the service without it. Kept, the push names the
    setting instead (docs/mirror.md, "Currency mapping")."""
    import re

    from billing_integration.exceptions import BillingConfigurationError
    from billing_integration.mapping import products as product_map

    product = make_product("Pro", remote=True, status="published")
    Product.objects.filter(pk=product.pk).update(selected_currencies=[1, 9])
    product.refresh_from_db()
    url = reverse("admin:billing_integration_product_change", args=[product.pk])
    page = admin_client.get(url).content.decode()
    # What a browser posts: the boxes the page shows ticked.
    ticked = re.findall(r'name="selected_currencies" value="(\d+)"[^>]*checked', page)
    assert ticked == ["1", "9"]
    assert "BILLING[&#x27;CURRENCIES&#x27;]" in page  # the unknown id says why it has no code
    data = product_form_data(product, description="Now with more", selected_currencies=ticked)
    assert admin_client.post(url, data).status_code == 302
    product.refresh_from_db()
    assert product.description == "Now with more"
    assert product.selected_currencies == [1, 9]
    with pytest.raises(
        BillingConfigurationError, match=r"Currency 9 is not in BILLING\['CURRENCIES'\]"
    ):
        product_map.to_remote(product)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({}, "at least one billing cycle"),
        (new_cycle("", frequency="2"), "at least one price"),
        ({"product_type": "one_time"}, "at least one price"),
    ],
    ids=["no cycle", "a cycle without a price", "a one-time product without a price"],
)
def test_a_new_product_with_nothing_to_sell_is_a_form_error(admin_client, fields, error):
    """The service refuses a product with no billing cycle ("billing_cycles must be a
    non-empty array"), a cycle with no price and a one-time product with no price ("prices
    must be a non-empty array"): the form saved it, and the create failed in the outbox."""
    response = admin_client.post(ADD, product_form_data(name="Empty", **fields))
    assert response.status_code == 200
    assert error in response.content.decode()
    assert not Product.objects.exists() and not OutboxEntry.objects.exists()


def test_the_last_cycle_or_price_of_a_pushed_product_is_not_removed(admin_client):
    """Removing them was a PATCH with no cycle, or a cycle with no price: refused too."""
    product = make_product(remote=True)
    cycle = product.cycles.get()
    change = reverse("admin:billing_integration_product_change", args=[product.pk])
    response = admin_client.post(change, product_form_data(product, **{"cycles-0-DELETE": "on"}))
    assert "at least one billing cycle" in response.content.decode()
    response = admin_client.post(change, product_form_data(product, **{"cycles-0-prices": ""}))
    assert "at least one price" in response.content.decode()
    data = cycle_page_data(cycle, **{"prices-0-DELETE": "on"})
    assert "at least one price" in admin_client.post(cycle_url(cycle), data).content.decode()
    assert product.cycles.get().prices.count() == 1 and not OutboxEntry.objects.exists()


def test_a_product_in_no_currency_is_a_form_error(admin_client):
    """A pulled product with no cycle known here (nothing of it sent but its fields) and every
    currency unticked was a PATCH with ``selected_currencies: []``, which the service refuses
    ("must name at least one currency id")."""
    from billing_integration.outbox import from_remote

    product = make_product(remote=True)
    with from_remote():
        product.cycles.all().delete()
    Product.objects.filter(pk=product.pk).update(blueprint_known=False)
    change = reverse("admin:billing_integration_product_change", args=[product.pk])
    response = admin_client.post(change, product_form_data(product, selected_currencies=[]))
    assert "at least one currency" in response.content.decode()
    product.refresh_from_db()
    assert product.selected_currencies == [1] and not OutboxEntry.objects.exists()
    # Its cycles are not sent: none is no error.
    data = product_form_data(product, description="Sold by the service")
    assert admin_client.post(change, data).status_code == 302


def test_the_type_of_a_pushed_product_is_not_offered_for_change(admin_client):
    """The service has no way to change a product's type: the form offered it, and the
    change was kept here only ("Not sent")."""
    product = make_product(remote=True)
    change = reverse("admin:billing_integration_product_change", args=[product.pk])
    assert 'name="product_type"' not in admin_client.get(change).content.decode()
    admin_client.post(change, product_form_data(product, product_type="one_time"))
    product.refresh_from_db()
    assert product.product_type == "subscription"
    assert 'name="product_type"' in admin_client.get(ADD).content.decode()


def test_saving_a_cycle_page_with_nothing_changed_sends_nothing(admin_client):
    """It saved the cycle all the same, which queued the product's whole blueprint for a PATCH
    (the service takes it as a new one), with no confirmation for a product with
    subscriptions, since nothing was changed."""
    from .conftest import make_subscription

    product = make_product(remote=True)
    make_subscription(product)
    cycle = product.cycles.get()
    response = admin_client.post(cycle_url(cycle), cycle_page_data(cycle))
    assert response.status_code == 302
    assert not OutboxEntry.objects.exists()


def test_a_cycle_made_the_same_as_another_on_its_page_is_a_form_error(admin_client):
    """The cycle's page has no product field, so the form skipped the once-per-product check:
    the save was an IntegrityError (a 500), where the service refuses a duplicate too."""
    from decimal import Decimal

    from billing_integration.models import Price
    from billing_integration.outbox import from_remote

    product = make_product(remote=True)
    with from_remote():
        yearly = BillingCycle.objects.create(product=product, unit="years", frequency=1)
        Price.objects.create(cycle=yearly, currency_id=1, amount=Decimal("100000"))
    cycle = product.cycles.get(unit="months")
    response = admin_client.post(cycle_url(cycle), cycle_page_data(cycle, unit="years"))
    assert response.status_code == 200
    assert "Unit and Frequency already exists" in response.content.decode()
    assert sorted(c.code for c in product.cycles.all()) == ["months-1", "years-1"]
    assert not OutboxEntry.objects.exists()
    data = cycle_page_data(cycle, unit="years", frequency="2")  # another cycle: saved
    assert admin_client.post(cycle_url(cycle), data).status_code == 302


def test_a_price_in_currency_id_0_is_a_currency(admin_client, settings):
    """A product's currencies are those ticked and those priced: id 0 is one of them."""
    settings.BILLING = {**settings.BILLING, "CURRENCIES": {0: "XOF", 2: "USD"}}
    data = product_form_data(
        name="Setup fee",
        product_type="one_time",
        **{
            "root_prices-TOTAL_FORMS": "1",
            "root_prices-0-currency_id": "0",
            "root_prices-0-amount": "5000",
        },
    )
    assert admin_client.post(ADD, data).status_code == 302
    assert Product.objects.get().selected_currencies == [0]


def test_a_free_trial_longer_than_a_trial_can_be_is_a_form_error(admin_client):
    """start_trial refuses a trial longer than MAX_TRIAL_DAYS: the form saved one, and the
    pricing page offered a "Start a 367-day trial" button that every click was refused."""
    from billing_integration.checkout.trials import MAX_TRIAL_DAYS

    product = make_product(remote=True, status="published")
    change = reverse("admin:billing_integration_product_change", args=[product.pk])
    data = product_form_data(product, trial_days=str(MAX_TRIAL_DAYS + 1))
    response = admin_client.post(change, data)
    assert response.status_code == 200
    assert f"A free trial lasts at most {MAX_TRIAL_DAYS} days." in response.content.decode()
    product.refresh_from_db()
    assert product.trial_days is None
    data["trial_days"] = str(MAX_TRIAL_DAYS)
    assert admin_client.post(change, data).status_code == 302
    product.refresh_from_db()
    assert product.trial_days == MAX_TRIAL_DAYS


def test_a_cycle_of_very_many_years_leaves_the_reports_page_readable(admin_client):
    """The form takes any frequency the column holds (the service any integer): a cycle of
    2,147,483,647 years was saved, then its monthly price (frequency x 12 in the database)
    overflowed PostgreSQL's integers and the reports page was a 500 for everyone."""
    data = product_form_data(name="Forever", **new_cycle("XOF 1000", frequency="2147483647"))
    data["cycles-0-unit"] = "years"
    assert admin_client.post(ADD, data).status_code == 302
    assert BillingCycle.objects.get().code == "years-2147483647"
    response = admin_client.get(reverse("admin:billing_integration_report_changelist"))
    assert response.status_code == 200


def test_a_price_in_a_currency_missing_from_the_table_is_kept_when_the_product_is_edited(
    admin_client,
):
    """A one-time product pulled with a root price in a currency id BILLING['CURRENCIES']
    lacks: its row offered no such currency ("---------"), so saving any change, a new
    description say, was refused ("This field is required") unless the price was removed."""
    import re
    import uuid
    from decimal import Decimal

    from billing_integration.models import Price
    from billing_integration.outbox import from_remote

    with from_remote():
        product = Product.objects.create(
            name="Setup fee",
            product_type="one_time",
            status="published",
            selected_currencies=[9],
            remote_id=uuid.uuid4(),
            sync_state="synced",
        )
        price = Price.objects.create(product=product, currency_id=9, amount=Decimal("500"))
    url = reverse("admin:billing_integration_product_change", args=[product.pk])
    page = admin_client.get(url).content.decode()
    # What a browser posts: the option the page shows selected.
    select = re.search(r'<select name="root_prices-0-currency_id".*?</select>', page, re.S)
    assert select is not None
    [chosen] = re.findall(r'<option value="(\d*)" selected>', select.group(0))
    assert chosen == "9"
    data = product_form_data(product, description="Now with more", selected_currencies=["9"])
    data.update(
        {
            "root_prices-TOTAL_FORMS": "1",
            "root_prices-INITIAL_FORMS": "1",
            "root_prices-0-id": str(price.pk),
            "root_prices-0-product": str(product.pk),
            "root_prices-0-currency_id": chosen,
            "root_prices-0-amount": "500.00",
        }
    )
    assert admin_client.post(url, data).status_code == 302
    product.refresh_from_db()
    assert product.description == "Now with more"
    assert list(product.root_prices.values_list("currency_id", "amount")) == [(9, Decimal("500"))]


def test_a_cycle_price_in_a_currency_missing_from_the_table_is_kept_when_edited(admin_client):
    """A cycle priced in a currency id BILLING['CURRENCIES'] lacks (taken out of the table
    since, say): its prices field reads "9 10000", and every save of the product page, a new
    description say, was refused ("Unknown currency id 9") unless the price was rewritten."""
    from decimal import Decimal

    from billing_integration.models import Price
    from billing_integration.outbox import from_remote

    product = make_product(remote=True)
    cycle = product.cycles.get()
    with from_remote():
        Price.objects.create(cycle=cycle, currency_id=9, amount=Decimal("7"))
    url = reverse("admin:billing_integration_product_change", args=[product.pk])
    assert 'value="XOF 10000.00, 9 7.00"' in admin_client.get(url).content.decode()
    data = product_form_data(product, description="Now with more")
    assert data["cycles-0-prices"] == "XOF 10000.00, 9 7.00"
    assert admin_client.post(url, data).status_code == 302
    product.refresh_from_db()
    assert product.description == "Now with more"
    assert sorted(cycle.prices.values_list("currency_id", flat=True)) == [1, 9]
    # An id the cycle has not got is still refused.
    data["cycles-0-prices"] = "XOF 10000.00, 9 7.00, 8 1"
    response = admin_client.post(url, data)
    assert response.status_code == 200 and "Unknown currency id 8." in response.content.decode()
