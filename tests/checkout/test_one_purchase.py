"""One purchase per product: a held product is refused (view, service, DRF), the button says
"Current plan", a setting allows repeat purchases; a double click reuses the open session."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.template import engines
from django.test import RequestFactory
from django.utils import timezone

from billing_integration.checkout.services import AlreadySubscribed, start_checkout
from billing_integration.customers import ensure_customer_pushed, get_or_create_customer
from billing_integration.models import CheckoutSession, Payment, Refund, Subscription
from billing_integration.outbox import from_remote

from .conftest import make_product

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/billing/checkout/"
API = "/billing/api/checkout-sessions/"
RETURN = "/billing/checkout/return/"


def post(client, product, cycle="months-1", currency="XOF"):
    return client.post(URL, {"product": product.pk, "cycle": cycle, "currency": currency})


def hold(user, product, **fields) -> Subscription:
    """An active subscription of ``user`` to ``product`` (its customer pushed to the sandbox)."""
    customer = ensure_customer_pushed(get_or_create_customer(user)[0])
    now = timezone.now()
    values = {
        "status": "published",
        "cycle_start_date": now - timedelta(days=1),
        "cycle_end_date": now + timedelta(days=29),
        "selected_billing_cycle": "months-1",
        "selected_currency": "XOF",
        **fields,
    }
    with from_remote():
        return Subscription.objects.create(
            remote_id=uuid.uuid4(), customer=customer, product=product, **values
        )


def button(product, user, **kwargs) -> str:
    request = RequestFactory().get("/pricing/")
    request.user = user
    args = " ".join(f'{k}="{v}"' for k, v in kwargs.items())
    return (
        engines["django"]
        .from_string(f"{{% load billing %}}{{% billing_checkout_button product {args} %}}")
        .render({"product": product}, request=request)
    )


# --- a held product is refused -------------------------------------------------------------
def test_held_product_gives_409_page_linking_to_the_account(
    billing_sandbox, product, logged_in, user
):
    hold(user, product)
    billing_sandbox.clear_requests()

    response = post(logged_in, product)

    assert response.status_code == 409
    html = response.content.decode()
    assert 'data-error-code="already_subscribed"' in html
    assert "already have an active subscription" in html
    assert 'id="billing-account-link" href="/billing/account/"' in html
    assert billing_sandbox.requests() == []  # nothing asked of the service, nothing created
    assert not CheckoutSession.objects.exists()
    assert Subscription.objects.count() == 1


def test_held_product_through_the_api_is_409_json(billing_sandbox, product, logged_in, user):
    hold(user, product)
    billing_sandbox.clear_requests()
    response = logged_in.post(
        API,
        {"product": str(product.pk), "cycle": "years-1", "currency": "XOF"},
        content_type="application/json",
    )
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "already_subscribed"
    assert "already have an active subscription" in body["detail"]
    assert body["account_url"] == "/billing/account/"
    assert billing_sandbox.requests() == []
    assert not CheckoutSession.objects.exists()


def test_service_refuses_any_cycle_or_currency_of_a_held_product(billing_sandbox, product, user):
    hold(user, product)
    billing_sandbox.clear_requests()
    for cycle, currency in (("months-1", "XOF"), ("months-1", "USD"), ("years-1", "XOF")):
        with pytest.raises(AlreadySubscribed) as info:
            start_checkout(user, product, cycle, currency)
        assert info.value.status == 409
    assert billing_sandbox.requests(operation="create_checkout_session") == []


def test_paying_twice_end_to_end_is_refused(billing_sandbox, product, logged_in, user):
    """Subscribe and pay on the hosted page; the return page pulls the new subscription; a
    second purchase of the same product is then refused: one subscription, one charge."""
    first = post(logged_in, product)
    assert first.status_code == 302
    session = CheckoutSession.objects.get()
    assert billing_sandbox.complete_checkout(str(session.remote_id)).status_code == 200
    logged_in.get(RETURN, {"session_id": str(session.remote_id)})
    assert Subscription.objects.active().for_subscriber(user).count() == 1

    again = post(logged_in, product, cycle="years-1")
    assert again.status_code == 409
    assert len(billing_sandbox.objects("subscription")) == 1
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 1


def test_other_products_and_ended_subscriptions_are_not_held(
    billing_sandbox, product, logged_in, user
):
    ebook = make_product("Ebook", one_time=True)
    hold(user, product, status="canceled")
    hold(user, ebook, cycle_end_date=timezone.now() - timedelta(days=1))
    assert post(logged_in, product).status_code == 302
    assert logged_in.post(URL, {"product": ebook.pk, "currency": "XOF"}).status_code == 302
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 2


def test_a_multiple_purchases_product_may_be_bought_again(
    billing_sandbox, product, logged_in, user
):
    product.multiple_purchases = True
    product.save(update_fields=["multiple_purchases"])
    hold(user, product)
    response = post(logged_in, product)
    assert response.status_code == 302
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 1
    assert "<form" in button(product, user, cycle="months-1", currency="XOF")


# --- the checkout button ---------------------------------------------------------------------
def test_button_says_current_plan_for_a_held_product(billing_sandbox, product, user, other_user):
    assert "<form" in button(product, user, cycle="months-1", currency="XOF")
    hold(user, product)
    html = button(product, user, cycle="months-1", currency="XOF")
    assert "<form" not in html and "<button" not in html
    assert '<p class="billing-checkout-current">Current plan</p>' in html
    assert "Your plan" in button(product, user, current_label="Your plan")
    assert "<form" in button(product, other_user, cycle="months-1", currency="XOF")


# --- a double click reuses the open session --------------------------------------------------
def test_second_click_is_sent_to_the_same_session(billing_sandbox, product, logged_in):
    first = post(logged_in, product)
    second = post(logged_in, product)
    assert first.status_code == second.status_code == 302
    session = CheckoutSession.objects.get()
    expected = f"{billing_sandbox.checkout_url}/checkout/{session.remote_id}"
    assert first["Location"] == second["Location"] == expected
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 1


def test_a_payment_for_another_product_leaves_the_open_session_to_the_second_click(
    billing_sandbox, product, logged_in
):
    """A payment of the customer for another product since the session started (an add-on's
    renewal, a purchase in another tab) made the second click create a second session for
    the same choice, the first one still payable in the first tab: both could be paid."""
    first = post(logged_in, product)
    session = CheckoutSession.objects.get()
    other = make_product("Extra storage")
    Payment.objects.create(
        remote_id=uuid.uuid4(),
        status="completed",
        customer=session.customer,
        customer_remote_id=session.customer.remote_id,
        product=other,
        product_remote_id=other.remote_id,
    )
    second = post(logged_in, product)
    assert second.status_code == 302 and second["Location"] == first["Location"]
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 1
    assert CheckoutSession.objects.count() == 1


def test_api_second_request_returns_the_same_session_with_200(billing_sandbox, product, logged_in):
    body = {"product": str(product.pk), "cycle": "months-1", "currency": "XOF"}
    first = logged_in.post(API, body, content_type="application/json")
    second = logged_in.post(API, body, content_type="application/json")
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json() == second.json()
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 1


@pytest.mark.parametrize(
    "change",
    [
        "expired",
        "not_open",
        "completed",
        "completed_payment",
        "other_user",
    ],
)
def test_a_session_is_reused_only_while_open_and_untouched(
    billing_sandbox, product, logged_in, client, other_user, change
):
    first = post(logged_in, product)
    session = CheckoutSession.objects.get()
    now = timezone.now()
    who = logged_in
    # another cycle or currency is refused while this one is open: test_open_checkout.py
    if change == "expired":
        CheckoutSession.objects.filter(pk=session.pk).update(expires_at=now - timedelta(seconds=1))
    elif change == "not_open":
        CheckoutSession.objects.filter(pk=session.pk).update(status="expired")
    elif change == "completed":
        CheckoutSession.objects.filter(pk=session.pk).update(completed_at=now)
    elif change == "completed_payment":
        Payment.objects.create(
            remote_id=uuid.uuid4(),
            status="completed",
            customer=session.customer,
            customer_remote_id=session.customer.remote_id,
        )
    elif change == "other_user":
        client.force_login(other_user)
        who = client
    second = post(who, product)
    assert second.status_code == 302
    assert second["Location"] != first["Location"]
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 2
    assert CheckoutSession.objects.count() == 2


@pytest.mark.parametrize("change", ["seconds_left", "declined_payment"])
def test_a_session_still_payable_is_reused(billing_sandbox, product, logged_in, change):
    """The service sells a session until it expires: one with seconds left, or whose payment
    was declined (the hosted page may take another number), could be paid beside a second
    one, so the same choice is sent back to it."""
    first = post(logged_in, product)
    session = CheckoutSession.objects.get()
    if change == "seconds_left":
        expires = timezone.now() + timedelta(seconds=5)
        CheckoutSession.objects.filter(pk=session.pk).update(expires_at=expires)
    else:
        declined = billing_sandbox.complete_checkout(str(session.remote_id), phone="0700000002")
        assert declined.status_code == 402
        Payment.objects.create(
            remote_id=uuid.uuid4(),
            status="failed",
            customer=session.customer,
            customer_remote_id=session.customer.remote_id,
            product_remote_id=product.remote_id,
        )
    second = post(logged_in, product)
    assert second.status_code == 302 and second["Location"] == first["Location"]
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 1
    assert CheckoutSession.objects.count() == 1
    if change == "declined_payment":  # the same hosted page takes another number, once
        assert billing_sandbox.complete_checkout(str(session.remote_id)).status_code == 200
        mine = [
            s
            for s in billing_sandbox.objects("subscription")
            if s["product"] == str(product.remote_id)
        ]
        assert len(mine) == 1


def test_short_expiry_still_reuses_within_half_of_it(billing_sandbox, product, logged_in, settings):
    settings.BILLING = {**settings.BILLING, "CHECKOUT_EXPIRY": 60}
    assert post(logged_in, product)["Location"] == post(logged_in, product)["Location"]
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 1


def buy_once(billing_sandbox, client, product) -> CheckoutSession:
    """Buy ``product`` on the hosted page; the service's payment events reach the app."""
    response = client.post(URL, {"product": product.pk, "currency": "XOF"})
    assert response.status_code == 302, response.content[:500]
    session = CheckoutSession.objects.order_by("-pk").first()
    assert billing_sandbox.complete_checkout(str(session.remote_id)).status_code == 200
    for event in billing_sandbox.events("payment.completed"):
        assert billing_sandbox.deliver(client, event).status_code == 200
    return session


