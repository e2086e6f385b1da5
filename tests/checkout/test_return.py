"""The return view after the hosted page: pulls, then shows active / pending / failed."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from billing_integration.models import CheckoutSession, Payment, Subscription

pytestmark = pytest.mark.django_db(transaction=True)

RETURN = "/billing/checkout/return/"


def outcome(response) -> str:
    match = re.search(r'data-outcome="(\w+)"', response.content.decode())
    assert match, response.content.decode()[:500]
    return match.group(1)


def start(client, product, cycle="months-1") -> CheckoutSession:
    response = client.post(
        "/billing/checkout/", {"product": product.pk, "cycle": cycle, "currency": "XOF"}
    )
    assert response.status_code == 302
    return CheckoutSession.objects.order_by("-pk").first()


@pytest.fixture
def hooked(billing_sandbox, live_server, eager):
    """The sandbox delivering its events to this test's live server, processed inline."""
    billing_sandbox.set_callback(live_server.url + "/billing/webhooks/")
    return billing_sandbox


def test_success_shows_active_and_the_subscription_exists_locally(
    billing_sandbox, product, logged_in, user
):
    session = start(logged_in, product)
    page = billing_sandbox.complete_checkout(str(session.remote_id), "0700000001")
    assert page.status_code == 200 and 'data-outcome="success"' in page.text
    assert not Subscription.objects.exists()  # no event delivered: the return view pulls

    response = logged_in.get(RETURN, {"session_id": str(session.remote_id)})
    assert response.status_code == 200
    assert outcome(response) == "active"
    sub = Subscription.objects.get()
    assert sub.customer.subscriber == user and sub.product == product
    assert sub.selected_billing_cycle == "months-1"
    assert Subscription.objects.active().for_subscriber(user).exists()
    assert product.name in response.content.decode()
    assert billing_sandbox.requests(operation="list_subscriptions")


def test_declined_shows_failed(hooked, product, logged_in):
    session = start(logged_in, product)
    page = hooked.complete_checkout(str(session.remote_id), "0700000002")
    assert page.status_code == 402
    assert hooked.wait_for_deliveries(timeout=20)
    assert Payment.objects.filter(status="failed").exists()

    response = logged_in.get(RETURN, {"session_id": str(session.remote_id)})
    assert outcome(response) == "failed"
    assert "declined" in response.content.decode()
    assert not Subscription.objects.exists()


def test_insufficient_funds_shows_failed(hooked, product, logged_in):
    session = start(logged_in, product)
    hooked.complete_checkout(str(session.remote_id), "0700000003")
    assert hooked.wait_for_deliveries(timeout=20)
    response = logged_in.get(RETURN)
    assert outcome(response) == "failed"
    assert "insufficient funds" in response.content.decode()


def test_not_confirmed_shows_pending(billing_sandbox, product, logged_in):
    session = start(logged_in, product)
    page = billing_sandbox.complete_checkout(str(session.remote_id), "0700000004")
    assert page.status_code == 202
    response = logged_in.get(RETURN, {"session_id": str(session.remote_id)})
    assert outcome(response) == "pending"
    assert not Subscription.objects.exists()


def test_failed_payment_before_this_session_does_not_count(hooked, product, logged_in):
    first = start(logged_in, product)
    hooked.complete_checkout(str(first.remote_id), "0700000002")
    assert hooked.wait_for_deliveries(timeout=20)
    # expired here (while it could still be paid, the same choice is sent back to it)
    CheckoutSession.objects.filter(pk=first.pk).update(expires_at=timezone.now())
    second = start(logged_in, product)
    assert second.pk != first.pk
    assert outcome(logged_in.get(RETURN, {"session_id": str(second.remote_id)})) == "pending"
    hooked.complete_checkout(str(second.remote_id), "0700000001")
    assert hooked.wait_for_deliveries(timeout=20)
    assert outcome(logged_in.get(RETURN, {"session_id": str(second.remote_id)})) == "active"


def test_another_users_session_is_not_shown(billing_sandbox, product, client, user, other_user):
    client.force_login(other_user)
    theirs = start(client, product)
    billing_sandbox.complete_checkout(str(theirs.remote_id), "0700000001")
    client.force_login(user)
    response = client.get(RETURN, {"session_id": str(theirs.remote_id)})
    assert response.status_code == 200
    assert outcome(response) == "none"


def test_no_checkout_yet(logged_in):
    response = logged_in.get(RETURN)
    assert response.status_code == 200 and outcome(response) == "none"


