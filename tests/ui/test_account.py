"""The customer's billing page (issue 16): billing_integration:account, in the site's layout."""

from __future__ import annotations

import re
import uuid
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from billing_integration.models import CheckoutSession, Payment

from .conftest import customer_of, invoice, payment, refund, subscription

pytestmark = pytest.mark.django_db

URL = "/billing/account/"


def section(html: str, table_id: str) -> str:
    return html.split(f'<table id="{table_id}">')[1].split("</table>")[0]


def text(html: str) -> str:
    """Tags out, whitespace (no-break spaces included) collapsed."""
    return " ".join(re.sub(r"<[^>]+>", " ", html).replace("\u202f", " ").split())


def forms(html: str) -> list[dict[str, str]]:
    out = []
    for match in re.finditer(r'<form method="post" action="([^"]+)"[^>]*>(.*?)</form>', html, re.S):
        action, body = match.groups()
        fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', body))
        fields.pop("csrfmiddlewaretoken", None)
        out.append({"action": action, **fields})
    return out


def test_login_required(client) -> None:
    answer = client.get(URL)
    assert answer.status_code == 302 and "/accounts/login/" in answer["Location"]
    assert reverse("billing_integration:account") == URL


def test_every_record_type_shown_humanly_in_the_sites_layout(client, demo, seeded) -> None:
    starter, pro = seeded["Starter"], seeded["Pro"]
    active = subscription(demo, starter, cycle="months-1", currency="XOF")
    lapsed = subscription(demo, pro, lapsed=True, cycle="years-1", currency="USD")
    paid = payment(active, "completed", "5000.0000", "XOF", minutes_ago=5)
    payment(lapsed, "failed", "250", "USD", reason="insufficient_funds")
    invoice(active, "5000", "XOF")
    refund(paid, "1000")
    client.force_login(demo)
    answer = client.get(URL)
    assert answer.status_code == 200
    html = answer.content.decode()
    assert "Acme Cloud" in html and 'href="/pricing/"' in html  # BASE_TEMPLATE: the site's nav

    subs = text(section(html, "billing-subscriptions"))
    assert "Starter Active XOF 5,000 Monthly" in subs
    assert "Pro Lapsed USD 250.00 Yearly Choose a plan" in subs
    assert "published" not in subs and "months-1" not in subs
    assert 'id="billing-lapsed"' in html and 'class="billing-choose-plan" href="/pricing/"' in html

    pays = text(section(html, "billing-payments"))
    assert "Starter XOF 5,000 Completed" in pays
    assert "Pro USD 250.00 Failed Insufficient funds" in pays
    assert "5000.0000" not in html
    assert "XOF 1,000 Approved duplicate charge" in text(section(html, "billing-refunds"))
    assert "Starter" in text(section(html, "billing-invoices"))
    assert "XOF 5,000 Paid" in text(section(html, "billing-invoices"))


def test_pay_again_for_a_lapsed_product_posts_to_checkout(client, demo, seeded) -> None:
    """A lapsed Pro that no longer renews (the service stopped retrying its payment): a Pro
    that may still renew is refused a second subscription, see tests/checkout/
    test_lapsed_renewal.py."""
    from billing_integration.models import Subscription

    pro = seeded["Pro"]
    lapsed = subscription(demo, pro, lapsed=True, cycle="years-1", currency="USD")
    Subscription.objects.filter(pk=lapsed.pk).update(auto_renew=False)
    payment(lapsed, "failed", "250", "USD", reason="declined", minutes_ago=10)
    latest = payment(lapsed, "failed", "250", "USD", reason="insufficient_funds")
    client.force_login(demo)
    html = client.get(URL).content.decode()
    found = forms(section(html, "billing-payments"))
    # one form: the latest failed payment of the product, same product, cycle and currency
    assert found == [
        {
            "action": "/billing/checkout/",
            "product": str(pro.pk),
            "cycle": "years-1",
            "currency": "USD",
            "next": URL,
        }
    ]
    row = section(html, "billing-payments").split(f'data-payment="{latest.pk}"')[1]
    assert "Pay again" in row.split("</tr>")[0]


def test_pay_again_without_a_subscription_takes_the_checkouts_cycle(client, demo, seeded) -> None:
    """A first payment that failed left no subscription: the form carries the cycle of the
    customer's checkout session for that product (Pro has two cycles, so one is needed)."""
    pro = seeded["Pro"]
    customer = customer_of(demo)
    CheckoutSession.objects.create(
        customer=customer,
        product=pro,
        remote_id=uuid.uuid4(),
        selected_billing_cycle="years-1",
        selected_currency=1,
    )
    Payment.objects.create(
        remote_id=uuid.uuid4(),
        status="failed",
        amount=Decimal("150000"),
        currency="XOF",
        customer=customer,
        product=pro,
        failure_reason="declined",
        remote_created=timezone.now(),
    )
    client.force_login(demo)
    html = client.get(URL).content.decode()
    assert forms(section(html, "billing-payments")) == [
        {
            "action": "/billing/checkout/",
            "product": str(pro.pk),
            "cycle": "years-1",
            "currency": "XOF",
            "next": URL,
        }
    ]
    assert "XOF 150,000 Failed Declined Pay again" in text(section(html, "billing-payments"))