def test_a_one_time_product_paid_once_is_not_sold_again(billing_sandbox, logged_in, user, eager):
    """A one-time product without ``multiple_purchases`` is bought once: its completed payment
    holds it (no subscription ever does), and a second purchase would be a second charge."""
    ebook = make_product("Ebook", one_time=True)
    buy_once(billing_sandbox, logged_in, ebook)
    assert Payment.objects.filter(status="completed", product=ebook).count() == 1
    again = logged_in.post(URL, {"product": ebook.pk, "currency": "XOF"})
    assert again.status_code == 409, again.content[:500]
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 1
    api = logged_in.post(API, {"product": str(ebook.pk)}, content_type="application/json")
    assert api.status_code == 409 and api.json()["code"] == "already_bought"
    with pytest.raises(AlreadySubscribed):
        start_checkout(user, ebook, currency="XOF")
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 1


def test_a_one_time_product_refunded_or_sold_many_times_may_be_bought_again(
    billing_sandbox, logged_in, user, eager
):
    ebook = make_product("Ebook", one_time=True)
    pack = make_product("Credit pack", one_time=True)
    pack.multiple_purchases = True
    pack.save(update_fields=["multiple_purchases"])
    buy_once(billing_sandbox, logged_in, pack)
    buy_once(billing_sandbox, logged_in, pack)
    session = buy_once(billing_sandbox, logged_in, ebook)
    paid = Payment.objects.get(status="completed", product=ebook)
    Refund.objects.create(
        remote_id=uuid.uuid4(), status="approved", payment=paid, customer=session.customer
    )
    assert logged_in.post(URL, {"product": ebook.pk, "currency": "XOF"}).status_code == 302
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 4


