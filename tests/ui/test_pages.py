"""The app's pages in the site's layout (BILLING['BASE_TEMPLATE']), with human labels and
money per currency (issue 14)."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from django.template import Context, Template
from django.test import RequestFactory
from django.utils import translation

from billing_integration import display
from billing_integration.checkout import views as checkout_views
from billing_integration.checkout.services import ServiceUnavailable
from billing_integration.models import Product
from tests.conftest import mark_pushed

from .conftest import subscription
from .test_account import text

pytestmark = pytest.mark.django_db

SITE_NAV = '<a class="brand" href="/">Acme Cloud</a>'


def test_money_per_currency_and_language() -> None:
    with translation.override("en"):
        assert display.format_money(Decimal("5000.0000"), "XOF") == "XOF\xa05,000"
        assert display.format_money(Decimal("9"), "usd") == "USD\xa09.00"
        assert display.format_money(Decimal("1234.5"), "EUR") == "EUR\xa01,234.50"
        assert display.format_money(None, "XOF") == ""
    with translation.override("fr"):
        assert display.format_money(Decimal("5000.0000"), "XOF") == "5\u202f000\xa0XOF"
        assert display.format_money(Decimal("9"), "USD") == "9,00\xa0USD"
    assert display.format_money("5000", "XOF", locale="fr-fr") == "5\u202f000\xa0XOF"
    assert display.format_money("5000", "XOF", locale="zz-qq") == "XOF\xa05,000"  # "en"


def test_cycle_and_status_labels(demo, seeded) -> None:
    assert [display.cycle_label(c) for c in ("months-1", "months-3", "years-1", "years-2")] == [
        "Monthly",
        "Every 3 months",
        "Yearly",
        "Every 2 years",
    ]
    assert display.cycle_label("") == "One-time"
    assert [
        display.status_label(s)
        for s in ("published", " Published ", "canceled", "paused", "", "frozen")
    ] == ["Active", "Active", "Canceled", "Paused", "Unknown status", "Unknown status"]
    lapsed = subscription(demo, seeded["Pro"], lapsed=True)
    assert display.status_label(lapsed) == "Lapsed"
    assert display.failure_reason_label("insufficient_funds") == "Insufficient funds"


def test_template_filters(seeded) -> None:
    price = seeded["Starter"].cycles.get(unit="months", frequency=1).prices.get(currency_id=1)
    html = Template(
        "{% load billing %}{{ p|price_label }}|{{ a|money:'XOF' }}|{{ 2|currency_code }}|"
        "{{ 'years-2'|cycle_label }}|{{ 'published'|status_label }}|{{ r|failure_reason }}"
    ).render(Context({"p": price, "a": Decimal("5000.0000"), "r": "declined"}))
    assert html == "XOF\xa05,000|XOF\xa05,000|USD|Every 2 years|Active|Declined"


def test_pricing_page_shows_money_and_cycles_humanly(client, seeded) -> None:
    mark_pushed(*seeded.values())
    html = text(client.get("/pricing/").content.decode())
    assert "XOF 5,000 · Monthly" in html and "USD 9.00 · Monthly" in html
    assert "XOF 50,000 · Yearly" in html
    assert "5000.00" not in html and "months-1" not in html.replace('"months-1"', "")


def test_checkout_button_label_with_price(rf, demo, seeded) -> None:
    request = RequestFactory().get("/")
    request.user = demo
    # pushed: a product the service does not know yet is not offered ("Not available")
    mark_pushed(seeded["Starter"])
    html = Template(
        "{% load billing %}{% billing_checkout_button p cycle='years-1' currency='XOF' "
        "label='Subscribe for {price}, {cycle}' %}"
    ).render(Context({"p": seeded["Starter"], "request": request}))
    assert ">Subscribe for XOF\xa050,000, Yearly</button>" in html


def test_checkout_button_label_with_the_price_of_a_one_time_product(rf, demo) -> None:
    """A one-time product's price is at its root (no cycle): ``{price}`` shows it."""
    from billing_integration.models import Price
    from billing_integration.outbox import from_remote

    with from_remote():
        ebook = Product.objects.create(
            name="Ebook",
            status="published",
            product_type="one_time",
            selected_currencies=[1],
            remote_id=uuid.uuid4(),
        )
        Price.objects.create(product=ebook, currency_id=1, amount=Decimal("2500"))
    mark_pushed(ebook)
    request = RequestFactory().get("/")
    request.user = demo
    html = Template(
        "{% load billing %}{% billing_checkout_button p currency='XOF' label='Buy for {price}' %}"
    ).render(Context({"p": ebook, "request": request}))
    assert ">Buy for XOF\xa02,500</button>" in html