def test_no_pay_again_while_the_product_is_still_held(client, demo, seeded) -> None:
    """A renewal that failed while the subscription still grants access: buying again would
    be a second purchase (refused 409), so the page says access continues instead."""
    starter = seeded["Starter"]
    held = subscription(demo, starter, last_payment_status="failed")
    payment(held, "failed", "5000", "XOF", reason="declined")
    client.force_login(demo)
    html = client.get(URL).content.decode()
    assert forms(section(html, "billing-payments")) == []
    assert "your access continues until" in text(section(html, "billing-subscriptions"))
    assert 'id="billing-lapsed"' not in html


def test_no_pay_again_for_a_second_plan_or_a_product_not_on_sale(client, demo, seeded) -> None:
    """One plan at a time: a lapsed Pro whose renewal failed is not offered again while
    Starter (same group) is held; nor is a product whose publication the service refused."""
    from billing_integration.models import Product, Subscription

    pro, team = seeded["Pro"], seeded["Team"]
    subscription(demo, seeded["Starter"])
    lapsed_pro = subscription(demo, pro, lapsed=True)
    # no longer renewing: one that may still renew is never offered again (a second one)
    Subscription.objects.filter(pk=lapsed_pro.pk).update(auto_renew=False)
    payment(lapsed_pro, "failed", "9000", "XOF", reason="declined")
    client.force_login(demo)
    assert forms(section(client.get(URL).content.decode(), "billing-payments")) == []

    Product.objects.filter(pk=pro.pk).update(add_on=True)  # an add-on is sold beside a plan
    assert len(forms(section(client.get(URL).content.decode(), "billing-payments"))) == 1

    lapsed_team = subscription(demo, team, lapsed=True, cycle="years-1")
    Subscription.objects.filter(pk=lapsed_team.pk).update(auto_renew=False)
    payment(lapsed_team, "failed", "90000", "XOF", reason="declined")
    Product.objects.filter(pk__in=[pro.pk, team.pk]).update(
        add_on=True, sync_state="failed", remote_data={"status": "archived"}
    )
    assert forms(section(client.get(URL).content.decode(), "billing-payments")) == []


def test_no_pay_again_for_a_plan_beside_one_that_may_still_renew(client, demo, seeded) -> None:
    """Starter's period ended here but it still renews on the service (status granting
    access, auto_renew on): Pro, whose payment failed, would be a second plan (checkout
    refuses it, 409), so the page does not offer it until Starter no longer renews."""
    from billing_integration.models import Subscription

    starter = subscription(demo, seeded["Starter"], lapsed=True)
    pro = subscription(demo, seeded["Pro"], lapsed=True)
    Subscription.objects.filter(pk=pro.pk).update(auto_renew=False)
    payment(pro, "failed", "9000", "XOF", reason="declined")
    client.force_login(demo)
    assert Subscription.objects.get(pk=starter.pk).auto_renew
    assert forms(section(client.get(URL).content.decode(), "billing-payments")) == []

    Subscription.objects.filter(pk=starter.pk).update(auto_renew=False)
    offers = forms(section(client.get(URL).content.decode(), "billing-payments"))
    assert [o["product"] for o in offers] == [str(seeded["Pro"].pk)]


def test_no_subscription_links_to_pricing(client, demo) -> None:
    client.force_login(demo)
    html = client.get(URL).content.decode()
    assert "No subscription yet." in html and 'href="/pricing/"' in html


def _fill(user, products, n: int) -> None:
    for i in range(n):
        product = products[["Starter", "Pro", "Team"][i % 3]]
        sub = subscription(user, product, lapsed=bool(i % 2))
        pay = payment(sub, "failed" if i % 2 else "completed", "5000", "XOF", minutes_ago=i)
        invoice(sub, "5000", "XOF")
        refund(pay, "100")


def test_the_number_of_queries_does_not_grow_with_the_records(client, demo, seeded) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries() -> int:
        client.get(URL)  # warm caches (content types, sessions)
        with CaptureQueriesContext(connection) as captured:
            assert client.get(URL).status_code == 200
        return len(captured)

    from billing_integration.models import Subscription

    client.force_login(demo)
    _fill(demo, seeded, 1)
    one = queries()
    first = Subscription.objects.get()
    _fill(demo, seeded, 5)
    # one plan renews (two renewing would add the alert of docs/changes.md, once per page)
    Subscription.objects.exclude(pk=first.pk).update(auto_renew=False)
    assert queries() == one


def test_the_example_projects_account_page_is_the_apps(client, demo, seeded) -> None:
    subscription(demo, seeded["Starter"])
    client.force_login(demo)
    html = client.get("/account/").content.decode()
    assert '<table id="billing-subscriptions">' in html
    nav = client.get("/").content.decode().split("</nav>")[0]
    assert 'href="/account/"' in nav


