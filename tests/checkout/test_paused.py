"""A paused subscription whose ``auto_renew`` is on may be resumed by the service, and bill
again: one plan at a time refuses a plan (or the same product) beside it, as beside one that
may still renew, and tells the subscriber what to do (stop its renewal from the billing page).
Paused on the sandbox (its ``subscription.paused`` trigger), shown here by a pull."""

from __future__ import annotations

import pytest
from django.core import mail

from billing_integration.checkout.services import (
    PlanAlreadyHeld,
    StillRenewing,
    start_checkout,
)
from billing_integration.checkout.trials import start_trial
from billing_integration.models import ChangeRequest, Product, Subscription, SwitchedOffGuess

from .conftest import make_product
from .test_changes import guesses, pull, subscribe
from .test_one_purchase import button, post

pytestmark = pytest.mark.django_db(transaction=True)

ACCOUNT = "/billing/account/"
CHECKOUT_CALLS = "create_checkout_session"


@pytest.fixture
def plans(billing_sandbox, transactional_db) -> tuple[Product, Product]:
    return make_product("Basic"), make_product("Pro")


@pytest.fixture
def staff(settings):
    settings.MANAGERS = [("Staff", "staff@example.com")]
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


def pause(sandbox, user, subscription: Subscription) -> Subscription:
    """The service pauses ``subscription`` (its renewal left on); a pull shows it here."""
    sandbox.trigger("subscription.paused", str(subscription.remote_id))
    pull(user)
    subscription.refresh_from_db()
    assert subscription.status == "paused" and subscription.auto_renew
    assert not subscription.is_active
    return subscription


def test_another_plan_is_refused_beside_a_paused_plan_until_its_renewal_stops(
    billing_sandbox, plans, logged_in, user, settings, staff
):
    basic, pro = plans
    Product.objects.filter(pk=pro.pk).update(trial_days=14)
    billing_sandbox.config(patch_subscriptions=True)
    guesses(settings, patch_auto_renew=True)
    old = pause(billing_sandbox, user, subscribe(billing_sandbox, logged_in, user, basic))
    calls = len(billing_sandbox.requests(operation=CHECKOUT_CALLS))

    with pytest.raises(PlanAlreadyHeld) as info:
        start_checkout(user, pro, "months-1", "XOF")
    assert "Basic plan is paused" in info.value.message
    refused = post(logged_in, pro)
    html = refused.content.decode()
    assert refused.status_code == 409 and 'data-error-code="plan_held"' in html
    assert "may resume it" in html and "Stop the renewal of Basic" in html
    with pytest.raises(PlanAlreadyHeld):
        start_trial(user, pro, "months-1", "XOF")
    assert len(billing_sandbox.requests(operation=CHECKOUT_CALLS)) == calls
    assert not Subscription.objects.filter(product=pro).exists()
    assert "billing-checkout-form" not in button(pro, user, cycle="months-1", currency="XOF")

    # the billing page says it is paused and offers to stop its renewal
    page = logged_in.get(ACCOUNT).content.decode()
    assert (
        "billing-paused" in page
        and f"/billing/account/subscriptions/{old.pk}/stop-renewal/" in page
    )
    stop = logged_in.post(f"/billing/account/subscriptions/{old.pk}/stop-renewal/")
    assert stop.status_code == 302
    # a request to staff: no PATCH of a paused subscription (the sandbox refuses one, 400,
    # which would switch the guess off for every subscription)
    assert ChangeRequest.objects.get(subscription=old, kind="stop_renewal").via == "request"
    assert len(mail.outbox) == 1 and str(old.remote_id) in mail.outbox[0].body
    assert billing_sandbox.requests(operation="update_subscription") == []
    assert not SwitchedOffGuess.objects.exists()
    assert post(logged_in, pro).status_code == 409  # not stopped yet
    # staff stopped it on the service; the mirror shows it
    Subscription.objects.filter(pk=old.pk).update(auto_renew=False)

    assert post(logged_in, pro).status_code == 302  # nothing left that may bill beside it
    assert len(billing_sandbox.requests(operation=CHECKOUT_CALLS)) == calls + 1


def test_the_same_product_is_refused_while_it_is_paused_and_may_resume(
    billing_sandbox, plans, logged_in, user
):
    basic, _ = plans
    pause(billing_sandbox, user, subscribe(billing_sandbox, logged_in, user, basic))
    calls = len(billing_sandbox.requests(operation=CHECKOUT_CALLS))

    with pytest.raises(StillRenewing) as info:
        start_checkout(user, basic, "months-1", "XOF")
    assert "is paused" in info.value.message
    refused = post(logged_in, basic)
    assert refused.status_code == 409
    assert 'data-error-code="already_subscribed"' in refused.content.decode()
    assert len(billing_sandbox.requests(operation=CHECKOUT_CALLS)) == calls

    html = button(basic, user, cycle="months-1", currency="XOF")
    assert "billing-checkout-form" not in html
    assert 'class="billing-checkout-may-renew"' in html and "Paused: see your billing page" in html


def test_a_paused_plan_whose_renewal_is_off_is_no_plan_in_the_way(
    billing_sandbox, plans, logged_in, user
):
    basic, pro = plans
    old = pause(billing_sandbox, user, subscribe(billing_sandbox, logged_in, user, basic))
    Subscription.objects.filter(pk=old.pk).update(auto_renew=False)

    assert "billing-checkout-form" in button(basic, user, cycle="months-1", currency="XOF")
    assert post(logged_in, pro).status_code == 302