def test_service_down_on_return_still_answers(billing_sandbox, product, logged_in):
    session = start(logged_in, product)
    billing_sandbox.faults(outage_seconds=30)
    response = logged_in.get(RETURN, {"session_id": str(session.remote_id)})
    assert response.status_code == 200
    assert outcome(response) == "pending"
    assert "could not reach the payment service" in response.content.decode()


def test_anonymous_return_goes_to_login(client):
    response = client.get(RETURN)
    assert response.status_code == 302 and "login" in response["Location"]


def test_expired_session_shows_failed(billing_sandbox, product, logged_in):
    from datetime import timedelta

    from django.utils import timezone

    session = start(logged_in, product)
    assert outcome(logged_in.get(RETURN, {"session_id": str(session.remote_id)})) == "pending"
    CheckoutSession.objects.filter(pk=session.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    response = logged_in.get(RETURN, {"session_id": str(session.remote_id)})
    assert outcome(response) == "failed"
    assert "expired" in response.content.decode()


def test_converting_a_trial_shows_the_payment_not_the_trial(hooked, product, logged_in):
    from billing_integration.models import Product

    Product.objects.filter(pk=product.pk).update(trial_days=14)
    trial = logged_in.post(
        "/billing/trial/", {"product": product.pk, "cycle": "months-1", "currency": "XOF"}
    )
    assert trial.status_code == 302 and Subscription.objects.get().trial_ends_at is not None
    session = start(logged_in, product)  # converts the trial
    # not paid yet: the trial grants access, but it is not what this checkout bought
    response = logged_in.get(RETURN, {"session_id": str(session.remote_id)})
    assert outcome(response) == "pending"
    hooked.complete_checkout(str(session.remote_id), "0700000002")  # declined
    assert hooked.wait_for_deliveries(timeout=20)
    response = logged_in.get(RETURN, {"session_id": str(session.remote_id)})
    assert outcome(response) == "failed"
    assert "declined" in response.content.decode()


def test_buying_again_in_the_grace_period_shows_the_new_payment(product, user):
    from datetime import timedelta

    from django.utils import timezone

    from billing_integration.checkout.views import checkout_outcome
    from billing_integration.models import Customer
    from billing_integration.outbox import from_remote

    now = timezone.now()
    with from_remote():
        customer = Customer.objects.create(subscriber=user, identifier="alice")
        Subscription.objects.create(
            customer=customer,
            product=product,
            status="canceled",
            cycle_start_date=now - timedelta(days=20),
            cycle_end_date=now + timedelta(days=10),
        )
        session = CheckoutSession.objects.create(
            customer=customer, product=product, status="open", expires_at=now + timedelta(minutes=5)
        )
    assert Subscription.objects.active().exists()  # the grace period
    assert checkout_outcome(customer, session)["outcome"] == "pending"


def test_converting_a_trial_and_paying_shows_active(hooked, product, logged_in):
    from billing_integration.models import Product

    Product.objects.filter(pk=product.pk).update(trial_days=14)
    trial = logged_in.post(
        "/billing/trial/", {"product": product.pk, "cycle": "months-1", "currency": "XOF"}
    )
    assert trial.status_code == 302
    session = start(logged_in, product)  # converts the trial
    page = hooked.complete_checkout(str(session.remote_id), "0700000001")
    assert page.status_code == 200
    assert hooked.wait_for_deliveries(timeout=20)
    response = logged_in.get(RETURN, {"session_id": str(session.remote_id)})
    assert outcome(response) == "active"
    assert Subscription.objects.filter(product=product, trial_end_date__isnull=True).exists()


def test_an_unlinked_customer_never_sees_another_customers_failed_payment(product, user):
    """A customer without a remote id (e.g. after ``billing_service reset``) matches no payment
    by remote id: ``customer_remote_id=None`` would be every payment without one."""
    import uuid
    from datetime import timedelta

    from django.utils import timezone

    from billing_integration.checkout.views import checkout_outcome
    from billing_integration.models import Customer
    from billing_integration.outbox import from_remote

    now = timezone.now()
    with from_remote():
        customer = Customer.objects.create(subscriber=user, identifier="alice")
        session = CheckoutSession.objects.create(
            customer=customer, product=product, status="open", expires_at=now + timedelta(hours=1)
        )
        Payment.objects.create(remote_id=uuid.uuid4(), status="failed")  # someone else's
    assert customer.remote_id is None
    assert checkout_outcome(customer, session)["outcome"] == "pending"
