"""Access through the paid period after a cancel, over real HTTP with the sandbox: a paid
subscription, then ``subscription.canceled`` delivered by the sandbox; under
``ACCESS_AFTER_CANCEL = "period_end"`` access lasts until ``cycle_end_date`` (the billing page
says so), under ``"immediately"`` it ends at once. ``paused`` grants nothing either way."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.template import engines
from django.utils import timezone

from billing_integration.access import on_grace_period, on_trial, subscribed
from billing_integration.access.features import has_feature
from billing_integration.models import CheckoutSession, ProductFeature, Subscription
from billing_integration.reporting import metrics

pytestmark = pytest.mark.django_db(transaction=True)

CHECKOUT = "/billing/checkout/"
RETURN = "/billing/checkout/return/"
ACCOUNT = "/billing/account/"


@pytest.fixture
def hooked(billing_sandbox, live_server, eager):
    billing_sandbox.set_callback(live_server.url + "/billing/webhooks/")
    return billing_sandbox


def subscribe(sandbox, client, product) -> Subscription:
    response = client.post(CHECKOUT, {"product": product.pk, "cycle": "months-1"})
    assert response.status_code == 302
    session = CheckoutSession.objects.get()
    assert sandbox.complete_checkout(str(session.remote_id)).status_code == 200
    client.get(RETURN, {"session_id": str(session.remote_id)})
    assert sandbox.wait_for_deliveries(timeout=20)
    return Subscription.objects.get()


def paths(client, user, product) -> dict[str, bool]:
    """Every access path a host uses, for ``user``."""
    render = engines["django"].from_string(
        "{% load billing %}{% if user|subscribed_to:product %}1{% endif %}"
    )
    return {
        "subscribed": subscribed(user, product),
        "decorator": client.get("/members/").status_code == 200,
        "API ?active=1": len(client.get("/billing/api/subscriptions/?active=1").json()) == 1,
        "template filter": render.render({"user": user, "product": product}) == "1",
        "feature": has_feature(user, "exports"),
        "reporting": sum(r["active"] for r in metrics.current_subscriptions(metrics.Period())) == 1,
    }


@pytest.mark.parametrize("after_cancel", ["period_end", "immediately"])
def test_a_canceled_subscription_keeps_access_until_its_cycle_end_only_at_period_end(
    hooked, product, logged_in, user, settings, after_cancel
):
    settings.BILLING = {**settings.BILLING, "ACCESS_AFTER_CANCEL": after_cancel}
    ProductFeature.objects.create(product=product, key="exports")
    sub = subscribe(hooked, logged_in, product)
    assert sub.is_active and sub.cycle_end_date > timezone.now() + timedelta(days=27)
    answers = paths(logged_in, user, product)
    assert answers == dict.fromkeys(answers, True)

    hooked.trigger("subscription.canceled", str(sub.remote_id))
    assert hooked.wait_for_deliveries(timeout=20)
    sub.refresh_from_db()
    assert sub.status == "canceled" and sub.cycle_end_date > timezone.now()

    grace = after_cancel == "period_end"
    answers = paths(logged_in, user, product)
    assert answers == dict.fromkeys(answers, grace), answers
    assert on_grace_period(user) is grace and on_grace_period(user, product) is grace
    assert not on_trial(user)
    html = logged_in.get(ACCOUNT).content.decode()
    assert ("Canceled — access until" in html) is grace
    # the grace period ends with the paid period
    after = sub.cycle_end_date + timedelta(seconds=1)
    assert not Subscription.objects.active(after).exists()
    assert Subscription.objects.active(sub.cycle_end_date - timedelta(seconds=1)).exists() is grace
    # a canceled subscription may be bought again (it does not renew)
    again = logged_in.post(CHECKOUT, {"product": product.pk, "cycle": "months-1"})
    assert again.status_code == 302


def test_a_paused_subscription_grants_nothing_under_either_setting(
    hooked, product, logged_in, user, settings
):
    sub = subscribe(hooked, logged_in, product)
    hooked.trigger("subscription.paused", str(sub.remote_id))
    assert hooked.wait_for_deliveries(timeout=20)
    sub.refresh_from_db()
    assert sub.status == "paused" and sub.cycle_end_date > timezone.now()
    for value in ("period_end", "immediately"):
        settings.BILLING = {**settings.BILLING, "ACCESS_AFTER_CANCEL": value}
        assert not subscribed(user) and not on_grace_period(user)
        assert logged_in.get("/members/").status_code == 302


def test_a_bad_value_is_refused_by_the_checks_and_at_run_time(settings, user):
    from billing_integration.checks import check_billing_settings
    from billing_integration.exceptions import BillingConfigurationError

    settings.BILLING = {**settings.BILLING, "ACCESS_AFTER_CANCEL": "never"}
    assert "billing_integration.E050" in {e.id for e in check_billing_settings()}
    with pytest.raises(BillingConfigurationError, match="ACCESS_AFTER_CANCEL"):
        Subscription.objects.active().exists()
    for bad in ({"repeat": "yes"}, {"notice_days": 0}, {"days": 3}, [], None):
        settings.BILLING = {**settings.BILLING, "ACCESS_AFTER_CANCEL": "period_end", "TRIALS": bad}
        assert "billing_integration.E051" in {e.id for e in check_billing_settings()}, bad
    settings.BILLING = {**settings.BILLING, "TRIALS": {"notice_days": 7}}
    assert not {"billing_integration.E050", "billing_integration.E051"} & {
        e.id for e in check_billing_settings()
    }


@pytest.mark.parametrize("bad", [{"repeat": "False"}, {"notice_days": "3"}, ["repeat"], None])
def test_bad_trials_are_refused_at_run_time_too(settings, bad):
    # Where the checks do not run (gunicorn): {"repeat": "False"} (read from the environment
    # without cast=bool) was truthy and allowed a second trial of a product.
    from billing_integration.checkout.trials import trial_settings
    from billing_integration.exceptions import BillingConfigurationError

    settings.BILLING = {**settings.BILLING, "TRIALS": bad}
    with pytest.raises(BillingConfigurationError, match=r"BILLING\['TRIALS'\] must be a dict"):
        trial_settings()
    settings.BILLING = {**settings.BILLING, "TRIALS": {"notice_days": 7}}
    assert trial_settings() == {"repeat": False, "notice_days": 7}
