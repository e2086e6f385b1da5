"""One plan at a time: a subscriber holding a recurring plan is refused another plan of its
group on every path (view, ``start_checkout``, DRF), unless the product is an add-on or in
another group; the button says "Current plan" only on the exact option held, and is a "Change plan"
form on the others. Over real HTTP with the sandbox, its clock and its ledger."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing_integration.access import held_plan
from billing_integration.checkout.services import PlanAlreadyHeld, start_checkout
from billing_integration.models import CheckoutSession, OutboxEntry, Product, Subscription

from .conftest import make_product
from .test_one_purchase import API, RETURN, URL, button, hold, post

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def plans(billing_sandbox, transactional_db) -> tuple[Product, Product]:
    return make_product("Starter"), make_product("Pro plan")


def test_second_plan_is_refused_and_a_month_later_one_renewal_was_paid(
    billing_sandbox, plans, logged_in, user
):
    """Subscribe to Starter and pay; checking out Pro is refused with a page naming Starter;
    after a month on the sandbox clock the customer has paid one renewal, not two."""
    starter, pro = plans
    assert post(logged_in, starter).status_code == 302
    session = CheckoutSession.objects.get()
    assert billing_sandbox.complete_checkout(str(session.remote_id)).status_code == 200
    logged_in.get(RETURN, {"session_id": str(session.remote_id)})
    assert Subscription.objects.active().for_subscriber(user).count() == 1

    second = post(logged_in, pro)
    if second.status_code == 302:  # sold beside the first: pay it, as the new user did
        latest = CheckoutSession.objects.order_by("-pk").first()
        billing_sandbox.complete_checkout(str(latest.remote_id))
    assert second.status_code == 409
    html = second.content.decode()
    assert 'data-error-code="plan_held"' in html
    assert "You already have the Starter plan" in html and "change your plan" in html
    assert 'id="billing-account-link" href="/billing/account/"' in html
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 1

    summary = billing_sandbox.advance(days=32)
    assert summary["renewals"] == 1
    assert len(billing_sandbox.objects("subscription")) == 1
    # the first payment and one renewal, both for Starter
    paid = [p for p in billing_sandbox.objects("payment") if p["status"] == "completed"]
    assert len(paid) == 2
    assert {p["product"] for p in paid} == {str(starter.remote_id)}


def test_every_path_refuses_a_second_plan(billing_sandbox, plans, logged_in, user):
    starter, pro = plans
    hold(user, starter)
    billing_sandbox.clear_requests()

    with pytest.raises(PlanAlreadyHeld) as info:
        start_checkout(user, pro, "months-1", "XOF")
    assert info.value.status == 409 and info.value.code == "plan_held"
    assert info.value.held_name == "Starter"

    response = logged_in.post(
        API,
        {"product": str(pro.pk), "cycle": "years-1", "currency": "XOF"},
        content_type="application/json",
    )
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "plan_held" and body["held_plan"] == "Starter"
    assert body["account_url"] == "/billing/account/"
    assert "Starter" in body["detail"]

    assert post(logged_in, pro).status_code == 409
    assert billing_sandbox.requests() == []  # nothing asked of the service
    assert not CheckoutSession.objects.exists()


def test_add_ons_other_groups_one_time_products_and_ended_plans_are_sold(
    billing_sandbox, plans, logged_in, user
):
    starter, pro = plans
    support = make_product("Support add-on")
    Product.objects.filter(pk=support.pk).update(add_on=True)
    storage = make_product("Storage")
    Product.objects.filter(pk=storage.pk).update(plan_group="storage")
    ebook = make_product("Ebook", one_time=True)
    hold(user, starter)

    assert post(logged_in, support).status_code == 302
    assert post(logged_in, storage).status_code == 302
    assert logged_in.post(URL, {"product": ebook.pk, "currency": "XOF"}).status_code == 302
    assert post(logged_in, pro).status_code == 409
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 3

    # a plan no longer held (its paid period over) stands in the way while it may renew...
    Subscription.objects.filter(product=starter).update(
        cycle_end_date=timezone.now() - timedelta(days=1)
    )
    assert held_plan(user, pro) is None
    assert post(logged_in, pro).status_code == 409
    # ...and no longer once it does not renew
    Subscription.objects.filter(product=starter).update(auto_renew=False)
    assert post(logged_in, pro).status_code == 302


def test_a_held_add_on_is_no_plan(billing_sandbox, plans, user):
    starter, pro = plans
    Product.objects.filter(pk=starter.pk).update(add_on=True)
    hold(user, starter)
    assert held_plan(user, pro) is None
    assert held_plan(user, starter) is None


def test_marking_an_add_on_or_a_group_sends_nothing(billing_sandbox, plans):
    starter, _pro = plans
    starter.add_on = True
    starter.plan_group = "extras"
    starter.save(update_fields=["add_on", "plan_group", "updated_at"])
    assert not OutboxEntry.objects.open().exists()
    starter.refresh_from_db()
    assert starter.add_on and starter.plan_group == "extras"


def test_button_current_plan_only_on_the_option_held(billing_sandbox, plans, user, other_user):
    starter, pro = plans
    hold(user, starter, selected_billing_cycle="months-1", selected_currency="XOF")

    held = button(starter, user, cycle="months-1", currency="XOF")
    assert '<p class="billing-checkout-current">Current plan</p>' in held
    for product, cycle, currency in (
        (starter, "months-1", "USD"),
        (starter, "years-1", "XOF"),
        (pro, "months-1", "XOF"),
        (pro, "years-1", "XOF"),
    ):
        html = button(product, user, cycle=cycle, currency=currency)
        assert 'action="/billing/checkout/"' not in html and "Current plan" not in html
        change = '<form method="post" action="/billing/account/change-plan/" class="billing-chan'
        assert change in html and '<button type="submit">Change plan</button>' in html
        assert f'name="product" value="{product.pk}"' in html and f'value="{cycle}"' in html
    # the currency held as the service's id matches its code
    Subscription.objects.filter(product=starter).update(selected_currency="1")
    assert "Current plan" in button(starter, user, cycle="months-1", currency="XOF")
    # add-ons are still offered; other subscribers see the forms
    Product.objects.filter(pk=pro.pk).update(add_on=True)
    pro.refresh_from_db()
    assert "<form" in button(pro, user, cycle="months-1", currency="XOF")
    assert "<form" in button(starter, other_user, cycle="months-1", currency="XOF")


def team_of(request):
    """The subscriber resolver of the test below: the team account, whoever is logged in."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get(username="team-account")


