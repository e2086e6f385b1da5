"""A public call given an object that is not of ``BILLING['SUBSCRIBER_MODEL']`` (a team where
the subscriber is the user, a user where it is a team) is refused with a ``TypeError`` naming
the model expected and ``get_subscriber(request)``, before any row is written or any call is
sent (Django's own refusal, a ``ValueError`` from the query, said neither)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from billing_integration import billing
from billing_integration.models import CheckoutSession, Customer, OutboxEntry, Subscription

pytestmark = pytest.mark.django_db(transaction=True)

CALLS = {
    "checkout_url": lambda who, p: billing.checkout_url(who, p, "months-1", "XOF"),
    "checkout_redirect": lambda who, p: billing.checkout_redirect(who, p, "months-1", "XOF"),
    "start_checkout": lambda who, p: billing.start_checkout(who, p, "months-1", "XOF"),
    "start_trial": lambda who, p: billing.start_trial(who, p, "months-1", "XOF", days=7),
    "subscribed": lambda who, p: billing.subscribed(who, p),
    "active_subscriptions": lambda who, p: billing.active_subscriptions(who),
    "on_trial": lambda who, p: billing.on_trial(who),
    "on_grace_period": lambda who, p: billing.on_grace_period(who, p),
    "has_feature": lambda who, p: billing.has_feature(who, "sso"),
    "feature_limit": lambda who, p: billing.feature_limit(who, "seats"),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_an_object_of_another_model_is_refused_naming_the_subscriber_model(
    billing_sandbox, product, call
):
    team = Group.objects.create(name="Acme")  # saved, with a pk, but not a user
    sent = len(billing_sandbox.requests())
    entries = OutboxEntry.objects.count()
    with pytest.raises(TypeError) as info:
        CALLS[call](team, product)
    message = str(info.value)
    assert "SUBSCRIBER_MODEL" in message and "'auth.User'" in message, message
    assert "Group" in message and "get_subscriber(request)" in message, message
    assert not Customer.objects.exists() and not CheckoutSession.objects.exists()
    assert not Subscription.objects.exists() and OutboxEntry.objects.count() == entries
    assert len(billing_sandbox.requests()) == sent


def test_none_and_anonymous_are_still_no_subscriber(billing_sandbox, product):
    from django.contrib.auth.models import AnonymousUser

    for nobody in (None, AnonymousUser()):
        assert not billing.subscribed(nobody, product)
        with pytest.raises(billing.NoSubscriber):
            billing.checkout_url(nobody, product, "months-1", "XOF")
