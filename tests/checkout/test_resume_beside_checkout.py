"""A subscription whose renewal is off is not resumed while a page of its customer that would
renew in its place may be paid: a trial's conversion ("Subscribe now"), or a change of plan's
page, open or paid and come back from but not recorded yet. Resumed then, both would renew
once that page is paid (the sandbox keeps the trial renewing beside its conversion). Over real
HTTP with the sandbox."""

from __future__ import annotations

import pytest
from django.core import mail

from billing_integration.checkout.changes import RenewalUnchanged, cancel_at_period_end, resume
from billing_integration.checkout.trials import start_trial
from billing_integration.models import ChangeRequest, CheckoutSession, Price, Product
from billing_integration.sync.coalesce import once_per_window

from .conftest import make_product, push_open_entries
from .test_changes import ON, guesses, pull, renewing, subscribe
from .test_confirming import page_closed
from .test_one_purchase import RETURN, post

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def plans(billing_sandbox, transactional_db) -> tuple[Product, Product]:
    """Basic, and Pro costing more a month (a change to it is an upgrade)."""
    basic = make_product("Basic")
    pro = make_product("Pro", push=False)
    Price.objects.filter(cycle__product=pro, currency_id=1, cycle__unit="months").update(
        amount=20000
    )
    push_open_entries()
    return basic, pro


@pytest.fixture
def staff(settings):
    settings.MANAGERS = [("Staff", "staff@example.com")]
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


def refused(sandbox, client, subscription, plan: str) -> None:
    """``resume`` and the resume view refuse ``subscription`` (409) naming ``plan``'s page:
    nothing sent, no request for staff."""
    with pytest.raises(RenewalUnchanged) as info:
        resume(subscription)
    assert f"A purchase of {plan} you started would renew in this one's place" in str(
        info.value.message
    )
    answer = client.post(f"/billing/account/subscriptions/{subscription.pk}/resume/")
    assert answer.status_code == 409
    assert f"A purchase of {plan} you started" in answer.content.decode()
    assert sandbox.requests(operation="update_subscription") == []
    assert not ChangeRequest.objects.filter(kind="resume").exists()
    assert mail.outbox == []


def test_a_trial_is_not_resumed_while_its_conversion_may_be_paid(
    billing_sandbox, plans, logged_in, user, settings, staff
):
    basic, _ = plans
    Product.objects.filter(pk=basic.pk).update(trial_days=14)
    billing_sandbox.config(patch_subscriptions=True)
    guesses(settings, patch_auto_renew=True)
    trial = start_trial(user, basic, "months-1", "XOF")
    assert trial.remote_id is not None and not trial.auto_renew
    assert post(logged_in, basic).status_code == 302  # "Subscribe now": its page is open
    session = CheckoutSession.objects.get()

    refused(billing_sandbox, logged_in, trial, "Basic")

    # paid and come back; the return page's pull taken as done a moment ago (not recorded)
    assert billing_sandbox.complete_checkout(str(session.remote_id)).status_code == 200
    assert once_per_window(f"billing:return-pull:{session.customer_id}", 3600)
    logged_in.get(RETURN, {"session_id": str(session.remote_id)})
    page_closed(session)
    refused(billing_sandbox, logged_in, trial, "Basic")

    # one subscription of Basic renews on the service: the conversion, not the trial
    assert [s["trial_end_date"] for s in renewing(billing_sandbox)] == [None]


def test_a_plan_is_not_resumed_while_a_change_of_plans_page_is_open(
    billing_sandbox, plans, logged_in, user, settings, staff
):
    basic, pro = plans
    billing_sandbox.config(change_actions=["upgrade"], patch_subscriptions=True)
    guesses(settings, **ON)
    old = subscribe(billing_sandbox, logged_in, user, basic)
    cancel_at_period_end(old)
    pull(user)
    old.refresh_from_db()
    assert not old.auto_renew and old.is_active
    change = logged_in.post(
        "/billing/account/change-plan/", {"product": pro.pk, "cycle": "months-1", "currency": "XOF"}
    )
    assert change.status_code == 302
    billing_sandbox.clear_requests()

    refused(billing_sandbox, logged_in, old, "Pro")

    # its page closed unpaid: nothing renews in its place, the resume is taken
    page_closed(CheckoutSession.objects.get(product=pro))
    assert logged_in.post(f"/billing/account/subscriptions/{old.pk}/resume/").status_code == 302
    assert ChangeRequest.objects.get(kind="resume", subscription=old).via == "patch"
