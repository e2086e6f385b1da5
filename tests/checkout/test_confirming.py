"""Paid, but not recorded yet: the customer paid on the hosted page and came back to the return
page, but the payment's events (or the subscription's pull) have not reached the app. A second
purchase that could double it (the same product, or another plan of its group) waits, refused
409 ``payment_confirming``, until the outcome is recorded or a bound passes. The return URL's
query string only makes the app more careful, never grants anything. Over real HTTP with the
sandbox, which is given no callback: it delivers no event unless the test hands it over."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from billing_integration.checkout.changes import change_plan
from billing_integration.checkout.services import (
    CONFIRMING_FOR,
    PaymentBeingConfirmed,
    start_checkout,
)
from billing_integration.checkout.trials import start_trial
from billing_integration.models import CheckoutSession, Customer, Product, Subscription
from billing_integration.sync.coalesce import once_per_window
from billing_integration.sync.pull import pull_subscriptions

from .conftest import make_product
from .test_one_purchase import API, RETURN, URL, button, post

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def plans(billing_sandbox, transactional_db) -> tuple[Product, Product]:
    return make_product("Starter"), make_product("Pro plan")


def sessions_sent(sandbox) -> int:
    return len(sandbox.requests(operation="create_checkout_session"))


def paid_checkouts(sandbox) -> int:
    return sum(1 for p in sandbox.objects("payment") if p["status"] == "completed")


def page_closed(session: CheckoutSession, ago: timedelta = timedelta(seconds=1)) -> None:
    """``session``'s hosted page closed ``ago``: it is no longer reused nor open."""
    CheckoutSession.objects.filter(pk=session.pk).update(expires_at=timezone.now() - ago)


def pay_and_come_back(sandbox, client, product, phone="0700000001", **choice) -> CheckoutSession:
    """Buy ``product`` on the hosted page (no event delivered), then open the return page; the
    return page's pull of subscriptions is taken as done a moment ago (coalesced)."""
    if not product.is_one_time:
        choice.setdefault("cycle", "months-1")
    response = client.post(URL, {"product": product.pk, "currency": "XOF", **choice})
    assert response.status_code == 302, response.content[:500]
    session = CheckoutSession.objects.order_by("-pk").first()
    sandbox.complete_checkout(str(session.remote_id), phone)
    assert once_per_window(f"billing:return-pull:{session.customer_id}", 3600)
    back = client.get(RETURN, {"session_id": str(session.remote_id)})
    assert back.status_code == 200 and 'data-outcome="pending"' in back.content.decode()
    return session


def refused(response, product_name: str) -> None:
    assert response.status_code == 409, response.content[:500]
    html = response.content.decode()
    assert 'data-error-code="payment_confirming"' in html
    assert f"Your payment for {product_name} is being confirmed" in html


def test_a_one_time_product_paid_waits_for_its_payment_event(billing_sandbox, logged_in, eager):
    """The case README listed: bought again until its payment event arrived."""
    ebook = make_product("Ebook", one_time=True)
    session = pay_and_come_back(billing_sandbox, logged_in, ebook)

    refused(logged_in.post(URL, {"product": ebook.pk, "currency": "XOF"}), "Ebook")
    page_closed(session)  # a new session would be made now, and could be paid
    refused(logged_in.post(URL, {"product": ebook.pk, "currency": "XOF"}), "Ebook")
    assert sessions_sent(billing_sandbox) == 1
    assert paid_checkouts(billing_sandbox) == 1

    for event in billing_sandbox.events("payment.completed"):
        assert billing_sandbox.deliver(logged_in, event).status_code == 200
    again = logged_in.post(URL, {"product": ebook.pk, "currency": "XOF"})
    assert again.status_code == 409 and 'data-error-code="already_bought"' in again.content.decode()
    assert sessions_sent(billing_sandbox) == 1


def test_another_plan_waits_until_a_pull_records_the_paid_plan(
    billing_sandbox, plans, logged_in, user
):
    starter, pro = plans
    session = pay_and_come_back(billing_sandbox, logged_in, starter)
    page_closed(session)

    refused(post(logged_in, pro), "Starter")
    refused(post(logged_in, starter, cycle="years-1"), "Starter")
    refused(post(logged_in, starter), "Starter")  # the same choice: its page is closed
    assert "Not available" in button(pro, user, cycle="months-1", currency="XOF")
    assert sessions_sent(billing_sandbox) == 1
    assert paid_checkouts(billing_sandbox) == 1
    assert len(billing_sandbox.objects("subscription")) == 1

    pull_subscriptions(Customer.objects.get())  # the beat's pull, or the return page's next
    assert Subscription.objects.filter(product=starter).exists()
    held = post(logged_in, pro)
    assert held.status_code == 409 and 'data-error-code="plan_held"' in held.content.decode()
    assert sessions_sent(billing_sandbox) == 1


def test_a_declined_payment_event_ends_the_wait(billing_sandbox, plans, logged_in, eager):
    starter, pro = plans
    session = pay_and_come_back(billing_sandbox, logged_in, starter, phone="0700000002")
    page_closed(session)
    refused(post(logged_in, pro), "Starter")

    for event in billing_sandbox.events("payment.failed"):
        assert billing_sandbox.deliver(logged_in, event).status_code == 200
    assert post(logged_in, pro).status_code == 302
    assert sessions_sent(billing_sandbox) == 2
    assert paid_checkouts(billing_sandbox) == 0


