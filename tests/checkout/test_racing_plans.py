"""Two plans bought at the same moment for one subscriber: two members of one organisation
(``BILLING['SUBSCRIBER_RESOLVER']`` gives both the same subscriber), or two tabs. Both requests
pass the checks made before the customer's lock (the barrier in ``plan_to_replace`` lets
neither go on until both have read "no plan held"), then meet at the lock: one hosted session
is created, the other request is refused (409 ``checkout_open``) with nothing sent. On
PostgreSQL: row locks between concurrent transactions."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test import Client

from billing_integration import access
from billing_integration.checkout import services
from billing_integration.models import CheckoutSession, Customer

from .conftest import make_product
from .test_one_purchase import post

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]


def test_two_members_buying_two_plans_at_once_start_one(
    billing_sandbox, user, other_user, settings, monkeypatch
):
    starter, pro = make_product("Starter"), make_product("Pro plan")
    # bob buys for alice's account (the organisation's subscriber)
    settings.BILLING = {**settings.BILLING, "SUBSCRIBER_RESOLVER": lambda request: user}
    billing_sandbox.clear_requests()
    # a slow answer: without the lock, each request would create its session meanwhile
    billing_sandbox.faults(operation="create_checkout_session", latency=0.5)
    barrier = threading.Barrier(2, timeout=20)
    passed: list[str] = []

    def plan_to_replace(subscriber, product):
        found = access.plan_to_replace(subscriber, product)
        barrier.wait()  # both requests have read "no plan held"
        passed.append(product.name)
        return found

    monkeypatch.setattr(services, "plan_to_replace", plan_to_replace)
    answers: dict[str, tuple[int, str]] = {}

    def buy(member, product) -> None:
        try:
            client = Client()
            client.force_login(member)
            response = post(client, product)
            answers[product.name] = (response.status_code, response.content.decode())
        finally:
            connection.close()

    threads = [
        threading.Thread(target=buy, args=(user, starter)),
        threading.Thread(target=buy, args=(other_user, pro)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert sorted(passed) == ["Pro plan", "Starter"]  # the race happened
    statuses = sorted(status for status, _ in answers.values())
    assert statuses == [302, 409], answers
    [refused] = [html for status, html in answers.values() if status == 409]
    assert 'data-error-code="checkout_open"' in refused
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 1
    assert len(billing_sandbox.requests(operation="create_customer")) == 1
    assert Customer.objects.get().subscriber == user
    assert CheckoutSession.objects.count() == 1


def test_a_trial_resumed_and_converted_at_the_same_moment_renews_once(
    billing_sandbox, user, settings, monkeypatch
):
    """Resume and Subscribe now on one trial in two tabs at once: both pass the checks made
    before the customer's lock (the barrier), then meet at the lock: one is refused, so the
    trial does not renew beside its conversion."""
    from billing_integration.checkout import changes
    from billing_integration.checkout.trials import start_trial
    from billing_integration.models import ChangeRequest, Product

    from .test_changes import guesses

    basic = make_product("Basic")
    Product.objects.filter(pk=basic.pk).update(trial_days=14)
    billing_sandbox.config(patch_subscriptions=True)
    guesses(settings, patch_auto_renew=True)
    trial = start_trial(user, basic, "months-1", "XOF")
    billing_sandbox.clear_requests()
    billing_sandbox.faults(operation="create_checkout_session", latency=0.5)
    billing_sandbox.faults(operation="update_subscription", latency=0.5)
    barrier = threading.Barrier(2, timeout=20)
    passed: list[str] = []

    real_holds_paid = services.holds_paid

    def holds_paid(subscriber, product):
        found = real_holds_paid(subscriber, product)
        barrier.wait()
        passed.append("checkout")
        return found

    def is_subscriber(subscriber):
        found = access._is_subscriber(subscriber)
        barrier.wait()
        passed.append("resume")
        return found

    monkeypatch.setattr(services, "holds_paid", holds_paid)
    monkeypatch.setattr(changes, "_is_subscriber", is_subscriber)
    answers: dict[str, int] = {}

    def click(name, path, data) -> None:
        try:
            client = Client()
            client.force_login(user)
            answers[name] = client.post(path, data).status_code
        finally:
            connection.close()

    choice = {"product": basic.pk, "cycle": "months-1", "currency": "XOF"}
    threads = [
        threading.Thread(target=click, args=("checkout", "/billing/checkout/", choice)),
        threading.Thread(
            target=click,
            args=("resume", f"/billing/account/subscriptions/{trial.pk}/resume/", {}),
        ),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert sorted(passed) == ["checkout", "resume"]  # the race happened
    assert sorted(answers.values()) == [302, 409], answers
    sessions = len(billing_sandbox.requests(operation="create_checkout_session"))
    patches = len(billing_sandbox.requests(operation="update_subscription"))
    assert sessions + patches == 1
    assert CheckoutSession.objects.count() + ChangeRequest.objects.count() == 1
