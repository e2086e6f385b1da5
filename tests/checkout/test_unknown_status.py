"""A subscription the service moved to a status the app does not know (``past_due``,
``pending``, ...: no access here) with its renewal on may still be billed by the service (a
payment it retries). Like one that lapsed or is paused, nothing is sold beside it: not its
product again, not another plan of its group, on any path; its renewal can be stopped from
the billing page, after which both are sold. The status arrives as the service would send it:
an event of the subscription."""

from __future__ import annotations

import pytest
from django.core import mail

from billing_integration.checkout.services import (
    PlanAlreadyHeld,
    StillRenewing,
    checkout_url,
)
from billing_integration.checkout.trials import start_trial
from billing_integration.models import ChangeRequest, CheckoutSession, Product, Subscription
from billing_integration.testing import deliver_event

from .conftest import make_product
from .test_changes import subscribe
from .test_one_purchase import API, button, post

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


def moved_to(sandbox, client, subscription: Subscription, status: str, **fields) -> Subscription:
    """The service sends ``subscription`` in ``status`` (an event, processed in the request)."""
    doc = sandbox.object("subscription", str(subscription.remote_id))
    answer = deliver_event(client, "subscription.renewal", {**doc, "status": status, **fields})
    assert answer.status_code == 200
    subscription.refresh_from_db()
    assert subscription.status == status
    return subscription


def refused_everywhere(sandbox, client, user, product: Product, error: type, code: str) -> None:
    """Every way to buy ``product`` is refused with ``error`` / ``code``; nothing sent."""
    calls = len(sandbox.requests(operation=CHECKOUT_CALLS))
    sessions = CheckoutSession.objects.count()
    page = post(client, product)
    assert page.status_code == 409
    assert f'data-error-code="{code}"' in page.content.decode()
    api = client.post(API, {"product": product.pk, "cycle": "months-1", "currency": "XOF"})
    assert api.status_code == 409 and api.json()["code"] == code
    with pytest.raises(error):
        checkout_url(user, product, "months-1", "XOF")
    assert "billing-checkout-form" not in button(product, user, cycle="months-1", currency="XOF")
    assert len(sandbox.requests(operation=CHECKOUT_CALLS)) == calls
    assert CheckoutSession.objects.count() == sessions


@pytest.mark.parametrize("status", ["past_due", "pending", "unpaid"])
def test_nothing_is_sold_beside_a_subscription_in_an_unknown_status_that_may_renew(
    billing_sandbox, plans, logged_in, user, client, eager, status
):
    basic, pro = plans
    Product.objects.filter(pk__in=(basic.pk, pro.pk)).update(trial_days=14)
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    sub = moved_to(billing_sandbox, client, sub, status)
    assert not sub.is_active and sub.auto_renew

    refused_everywhere(billing_sandbox, logged_in, user, basic, StillRenewing, "already_subscribed")
    refused_everywhere(billing_sandbox, logged_in, user, pro, PlanAlreadyHeld, "plan_held")
    for product in (basic, pro):
        with pytest.raises((StillRenewing, PlanAlreadyHeld)):
            start_trial(user, product, "months-1", "XOF")
    assert Subscription.objects.count() == 1
    assert billing_sandbox.requests(operation="create_subscription") == []

    # the service stopped its renewal: nothing may bill beside a new one
    moved_to(billing_sandbox, client, sub, status, auto_renew=False)
    assert post(logged_in, pro).status_code == 302
    assert len(billing_sandbox.requests(operation=CHECKOUT_CALLS)) == 2


def test_its_renewal_can_be_stopped_from_the_billing_page(
    billing_sandbox, plans, logged_in, user, client, eager, staff
):
    basic, _ = plans
    sub = moved_to(
        billing_sandbox, client, subscribe(billing_sandbox, logged_in, user, basic), "past_due"
    )
    stop = f"/billing/account/subscriptions/{sub.pk}/stop-renewal/"
    page = logged_in.get(ACCOUNT).content.decode()
    assert 'class="billing-may-renew"' in page and f'action="{stop}"' in page

    assert logged_in.post(stop).status_code == 302
    request = ChangeRequest.objects.get()
    assert (request.subscription, request.kind) == (sub, "stop_renewal")
    assert len(mail.outbox) == 1 and str(sub.remote_id) in mail.outbox[0].body


def test_a_status_known_to_be_over_is_not_in_the_way(
    billing_sandbox, plans, logged_in, user, client, eager
):
    """``ended`` or ``expired`` (known inactive): it renews no more, whatever ``auto_renew``."""
    basic, pro = plans
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    moved_to(billing_sandbox, client, sub, "ended")
    assert post(logged_in, basic).status_code == 302
    assert post(logged_in, pro).status_code == 409  # the open session of Basic is in the way
