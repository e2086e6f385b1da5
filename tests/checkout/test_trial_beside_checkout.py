"""A trial of one plan started but not confirmed by the service yet (its push in flight or left
to the outbox: no status) is a plan all the same: a checkout of another plan of its group is
refused (409 ``plan_held``), as a trial of another plan is, and neither is sent to the service.
A trial and a checkout of two plans started at the same moment: one of them is refused."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from billing_integration import access
from billing_integration.checkout import services
from billing_integration.checkout.services import (
    CheckoutError,
    CheckoutInProgress,
    PlanAlreadyHeld,
    start_checkout,
)
from billing_integration.checkout.trials import start_trial
from billing_integration.models import CheckoutSession, Product, Subscription

from .conftest import make_product
from .test_one_purchase import API, post

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def plans(billing_sandbox, transactional_db) -> tuple[Product, Product]:
    starter, pro = make_product("Starter"), make_product("Pro plan")
    Product.objects.filter(pk=starter.pk).update(trial_days=14)
    starter.refresh_from_db()
    return starter, pro


def test_a_checkout_of_another_plan_is_refused_while_a_trial_is_not_confirmed_yet(
    billing_sandbox, plans, logged_in, user
):
    starter, pro = plans
    trial = start_trial(user, starter, "months-1", "XOF", wait=False)
    assert trial.remote_id is None and trial.status == ""  # not confirmed by the service
    billing_sandbox.clear_requests()

    with pytest.raises(PlanAlreadyHeld) as info:
        start_checkout(user, pro, "months-1", "XOF")
    assert info.value.held_name == "Starter" and info.value.code == "plan_held"
    page = post(logged_in, pro)
    assert page.status_code == 409 and 'data-error-code="plan_held"' in page.content.decode()
    api = logged_in.post(
        API,
        {"product": str(pro.pk), "cycle": "months-1", "currency": "XOF"},
        content_type="application/json",
    )
    assert api.status_code == 409 and api.json()["code"] == "plan_held"

    assert not billing_sandbox.requests(operation="create_checkout_session")
    assert not CheckoutSession.objects.exists()
    # the trial's own product may still be bought: that converts the trial
    assert post(logged_in, starter).status_code == 302


def test_a_trial_and_a_checkout_of_two_plans_at_the_same_moment_start_one_plan(
    billing_sandbox, plans, user, monkeypatch
):
    """Both requests pass the checks made before the customer's lock (no plan held yet: the
    barrier in ``plan_to_replace`` lets neither go on until both have read it), then meet at the
    lock: the second one finds the first one's trial or session and is refused."""
    starter, pro = plans
    start_checkout(user, starter, "years-1", "XOF")  # the customer pushed; then expired:
    CheckoutSession.objects.update(expires_at="2000-01-01T00:00:00Z")
    billing_sandbox.clear_requests()
    barrier = threading.Barrier(2, timeout=20)
    passed: list[str] = []

    def plan_to_replace(subscriber, product):
        found = access.plan_to_replace(subscriber, product)
        barrier.wait()  # both requests have read "no plan held"
        passed.append(product.name)
        return found

    monkeypatch.setattr(services, "plan_to_replace", plan_to_replace)
    results: dict[str, object] = {}

    def run(name, start, product) -> None:
        try:
            results[name] = start(user, product, "months-1", "XOF")
        except CheckoutError as exc:
            results[name] = exc
        finally:
            connection.close()

    threads = [
        threading.Thread(target=run, args=("trial", start_trial, starter)),
        threading.Thread(target=run, args=("checkout", start_checkout, pro)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert sorted(passed) == ["Pro plan", "Starter"]  # the race happened
    refused = [r for r in results.values() if isinstance(r, PlanAlreadyHeld | CheckoutInProgress)]
    assert len(results) == 2 and len(refused) == 1, results
    sent = billing_sandbox.requests(operation="create_subscription") + billing_sandbox.requests(
        operation="create_checkout_session"
    )
    assert len(sent) == 1
    started = Subscription.objects.count() + CheckoutSession.objects.filter(product=pro).count()
    assert started == 1