def test_return_page_in_the_sites_layout_links_the_billing_page(client, demo, seeded) -> None:
    subscription(demo, seeded["Starter"])
    client.force_login(demo)
    answer = client.get("/billing/checkout/return/")
    html = answer.content.decode()
    assert answer.status_code == 200 and SITE_NAV in html
    assert "<title>Subscription active · billing demo</title>" in html
    assert "You are subscribed to <strong>Starter</strong> (Monthly)" in html
    assert 'id="billing-account-link" href="/billing/account/"' in html


def test_error_pages_in_the_sites_layout(client, demo, seeded) -> None:
    mark_pushed(seeded["Starter"])
    subscription(demo, seeded["Starter"])
    client.force_login(demo)
    held = client.post(
        "/billing/checkout/",
        {"product": seeded["Starter"].pk, "cycle": "months-1", "currency": "XOF"},
    )
    html = held.content.decode()
    assert held.status_code == 409 and SITE_NAV in html
    assert "You already have this plan" in html and 'href="/billing/account/"' in html

    request = RequestFactory().get("/")
    request.user = demo
    unavailable = checkout_views.error_page(request, ServiceUnavailable())
    html = unavailable.content.decode()
    assert unavailable.status_code == 503 and SITE_NAV in html
    assert "Nothing was charged" in html and "You have not been charged." not in html


def test_the_apps_own_base_by_default(client, demo, seeded, settings) -> None:
    settings.BILLING = {**settings.BILLING, "BASE_TEMPLATE": "billing_integration/base.html"}
    client.force_login(demo)
    html = client.get("/billing/checkout/return/").content.decode()
    assert 'id="billing-main"' in html and SITE_NAV not in html
    assert "<title>Checkout</title>" in html


@pytest.mark.parametrize(
    "next_url,secure",
    [
        ("https://evil.example/", False),
        ("//evil.example/", False),
        ("http://testserver/members/", True),
    ],
)
def test_the_example_sign_up_never_redirects_off_site_nor_down_to_http(client, next_url, secure):
    """A ``next`` to another site, or to plain HTTP from an HTTPS page, goes to pricing."""
    form = {"username": "carol", "password1": "pw-for-tests-1", "password2": "pw-for-tests-1"}
    response = client.post(f"/accounts/signup/?next={next_url}", form, secure=secure)
    assert response.status_code == 302
    assert response["Location"] == "/pricing/"


def _plan(name: str) -> Product:
    """A plan on sale with a trial and two options (monthly and yearly, XOF)."""
    from billing_integration.models import BillingCycle, Price
    from billing_integration.outbox import from_remote

    with from_remote():
        product = Product.objects.create(
            name=name,
            status="published",
            selected_currencies=[1],
            remote_id=uuid.uuid4(),
            sync_state="synced",
            trial_days=7,
        )
        for unit in ("months", "years"):
            cycle = BillingCycle.objects.create(product=product, unit=unit, frequency=1)
            Price.objects.create(cycle=cycle, currency_id=1, amount=Decimal("5000"))
    mark_pushed(product)
    return product


def test_the_pricing_pages_queries_do_not_grow_with_the_plans(
    client, demo, seeded, django_assert_max_num_queries
) -> None:
    """Each plan's trial and checkout buttons ask what the subscriber holds (a live plan, one
    that may renew, a trial had): read once per page, not once per button."""
    mark_pushed(*seeded.values())  # on sale: buttons for each option
    subscription(demo, seeded["Starter"])
    subscription(demo, seeded["Pro"], status="canceled")  # in its paid period: no plan held
    client.force_login(demo)
    client.get("/pricing/")  # warm caches (content types, sessions)
    with django_assert_max_num_queries(1000) as captured:
        assert client.get("/pricing/").status_code == 200
    few = len(captured)
    for i in range(5):
        _plan(f"Plan {i}")
    with django_assert_max_num_queries(few):
        page = client.get("/pricing/").content.decode()
    assert page.count('class="card plan"') == 8