def test_an_inactive_subscriber_is_refused_not_sold_a_second_plan(
    billing_sandbox, plans, logged_in, user, settings
):
    """An inactive subscriber holds no plan to the one-plan rule (``held_plan`` reads
    ``access``, which refuses it), so a second plan was sold beside the one it still pays for:
    a team deactivated (the resolver's subscriber) from the checkout view, a user from
    ``checkout_url(request.user, ...)``. Both are refused (403 ``no_subscriber``)."""
    from django.contrib.auth import get_user_model

    from billing_integration.billing import checkout_url, start_trial
    from billing_integration.checkout.services import NoSubscriber

    starter, pro = plans
    Product.objects.filter(pk=pro.pk).update(trial_days=7)
    team = get_user_model().objects.create_user("team-account", is_active=False)
    hold(team, starter)
    hold(user, starter)
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)
    user.refresh_from_db()
    billing_sandbox.clear_requests()

    for refused in (pro, starter):
        with pytest.raises(NoSubscriber):
            checkout_url(user, refused, "months-1", "XOF")
    with pytest.raises(NoSubscriber):
        start_trial(user, pro, "months-1", "XOF")

    settings.BILLING = {**settings.BILLING, "SUBSCRIBER_RESOLVER": f"{__name__}.team_of"}
    get_user_model().objects.filter(pk=user.pk).update(is_active=True)
    for refused in (pro, starter):
        page = post(logged_in, refused)
        assert page.status_code == 403 and 'data-error-code="no_subscriber"' in (
            page.content.decode()
        )
    assert billing_sandbox.requests() == []
    assert not CheckoutSession.objects.exists()
    assert Subscription.objects.count() == 2
