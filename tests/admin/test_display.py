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


# --- issue 23: small things people saw ----------------------------------------------------------
def filter_block(html: str, title: str) -> str:
    """The admin changelist filter titled ``title`` (its <details> element)."""
    return html.split(f"By {title}")[1].split("</details>")[0]


def test_checkout_sessions_show_currency_codes_and_say_when_expired(admin_client):
    from datetime import timedelta

    from django.utils import timezone

    from billing_integration.models import CheckoutSession

    product = make_product(remote=True)
    customer = named_customer()
    now = timezone.now()
    past = CheckoutSession.objects.create(
        remote_id=uuid.uuid4(),
        customer=customer,
        product=product,
        status="open",
        selected_currency=1,
        selected_billing_cycle="months-1",
        expires_at=now - timedelta(hours=1),
    )
    live = CheckoutSession.objects.create(
        remote_id=uuid.uuid4(),
        customer=customer,
        product=product,
        status="open",
        selected_currency=2,
        selected_billing_cycle="months-1",
        expires_at=now + timedelta(hours=1),
    )
    html = admin_client.get(
        reverse("admin:billing_integration_checkoutsession_changelist")
    ).content.decode()
    rows = html.split('class="results"')[1].split("</table>")[0].split("<tr")[2:]
    by_id = {s.pk: f" {text(r)} " for s in (past, live) for r in rows if str(s.remote_id) in r}
    assert " XOF " in by_id[past.pk] and " expired " in by_id[past.pk]
    assert " USD " in by_id[live.pk] and " open " in by_id[live.pk]
    assert "(open)" not in by_id[past.pk]  # its name does not contradict it
    for row in rows:
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        assert "1" not in [text(c) for c in cells] and "2" not in [text(c) for c in cells]
    change = admin_client.get(
        reverse("admin:billing_integration_checkoutsession_change", args=[past.pk])
    ).content.decode()
    page = text(change)
    assert "expired" in page and "XOF" in page
    assert "no way to read a checkout session back" in page
    assert "arrives by events and pulls" in page


def test_the_checkout_status_filter_lists_what_the_column_says(admin_client):
    """An open session past its expiry is shown "expired": the filter "open" leaves it out and
    the filter "expired" lists it."""
    from datetime import timedelta

    from django.utils import timezone

    from billing_integration.models import CheckoutSession

    product, customer, now = make_product(remote=True), named_customer(), timezone.now()
    sessions = {
        name: CheckoutSession.objects.create(
            remote_id=uuid.uuid4(), customer=customer, product=product, status="open", expires_at=at
        )
        for name, at in (("past", now - timedelta(hours=1)), ("live", now + timedelta(hours=1)))
    }
    url = reverse("admin:billing_integration_checkoutsession_changelist")
    offered = filter_block(admin_client.get(url).content.decode(), "status")
    links = {
        text(label): href for href, label in re.findall(r'href="([^"]*)"[^>]*>(.*?)</a>', offered)
    }
    for label, shown in (("open", "live"), ("expired", "past")):
        html = admin_client.get(url + links[label].replace("&amp;", "&")).content.decode()
        rows = html.split('class="results"')[1].split("</table>")[0]
        listed = {name for name, s in sessions.items() if str(s.remote_id) in rows}
        assert listed == {shown}, label