def test_the_button_says_bought_for_a_one_time_product_paid_once(
    billing_sandbox, logged_in, user, other_user, eager
):
    """The checkout button of a one-time product bought once says so, as "Current plan" for a
    held plan: a click would be refused 409 ``already_bought``. Not for another subscriber,
    nor once refunded, nor for a product sold many times."""
    from django.utils import translation

    ebook = make_product("Ebook", one_time=True)
    assert "<form" in button(ebook, user, currency="XOF")
    session = buy_once(billing_sandbox, logged_in, ebook)

    html = button(ebook, user, currency="XOF")
    assert "<form" not in html and "<button" not in html
    assert '<p class="billing-checkout-bought">Already bought</p>' in html
    assert "Yours" in button(ebook, user, currency="XOF", bought_label="Yours")
    with translation.override("fr"):
        assert "Déjà acheté" in button(ebook, user, currency="XOF")
    assert "<form" in button(ebook, other_user, currency="XOF")
    clicked = logged_in.post(URL, {"product": ebook.pk, "currency": "XOF"})
    assert clicked.status_code == 409

    ebook.multiple_purchases = True
    ebook.save(update_fields=["multiple_purchases"])
    assert "<form" in button(ebook, user, currency="XOF")
    ebook.multiple_purchases = False
    ebook.save(update_fields=["multiple_purchases"])
    paid = Payment.objects.get(status="completed", product=ebook)
    Refund.objects.create(
        remote_id=uuid.uuid4(), status="approved", payment=paid, customer=session.customer
    )
    assert "<form" in button(ebook, user, currency="XOF")
    assert logged_in.post(URL, {"product": ebook.pk, "currency": "XOF"}).status_code == 302