def test_a_subscriptions_price_is_the_one_the_service_confirmed(client, demo, seeded) -> None:
    """A price changed here whose push the service has not acknowledged yet is not what the
    service charges: the page shows the confirmed one (``Product.confirmed_prices``)."""
    from billing_integration.models import Price, Product

    from ..conftest import mark_pushed

    starter = seeded["Starter"]
    mark_pushed(starter)  # the service holds XOF 5,000 a month
    Price.objects.filter(cycle__product=starter, cycle__unit="months", currency_id=1).update(
        amount=Decimal("6000")
    )
    subscription(demo, Product.objects.get(pk=starter.pk), cycle="months-1", currency="XOF")
    client.force_login(demo)
    subs = text(section(client.get(URL).content.decode(), "billing-subscriptions"))
    assert "Starter Active XOF 5,000 Monthly" in subs
    assert "6,000" not in subs


def test_no_pay_again_for_a_cycle_the_service_has_not_confirmed(client, demo, seeded) -> None:
    """Pro's yearly cycle was added here and its push is not acknowledged: checkout refuses it
    (409 option_not_confirmed), so the page does not offer to pay it again until it is."""
    from billing_integration.models import Product, Subscription

    from ..conftest import mark_pushed

    pro = seeded["Pro"]
    mark_pushed(pro)
    confirmed = Product.objects.get(pk=pro.pk).confirmed_cycles
    Product.objects.filter(pk=pro.pk).update(
        confirmed_cycles={k: v for k, v in confirmed.items() if k != "years-1"}
    )
    lapsed = subscription(demo, pro, lapsed=True, cycle="years-1", currency="USD")
    Subscription.objects.filter(pk=lapsed.pk).update(auto_renew=False)
    payment(lapsed, "failed", "250", "USD", reason="declined")
    client.force_login(demo)
    assert forms(section(client.get(URL).content.decode(), "billing-payments")) == []

    Product.objects.filter(pk=pro.pk).update(confirmed_cycles=confirmed)  # acknowledged
    offers = forms(section(client.get(URL).content.decode(), "billing-payments"))
    assert [(o["product"], o["cycle"], o["currency"]) for o in offers] == [
        (str(pro.pk), "years-1", "USD")
    ]


def test_no_pay_again_for_a_one_time_product_already_bought(client, demo) -> None:
    """An ebook bought once (a completed payment, not refunded), then a second attempt that
    failed: checkout refuses a second purchase (409 already_bought), so no "Pay again"; once
    the purchase is refunded, the failed attempt may be paid again."""
    from billing_integration.models import Price, Product, Refund

    from ..conftest import mark_pushed

    ebook = Product.objects.create(
        name="Ebook", status="published", product_type="one_time", selected_currencies=[1]
    )
    Price.objects.create(product=ebook, currency_id=1, amount=Decimal("3000"))
    mark_pushed(ebook)
    customer = customer_of(demo)
    now = timezone.now()

    def paid(status: str, minutes_ago: int) -> Payment:
        return Payment.objects.create(
            remote_id=uuid.uuid4(),
            status=status,
            amount=Decimal("3000"),
            currency="XOF",
            customer=customer,
            product=ebook,
            remote_created=now - timezone.timedelta(minutes=minutes_ago),
        )

    bought = paid("completed", 10)
    paid("failed", 1)
    client.force_login(demo)
    assert forms(section(client.get(URL).content.decode(), "billing-payments")) == []

    Refund.objects.create(
        remote_id=uuid.uuid4(), payment=bought, customer=customer, status="approved",
        amount=Decimal("3000"), currency="XOF",
    )  # fmt: skip
    offers = forms(section(client.get(URL).content.decode(), "billing-payments"))
    assert [(o["product"], o["currency"]) for o in offers] == [(str(ebook.pk), "XOF")]


def test_another_subscribers_records_and_forms_are_never_on_the_page(client, demo, seeded) -> None:
    """What an attacker signed in as another user sees of the demo's billing: nothing. The
    page has no id in its URL to change; its rows and forms are the request's subscriber's."""
    from django.contrib.auth import get_user_model

    starter = seeded["Starter"]
    mine = subscription(demo, starter)
    eve = get_user_model().objects.create_user("eve", password="pw")
    theirs = subscription(eve, seeded["Pro"], cycle="years-1", currency="USD")
    paid = payment(theirs, "completed", "250", "USD")
    failed = payment(theirs, "failed", "250", "USD", reason="declined")
    bill = invoice(theirs, "250", "USD")
    back = refund(paid, "10")

    client.force_login(demo)
    html = client.get(URL).content.decode()
    assert f'data-subscription="{mine.pk}"' in html
    assert f'data-subscription="{theirs.pk}"' not in html
    for marker in (
        f'data-payment="{paid.pk}"',
        f'data-payment="{failed.pk}"',
        f'data-invoice="{bill.pk}"',
        f'data-refund="{back.pk}"',
        f"/subscriptions/{theirs.pk}/",
    ):
        assert marker not in html, marker
    assert all(form["action"] != "/billing/checkout/" for form in forms(html))  # no pay again

    client.force_login(eve)
    html = client.get(URL).content.decode()
    assert f'data-subscription="{theirs.pk}"' in html and f'data-payment="{failed.pk}"' in html
    assert f'data-subscription="{mine.pk}"' not in html