def test_records_name_their_subscription_by_product_and_subscriber(admin_client):
    """A payment reads "Pro for Ada Lovelace", never "Pro for auth.user:3"; an invoice whose
    subscription was mirrored after it links that subscription, not a bare UUID."""
    from billing_integration.models import Invoice

    product = make_product(remote=True)
    sub = make_subscription(product)
    Subscription.objects.filter(pk=sub.pk).update(customer=named_customer())
    pay = Payment.objects.create(
        remote_id=uuid.uuid4(),
        status="completed",
        currency="XOF",
        amount=Decimal("10000"),
        subscription=sub,
        subscription_remote_id=sub.remote_id,
    )
    late = Invoice.objects.create(  # its event came before the subscription was mirrored
        remote_id=uuid.uuid4(), status="paid", subscription_remote_id=sub.remote_id
    )
    unknown = uuid.uuid4()
    orphan = Invoice.objects.create(
        remote_id=uuid.uuid4(), status="paid", subscription_remote_id=unknown
    )
    sub_url = reverse("admin:billing_integration_subscription_change", args=[sub.pk])
    for listing, record in (
        ("admin:billing_integration_payment_changelist", pay),
        ("admin:billing_integration_invoice_changelist", late),
    ):
        html = admin_client.get(reverse(listing)).content.decode()
        results = html.split('class="results"')[1]
        assert "Pro for Ada Lovelace" in text(results) and "auth.user:" not in results
        assert f'href="{sub_url}"' in results
    for name, record in (("payment", pay), ("invoice", late)):
        change = admin_client.get(
            reverse(f"admin:billing_integration_{name}_change", args=[record.pk])
        ).content.decode()
        related = text(change.split(">Related</h2>")[1].split(">Remote</h2>")[0])
        assert "Pro for Ada Lovelace" in related and "auth.user:" not in related
    change = admin_client.get(
        reverse("admin:billing_integration_invoice_change", args=[orphan.pk])
    ).content.decode()
    assert f"{unknown} (not mirrored here)" in text(change.split(">Related</h2>")[1])


def test_a_record_list_looks_up_late_subscriptions_once_per_page(admin_client):
    """Invoices whose subscription was mirrored after their event: the list finds those
    subscriptions in one query for the page, whatever the number of such rows."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from billing_integration.models import Invoice

    product = make_product(remote=True)
    url = reverse("admin:billing_integration_invoice_changelist")

    def add(count: int) -> None:
        for _ in range(count):
            sub = make_subscription(product)
            Invoice.objects.create(
                remote_id=uuid.uuid4(), status="paid", subscription_remote_id=sub.remote_id
            )
            Invoice.objects.create(  # and one whose subscription is not mirrored
                remote_id=uuid.uuid4(), status="paid", subscription_remote_id=uuid.uuid4()
            )

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            html = admin_client.get(url).content.decode()
        assert "not mirrored here" in html and "Pro for" in text(html)
        return len(captured)

    add(1)
    one = queries()
    add(9)
    assert queries() == one


def test_the_product_form_reads_currencies_by_code(admin_client):
    from billing_integration.conf import billing_settings

    html = admin_client.get(reverse("admin:billing_integration_product_add")).content.decode()
    assert ">Currencies:</label>" in html and "currencies:" not in text(html)
    options = re.findall(r'<label for="id_selected_currencies_\d+">.*?</label>', html, re.S)
    codes = [code for _cid, code in sorted(billing_settings.CURRENCIES.items())]
    assert [text(o) for o in options] == codes and codes[:2] == ["XOF", "USD"]


def test_a_new_product_form_shows_no_sync_state(admin_client):
    add = admin_client.get(reverse("admin:billing_integration_product_add")).content.decode()
    assert "Pending push" not in add and "Synchronisation" not in add
    product = make_product()
    change = admin_client.get(
        reverse("admin:billing_integration_product_change", args=[product.pk])
    ).content.decode()
    assert "Pending push" in change  # once saved, it is


def test_the_subscription_status_filter_offers_what_the_column_says(admin_client):
    product = make_product(remote=True)
    active = make_subscription(product, status="published")
    make_subscription(product, status="canceled")
    make_subscription(product, status="weird")
    url = reverse("admin:billing_integration_subscription_changelist")
    html = admin_client.get(url).content.decode()
    offered = text(filter_block(html, "status"))
    assert "Active" in offered and "Canceled" in offered and "Unknown status" in offered
    assert "published" not in offered
    chosen = admin_client.get(url, {"status": "published"}).content.decode()
    rows = chosen.split('class="results"')[1].split("</table>")[0]
    assert str(active.remote_id) in rows and rows.count("<tr") == 2  # header + one row
