"""The example project's pages and seed command, with Django's test client (no browser).

The browser test next door drives the same pages in Chromium; these run everywhere, fast.
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

from billing_integration.models import (
    Customer,
    OutboxEntry,
    Payment,
    Product,
    Subscription,
)
from billing_integration.outbox import from_remote

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_broker(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Pushes are recorded, never sent to a broker."""
    from billing_integration.outbox import tasks

    calls: list[int] = []
    monkeypatch.setattr(tasks, "enqueue", lambda pk, countdown=None: calls.append(pk) or True)
    return calls


@pytest.fixture
def seeded(capsys: pytest.CaptureFixture) -> str:
    call_command("billing_demo_seed")
    return capsys.readouterr().out


@pytest.fixture
def on_sale(seeded: str) -> str:
    """The seeded products as once a worker pushed them (a remote id each, cycles known): a
    button is offered only for what a click can buy."""
    for pk in Product.objects.values_list("pk", flat=True):
        Product.objects.filter(pk=pk).update(remote_id=uuid.uuid4(), blueprint_known=True)
    return seeded


def forms_of(html: str) -> list[dict[str, str]]:
    """The checkout forms of a page: {action, product, cycle, currency, next}."""
    out = []
    for match in re.finditer(r'<form method="post" action="([^"]+)"[^>]*>(.*?)</form>', html, re.S):
        action, body = match.groups()
        if action != "/billing/checkout/":
            continue
        fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', body))
        out.append({"action": action, **fields})
    return out


def active_subscription(user, product: Product) -> Subscription:
    customer = Customer.objects.create(
        subscriber=user, identifier=f"auth.user:{user.pk}", remote_id=uuid.uuid4()
    )
    now = timezone.now()
    with from_remote():
        return Subscription.objects.create(
            remote_id=uuid.uuid4(),
            customer=customer,
            product=product,
            status="published",
            cycle_start_date=now,
            cycle_end_date=now + timedelta(days=30),
            next_billing_date=now + timedelta(days=30),
            selected_billing_cycle="months-1",
            selected_currency="XOF",
        )


def test_seed_creates_logins_and_products_once(seeded: str, capsys) -> None:
    User = get_user_model()
    admin, demo = User.objects.get(username="admin"), User.objects.get(username="demo")
    assert admin.is_superuser and admin.is_staff and admin.check_password("admin")
    assert not demo.is_staff and demo.check_password("demo")
    assert "user admin / admin (created)" in seeded

    products = {p.name: p for p in Product.objects.all()}
    assert set(products) == {"Starter", "Pro", "Team"}
    assert {p.status for p in products.values()} == {"published"}
    starter = products["Starter"]
    assert starter.selected_currencies == [1, 2]
    assert {
        (c.code, p.currency_id, p.amount) for c in starter.cycles.all() for p in c.prices.all()
    } == {
        ("months-1", 1, Decimal("5000")),
        ("months-1", 2, Decimal("9")),
        ("years-1", 1, Decimal("50000")),
        ("years-1", 2, Decimal("90")),
    }
    assert products["Team"].selected_currencies == [1, 3]
    # One outbox entry per product (the whole product in one transaction), to be pushed.
    entries = OutboxEntry.objects.filter(state="pending")
    assert sorted(e.object_id for e in entries) == sorted(p.pk for p in products.values())

    call_command("billing_demo_seed")
    again = capsys.readouterr().out
    assert "(created)" not in again and again.count("(exists)") == 5
    assert Product.objects.count() == 3 and User.objects.count() == 2
    assert OutboxEntry.objects.count() == entries.count()


def test_pricing_lists_published_products_with_a_button_per_cycle_and_currency(
    on_sale: str, client
) -> None:
    with from_remote():
        Product.objects.create(name="Secret draft", status="draft", selected_currencies=[1])
    anonymous = client.get("/pricing/")
    assert anonymous.status_code == 200
    html = anonymous.content.decode()
    assert all(name in html for name in ("Starter", "Pro", "Team"))
    assert "Secret draft" not in html
    assert forms_of(html) == []  # sign up or log in first
    assert 'href="/accounts/signup/?next=/pricing/"' in html

    client.login(username="demo", password="demo")
    forms = forms_of(client.get("/pricing/").content.decode())
    ids = {p.name: str(p.pk) for p in Product.objects.all()}
    assert sorted((f["product"], f["cycle"], f["currency"]) for f in forms) == sorted(
        [(ids["Starter"], c, k) for c in ("months-1", "years-1") for k in ("XOF", "USD")]
        + [(ids["Pro"], c, k) for c in ("months-1", "years-1") for k in ("XOF", "USD")]
        + [(ids["Team"], "years-1", k) for k in ("XOF", "EUR")]
    )
    assert {f["next"] for f in forms} == {"/members/"}


def test_pricing_offers_no_second_plan_beside_the_current_one(on_sale: str, client) -> None:
    """One plan at a time: "Current plan" only on the cycle and currency held; every other
    option (Pro's other cycles and currencies, Starter, Team) is a change, not a purchase."""
    demo = get_user_model().objects.get(username="demo")
    pro = Product.objects.get(name="Pro")
    active_subscription(demo, pro)  # months-1, XOF
    client.force_login(demo)
    html = client.get("/pricing/").content.decode()
    assert forms_of(html) == []
    assert html.count("Current plan") == 1
    section = html.split(f'data-product="{pro.pk}"')[1].split("</section>")[0]
    assert "your plan" in section
    held = section.split('data-cycle="months-1" data-currency="XOF"')[1].split("</div>")[0]
    assert "Current plan" in held
    options = re.findall(r'<div class="option"[^>]*>(.*?)</div>', html, re.S)
    assert len(options) == 10
    changes = [o for o in options if "Change plan" in o]
    assert len(changes) == 9
    assert all('action="/billing/account/change-plan/"' in o for o in changes)

    # an add-on is sold beside the plan
    Product.objects.filter(name="Starter").update(add_on=True)
    forms = forms_of(client.get("/pricing/").content.decode())
    starter = str(Product.objects.get(name="Starter").pk)
    assert forms and {f["product"] for f in forms} == {starter}