def test_bought_buttons_read_the_payments_once_per_page(
    billing_sandbox, user, django_assert_max_num_queries
):
    """A page of one-time products, each bought (its payment named by product or by remote
    id only): the payments are read once per page, not once per button."""
    from django.db.models import Prefetch

    from billing_integration.models import Price, Product

    customer = ensure_customer_pushed(get_or_create_customer(user)[0])
    products = [make_product(f"Ebook {i}", one_time=True) for i in range(5)]
    for i, item in enumerate(products):
        link = {"product": item} if i % 2 else {"product_remote_id": item.remote_id}
        Payment.objects.create(
            remote_id=uuid.uuid4(), status="completed", customer=customer, **link
        )
    page = engines["django"].from_string(
        "{% load billing %}{% for p in products %}"
        "{% billing_checkout_button p currency='XOF' %}{% endfor %}"
    )
    request = RequestFactory().get("/pricing/")
    request.user = user

    def render(count: int) -> str:
        rows = Product.objects.filter(pk__in=[p.pk for p in products[:count]])
        rows = rows.prefetch_related(Prefetch("root_prices", queryset=Price.objects.all()))
        return page.render({"products": rows}, request=request)

    with django_assert_max_num_queries(1000) as captured:
        assert render(1).count("billing-checkout-bought") == 1
    with django_assert_max_num_queries(len(captured)):
        assert render(5).count("billing-checkout-bought") == 5
