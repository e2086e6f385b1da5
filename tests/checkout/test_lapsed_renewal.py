"""A subscription whose paid period ended here while it may still renew on the service (status
granting access, ``auto_renew`` on: a failed payment the service may retry). Buying its own
product again beside it would make two subscriptions both billed once the retry succeeds; its
renewal can be stopped from the billing page. Over real HTTP with the sandbox."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core import mail
from django.utils import timezone

from billing_integration.models import ChangeRequest, CheckoutSession, Payment, Subscription

from .test_one_purchase import button, hold, post

pytestmark = pytest.mark.django_db(transaction=True)

ACCOUNT = "/billing/account/"


def lapsed(user, product, **fields) -> Subscription:
    """``user``'s subscription to ``product`` whose period ended yesterday and whose renewal
    payment failed; still ``published`` with ``auto_renew`` on (the service may retry)."""
    ended = timezone.now() - timedelta(days=1)
    sub = hold(
        user,
        product,
        cycle_start_date=ended - timedelta(days=30),
        cycle_end_date=ended,
        next_billing_date=ended,
        last_payment_status="failed",
        **fields,
    )
    Payment.objects.create(
        remote_id=uuid.uuid4(),
        status="failed",
        amount=Decimal("10000"),
        currency="XOF",
        customer=sub.customer,
        product=product,
        subscription=sub,
        failure_reason="declined",
        remote_created=timezone.now(),
    )
    return sub


def test_checkout_of_the_product_that_may_still_renew_is_refused(
    billing_sandbox, product, logged_in, user
):
    """No second subscription of the product beside the one that may renew: the checkout is
    refused (409, nothing sent to the service) and neither the billing page ("Pay again") nor
    the pricing page offers it; once it no longer renews, both offer it and the click is taken."""
    sub = lapsed(user, product)
    billing_sandbox.clear_requests()

    refused = post(logged_in, product)
    assert refused.status_code == 409
    assert 'data-error-code="already_subscribed"' in refused.content.decode()
    assert not CheckoutSession.objects.exists()
    assert billing_sandbox.requests(operation="create_checkout_session") == []
    assert Subscription.objects.filter(product=product).count() == 1
    assert "billing-pay-again" not in logged_in.get(ACCOUNT).content.decode()
    assert "billing-checkout-form" not in button(product, user, cycle="months-1", currency="XOF")

    Subscription.objects.filter(pk=sub.pk).update(auto_renew=False)  # the service gave up
    assert "billing-pay-again" in logged_in.get(ACCOUNT).content.decode()
    assert "billing-checkout-form" in button(product, user, cycle="months-1", currency="XOF")
    assert post(logged_in, product).status_code == 302
    assert CheckoutSession.objects.count() == 1
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 1


def test_the_renewal_of_a_lapsed_subscription_can_be_stopped(
    billing_sandbox, product, logged_in, user, other_user
):
    """The billing page offers "Cancel" on a lapsed subscription that may still renew, and the
    stop of renewal is taken (a request to staff); a canceled one and another subscriber's are
    refused."""
    sub = lapsed(user, product)
    stop = f"/billing/account/subscriptions/{sub.pk}/stop-renewal/"
    assert f'action="{stop}"' in logged_in.get(ACCOUNT).content.decode()

    answer = logged_in.post(stop)
    assert answer.status_code == 302 and answer["Location"] == ACCOUNT
    request = ChangeRequest.objects.get()
    assert request.subscription == sub and request.kind == "stop_renewal"
    assert len(mail.outbox) == 1 and str(sub.remote_id) in mail.outbox[0].body
    assert "Stop of renewal requested" in logged_in.get(ACCOUNT).content.decode()

    canceled = lapsed(user, product, status="canceled")
    assert (
        logged_in.post(f"/billing/account/subscriptions/{canceled.pk}/stop-renewal/").status_code
        == 409
    )
    theirs = lapsed(other_user, product)
    assert (
        logged_in.post(f"/billing/account/subscriptions/{theirs.pk}/stop-renewal/").status_code
        == 404
    )
    assert ChangeRequest.objects.count() == 1


def test_the_pricing_button_of_a_plan_that_may_still_renew_points_to_the_billing_page(
    billing_sandbox, product, logged_in, user
):
    """While the lapsed subscription may still renew, its product's button on the pricing page
    (where the billing page's "Choose a plan" leads) is no dead end: it links to the billing
    page, where the renewal can be stopped. Once stopped, the pricing page sells it again."""
    sub = lapsed(user, product)
    page = logged_in.get(ACCOUNT).content.decode()
    assert 'class="billing-may-renew"' in page and "billing-choose-plan" in page
    offered = button(product, user, cycle="months-1", currency="XOF")
    assert "billing-checkout-form" not in offered and "Not available" not in offered
    assert 'class="billing-checkout-may-renew"' in offered and f'href="{ACCOUNT}"' in offered

    Subscription.objects.filter(pk=sub.pk).update(auto_renew=False)  # the service gave up
    offered = button(product, user, cycle="months-1", currency="XOF")
    assert "billing-checkout-form" in offered and "billing-checkout-may-renew" not in offered