def test_pricing_labels_do_not_wrap(seeded: str, client) -> None:
    """A "Current plan" or "Change of plan" label stays on one line, without the paragraph's
    margins: every option row keeps the height of a row with a button."""
    css = client.get("/pricing/").content.decode().split("<style>")[1].split("</style>")[0]
    rules = dict(re.findall(r"([^{}]+)\{([^}]*)\}", css))
    found = {
        selector.strip(): body
        for selectors, body in rules.items()
        for selector in selectors.split(",")
    }
    for label in ("billing-checkout-current", "billing-checkout-change"):
        body = found[f".option .{label}"]
        assert "white-space: nowrap" in body and "margin: 0" in body


def test_members_page_is_for_subscribers_only(seeded: str, client) -> None:
    anonymous = client.get("/members/")
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith("/accounts/login/?next=/members/")

    demo = get_user_model().objects.get(username="demo")
    client.force_login(demo)
    refused = client.get("/members/")
    assert refused.status_code == 302 and refused["Location"] == "/pricing/?next=%2Fmembers%2F"
    follow = client.get(refused["Location"])
    assert b'id="subscription-required"' in follow.content

    active_subscription(demo, Product.objects.get(name="Pro"))
    allowed = client.get("/members/")
    assert allowed.status_code == 200
    assert b'id="members-only"' in allowed.content and b"Pro" in allowed.content


def test_account_lists_the_users_subscriptions_and_payments(seeded: str, client) -> None:
    User = get_user_model()
    demo = User.objects.get(username="demo")
    other = User.objects.create_user("other", password="x")
    sub = active_subscription(demo, Product.objects.get(name="Starter"))
    active_subscription(other, Product.objects.get(name="Team"))
    Payment.objects.create(
        remote_id=uuid.uuid4(),
        status="completed",
        amount=Decimal("5000"),
        currency="XOF",
        customer=sub.customer,
        subscription=sub,
        product=sub.product,
        remote_created=timezone.now(),
    )
    Payment.objects.create(
        remote_id=uuid.uuid4(),
        status="failed",
        amount=Decimal("9"),
        currency="USD",
        customer=sub.customer,
        failure_reason="declined",
        remote_created=timezone.now(),
    )
    assert client.get("/account/").status_code == 302  # login first
    client.force_login(demo)
    html = client.get("/account/").content.decode()
    subscriptions = html.split('<table id="billing-subscriptions">')[1].split("</table>")[0]
    payments = html.split('<table id="billing-payments">')[1].split("</table>")[0]
    assert "Starter" in subscriptions and "Team" not in subscriptions
    assert "Monthly" in subscriptions and "Active" in subscriptions
    assert "XOF\xa05,000" in payments and "<td>Completed</td>" in payments
    assert "USD\xa09.00" in payments and "<td>Declined</td>" in payments


def test_signup_logs_in_and_goes_on(client) -> None:
    page = client.get("/accounts/signup/")
    assert page.status_code == 200 and b'name="password2"' in page.content
    answer = client.post(
        "/accounts/signup/",
        {
            "username": "newbie",
            "password1": "a-long-pass-1",
            "password2": "a-long-pass-1",
            "next": "/members/",
        },
    )
    assert answer.status_code == 302 and answer["Location"] == "/members/"
    user = get_user_model().objects.get(username="newbie")
    assert client.session["_auth_user_id"] == str(user.pk)

    client.logout()
    unsafe = client.post(
        "/accounts/signup/",
        {
            "username": "second",
            "password1": "a-long-pass-2",
            "password2": "a-long-pass-2",
            "next": "https://evil.example/",
        },
    )
    assert unsafe.status_code == 302 and unsafe["Location"] == "/pricing/"

    client.logout()
    mismatch = client.post(
        "/accounts/signup/", {"username": "third", "password1": "a", "password2": "b"}
    )
    assert mismatch.status_code == 200
    assert not get_user_model().objects.filter(username="third").exists()


def test_home_and_login_pages_render(client) -> None:
    home = client.get("/")
    assert home.status_code == 200
    for link in (
        'href="/pricing/"',
        'href="/members/"',
        'href="/account/"',
        'href="/accounts/login/"',
        'href="/accounts/signup/"',
    ):
        assert link.encode() in home.content
    login = client.get("/accounts/login/")
    assert login.status_code == 200 and b'name="username"' in login.content


def test_one_plan_offers_a_14_day_trial_on_the_pricing_page(on_sale: str, client) -> None:
    assert {p.name: p.trial_days for p in Product.objects.all()} == {
        "Starter": None,
        "Pro": 14,
        "Team": None,
    }
    user = get_user_model().objects.get(username="demo")
    client.force_login(user)
    html = client.get("/pricing/").content.decode()
    trials = re.findall(
        r'<form method="post" action="/billing/trial/"[^>]*>(.*?)</form>', html, re.S
    )
    assert len(trials) == 1 and "Start a 14-day trial" in trials[0]
    pro = Product.objects.get(name="Pro")
    assert f'name="product" value="{pro.pk}"' in trials[0]
    assert 'name="cycle" value="months-1"' in trials[0]
    # a subscriber holding a plan of the group is offered no trial
    active_subscription(user, Product.objects.get(name="Starter"))
    assert "/billing/trial/" not in client.get("/pricing/").content.decode()