def test_the_wait_is_bounded(billing_sandbox, plans, logged_in):
    """No event ever comes (a page left unpaid, webhooks down): the customer is held until
    ``CONFIRMING_FOR`` after the page closed, never for good."""
    starter, pro = plans
    session = pay_and_come_back(billing_sandbox, logged_in, starter, phone="0700000002")
    page_closed(session, CONFIRMING_FOR - timedelta(minutes=1))
    refused(post(logged_in, pro), "Starter")

    page_closed(session, CONFIRMING_FOR + timedelta(seconds=1))
    assert post(logged_in, pro).status_code == 302
    assert sessions_sent(billing_sandbox) == 2


def test_a_crafted_return_url_holds_nobody_else(billing_sandbox, plans, logged_in, other_user):
    """The session id in the query string is only ever the visitor's own session."""
    starter, pro = plans
    bob = Client()
    bob.force_login(other_user)
    assert post(bob, starter).status_code == 302
    theirs = CheckoutSession.objects.get()

    response = logged_in.get(RETURN, {"session_id": str(theirs.remote_id), "status": "completed"})
    assert response.status_code == 200
    theirs.refresh_from_db()
    assert theirs.returned_at is None
    page_closed(theirs)
    assert post(bob, pro).status_code == 302
    assert not Subscription.objects.exists()


def test_every_path_waits(billing_sandbox, plans, logged_in, user):
    """The service call, the DRF endpoint and a free trial of another plan of the group."""
    starter, pro = plans
    session = pay_and_come_back(billing_sandbox, logged_in, starter)
    page_closed(session)
    billing_sandbox.clear_requests()

    with pytest.raises(PaymentBeingConfirmed) as info:
        start_checkout(user, pro, "months-1", "XOF")
    assert info.value.status == 409 and info.value.session == session
    response = logged_in.post(
        API,
        {"product": str(pro.pk), "cycle": "months-1", "currency": "XOF"},
        content_type="application/json",
    )
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "payment_confirming" and "Starter" in body["detail"]
    assert body["account_url"] == "/billing/account/"
    with pytest.raises(PaymentBeingConfirmed):
        start_trial(user, pro, "months-1", "XOF", days=7)
    assert billing_sandbox.requests(operation="create_checkout_session") == []
    assert billing_sandbox.requests(operation="create_subscription") == []
    assert not Subscription.objects.exists()


def test_a_change_of_plan_paid_and_back_is_not_asked_again(
    billing_sandbox, plans, logged_in, user, settings
):
    """The audit's ``_page_paid`` case: the change's page was paid and the customer came back,
    the mirror does not show it yet; the same change again makes no second page."""
    starter, pro = plans
    billing_sandbox.config(change_actions=["upgrade", "downgrade"])
    guesses = {"change_plan_action": "upgrade", "patch_auto_renew": True}
    settings.BILLING = {**settings.BILLING, "GUESSES": guesses}
    pay_and_come_back(billing_sandbox, logged_in, starter)
    pull_subscriptions(Customer.objects.get())  # Starter is held
    request = change_plan(user, pro, "months-1", "XOF")
    changed = request.checkout_session
    assert billing_sandbox.complete_checkout(str(changed.remote_id)).status_code == 200
    assert logged_in.get(RETURN, {"session_id": str(changed.remote_id)}).status_code == 200
    page_closed(changed)

    with pytest.raises(PaymentBeingConfirmed) as info:
        change_plan(user, pro, "months-1", "XOF")
    assert info.value.session == changed
    assert sessions_sent(billing_sandbox) == 2  # Starter's and the change's
    assert paid_checkouts(billing_sandbox) == 2


def test_a_product_sold_more_than_once_is_not_held(billing_sandbox, logged_in):
    ebook = make_product("Ebook", one_time=True)
    Product.objects.filter(pk=ebook.pk).update(multiple_purchases=True)
    session = pay_and_come_back(billing_sandbox, logged_in, ebook)
    page_closed(session)
    assert logged_in.post(URL, {"product": ebook.pk, "currency": "XOF"}).status_code == 302
    assert sessions_sent(billing_sandbox) == 2


@pytest.mark.parametrize(
    ("language", "message"),
    [
        (
            "en",
            "Your payment for Starter is being confirmed, so this purchase was not started: "
            "both could be charged. Your billing page shows it once it is confirmed; if it was "
            "not taken, you can buy again after 4:20 a.m.",
        ),
        (
            "fr",
            "Votre paiement pour Starter est en cours de confirmation, cet achat n'a donc pas "
            "été commencé : les deux pourraient être débités. Votre page de facturation "
            "l'affiche dès qu'il est confirmé ; s'il n'a pas été pris, vous pourrez acheter à "
            "nouveau après 04:20",
        ),
    ],
)
def test_the_message_gives_the_end_of_the_wait(language, message):
    from django.utils import translation

    closes = timezone.make_aware(timezone.datetime(2030, 1, 2, 3, 50))
    session = CheckoutSession(product=Product(name="Starter"), expires_at=closes)
    with translation.override(language):
        assert PaymentBeingConfirmed(session).message == message
