"""A trial whose resume was asked (the guessed ``PATCH`` taken, or a request to staff) renews by
itself on the service before the mirror shows it: its end bills the first period. Buying its
product then ("Subscribe now") would be billed beside it, so checkout refuses it as it refuses
a trial shown renewing (409 ``already_subscribed``), and the billing page offers no "Subscribe
now" on it. Over real HTTP with the sandbox."""

from __future__ import annotations

import pytest

from billing_integration.checkout.changes import resume
from billing_integration.checkout.services import AlreadySubscribed, checkout_url
from billing_integration.checkout.trials import start_trial
from billing_integration.models import ChangeRequest, CheckoutSession, Product

from .conftest import make_product
from .test_changes import guesses, pull
from .test_one_purchase import API, button, post

pytestmark = pytest.mark.django_db(transaction=True)

ACCOUNT = "/billing/account/"


@pytest.fixture
def basic(billing_sandbox, transactional_db) -> Product:
    product = make_product("Basic")
    Product.objects.filter(pk=product.pk).update(trial_days=14)
    return product


@pytest.fixture
def staff(settings):
    settings.MANAGERS = [("Staff", "staff@example.com")]
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


@pytest.mark.parametrize("patch", [True, False], ids=["patch", "staff"])
def test_a_trial_asked_to_renew_is_not_sold_again_before_the_mirror_shows_it(
    billing_sandbox, basic, logged_in, user, settings, staff, patch
):
    billing_sandbox.config(patch_subscriptions=patch)
    guesses(settings, patch_auto_renew=patch)
    trial = start_trial(user, basic, "months-1", "XOF")
    assert "billing-convert-trial" in logged_in.get(ACCOUNT).content.decode()
    asked = resume(trial)
    assert asked.via == ("patch" if patch else "request")
    trial.refresh_from_db()
    assert not trial.auto_renew  # the mirror does not show it yet

    refused = post(logged_in, basic)
    assert refused.status_code == 409
    assert 'data-error-code="already_subscribed"' in refused.content.decode()
    api = logged_in.post(API, {"product": basic.pk, "cycle": "months-1", "currency": "XOF"})
    assert api.status_code == 409 and api.json()["code"] == "already_subscribed"
    with pytest.raises(AlreadySubscribed):
        checkout_url(user, basic, "months-1", "XOF")
    assert billing_sandbox.requests(operation="create_checkout_session") == []
    assert not CheckoutSession.objects.exists()
    assert "billing-convert-trial" not in logged_in.get(ACCOUNT).content.decode()
    offered = button(basic, user, cycle="months-1", currency="XOF")
    assert "billing-checkout-form" not in offered and "billing-checkout-current" in offered

    if patch:  # the mirror shows it renewing: refused as before
        pull(user)
        trial.refresh_from_db()
        assert trial.auto_renew
        assert ChangeRequest.objects.get().state == "confirmed"
        assert post(logged_in, basic).status_code == 409
    else:  # the request withdrawn by a stop (nothing renews): "Subscribe now" is sold
        ChangeRequest.objects.update(state="withdrawn")
        assert post(logged_in, basic).status_code == 302
        assert len(billing_sandbox.requests(operation="create_checkout_session")) == 1
