"""Every write whose answer is lost after the service applied it (a 502 or 504, a redirect, a
200 that is not JSON, a read timeout, a connection reset): the retry resends the same key and
body, the service holds one object, and the local row ends linked to it (or in a state staff
see)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import Any

import pytest
import requests
from django.db import connection

from billing_integration.checkout.changes import cancel_at_period_end, change_plan
from billing_integration.checkout.services import CheckoutError, start_checkout
from billing_integration.checkout.trials import start_trial
from billing_integration.client import get_client
from billing_integration.client.backoff import clear_shared_backoff
from billing_integration.customers import ensure_customer_pushed, get_or_create_customer
from billing_integration.models import (
    ChangeRequest,
    ChangeVia,
    CheckoutSession,
    Customer,
    OutboxEntry,
    Product,
    Subscription,
)
from billing_integration.outbox.push import push_entry
from billing_integration.outbox.retry import retry_failed

from .conftest import make_product, use_database_cache
from .test_changes import ON, guesses, plans, subscribe  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db(transaction=True)

FAULTS = ["502", "504", "303", "html200", "timeout", "reset"]
#: Each fault once (the client's retry gets the replay), and three on every attempt of the
#: first click or push (the next one, or staff's retry, resends the key).
CASES = [(fault, 1) for fault in FAULTS] + [("303", 2), ("html200", 2), ("reset", 2)]


class ProcessDied(BaseException):
    """The process ended between the call and recording its answer (killed, a worker
    timeout): nothing after the call runs, its open transaction rolls back."""


def lose_answers(fault: str, method: str, path: str, count: int = 1) -> list[int]:
    """The next ``count`` matching calls reach the service (applied), then their answer is
    replaced by ``fault``. Returns the list of faulted calls (appended to)."""
    session = get_client().session
    real: Callable[..., Any] = session.request
    done: list[int] = []

    def request(m: str, url: str, *args: Any, **kw: Any) -> requests.Response:
        response = real(m, url, *args, **kw)
        if m != method or not url.split("?")[0].endswith(path) or len(done) >= count:
            return response
        done.append(response.status_code)
        if fault == "dies":
            raise ProcessDied()
        if fault == "timeout":
            raise requests.ReadTimeout("read timed out")
        if fault == "reset":
            raise requests.ConnectionError("connection reset by peer")
        lost = requests.Response()
        lost.url, lost.request = url, response.request
        if fault == "html200":
            lost.status_code, lost._content = 200, b"<html>proxy</html>"
            lost.headers["Content-Type"] = "text/html"
        elif fault == "303":
            lost.status_code, lost._content = 303, b""
            lost.headers["Location"] = url + "/somewhere"
        else:
            lost.status_code, lost._content = int(fault), b"Bad gateway"
        return lost

    session.request = request  # type: ignore[method-assign]
    return done


def forget_known_down() -> None:
    clear_shared_backoff()
    get_client().backoff.reset()


def until_done(action: Callable[[], Any], tries: int = 4) -> Any:
    """A person clicking again after each failure (the service known down is forgotten)."""
    for _ in range(tries - 1):
        forget_known_down()
        with suppress(CheckoutError):
            return action()
    forget_known_down()
    return action()


def keys(calls: list[dict]) -> set[str]:
    return {c["headers"]["x-idempotency-id"] for c in calls}


def settle_outbox() -> None:
    """Push every open entry; staff retry the failed ones in doubt (same key), until done."""
    for _ in range(6):
        for pk in list(OutboxEntry.objects.open().values_list("pk", flat=True)):
            OutboxEntry.objects.filter(pk=pk).update(next_attempt_at=None)
            push_entry(pk)
        if OutboxEntry.objects.failed().filter(in_doubt=True).exists():
            assert retry_failed() >= 1
        if not OutboxEntry.objects.exclude(state="done").exists():
            return
    raise AssertionError(list(OutboxEntry.objects.values("state", "in_doubt", "last_error")))


@pytest.mark.parametrize("fault,count", CASES)
def test_product_create(billing_sandbox, transactional_db, fault, count):
    faulted = lose_answers(fault, "POST", "/products", count)
    product = make_product(push=False)
    settle_outbox()
    assert faulted == [200] * count
    (remote,) = billing_sandbox.objects("product")
    product.refresh_from_db()
    assert str(product.remote_id) == remote["id"] and product.sync_state == "synced"
    calls = billing_sandbox.requests("create_product")
    assert len(keys(calls)) == 1 and all(c["body"] == calls[0]["body"] for c in calls)


@pytest.mark.parametrize("fault,count", CASES)
def test_product_archive(billing_sandbox, transactional_db, fault, count):
    product = make_product()
    faulted = lose_answers(fault, "PATCH", f"/products/{product.remote_id}", count)
    product.archive()
    settle_outbox()
    assert faulted == [200] * count
    (remote,) = billing_sandbox.objects("product")
    assert remote["status"] == "archived"
    product.refresh_from_db()
    assert product.sync_state == "synced" and product.confirmed_status == "archived"
    calls = billing_sandbox.requests("update_product")
    assert len(keys(calls)) == 1


@pytest.mark.parametrize("fault,count", CASES)
def test_customer_and_session_create(billing_sandbox, product, user, fault, count):
    faulted = lose_answers(fault, "POST", "/customers", count)
    with suppress(CheckoutError):
        start_checkout(user, product, "months-1", "XOF")
    forget_known_down()
    settle_outbox()
    session = until_done(lambda: start_checkout(user, product, "months-1", "XOF"))
    assert faulted and set(faulted) == {200}  # in doubt, the customer is looked up first
    (remote,) = billing_sandbox.objects("customer")
    assert str(Customer.objects.get().remote_id) == remote["id"]
    assert len(keys(billing_sandbox.requests("create_customer"))) == 1
    assert [s["id"] for s in billing_sandbox.objects("checkout_session")] == [
        str(session.remote_id)
    ]


@pytest.mark.parametrize("fault,count", CASES)
def test_session_create(billing_sandbox, product, user, fault, count):
    faulted = lose_answers(fault, "POST", "/checkout_sessions", count)
    session = until_done(lambda: start_checkout(user, product, "months-1", "XOF"))
    assert faulted == [200] * count
    assert [s["id"] for s in billing_sandbox.objects("checkout_session")] == [
        str(session.remote_id)
    ]
    assert CheckoutSession.objects.count() == 1
    assert len(keys(billing_sandbox.requests("create_checkout_session"))) == 1


@pytest.mark.parametrize("fault,count", CASES)
def test_trial_subscription_create(billing_sandbox, product, user, settings, fault, count):
    Product.objects.filter(pk=product.pk).update(trial_days=14)
    ensure_customer_pushed(get_or_create_customer(user)[0])
    faulted = lose_answers(fault, "POST", "/subscriptions", count)
    until_done(lambda: start_trial(user, product, "months-1", "XOF", days=14))
    settle_outbox()
    assert faulted == [200] * count
    (remote,) = billing_sandbox.objects("subscription")
    assert str(Subscription.objects.get().remote_id) == remote["id"]
    assert len(keys(billing_sandbox.requests("create_subscription"))) == 1


@pytest.mark.parametrize("fault,count", CASES)
def test_stop_renewal_patch(billing_sandbox, plans, logged_in, user, settings, fault, count):  # noqa: F811
    basic, _pro = plans
    billing_sandbox.config(patch_subscriptions=True)
    guesses(settings, patch_auto_renew=True)
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    faulted = lose_answers(fault, "PATCH", f"/subscriptions/{sub.remote_id}", count)
    first = cancel_at_period_end(Subscription.objects.get(pk=sub.pk))
    again = cancel_at_period_end(Subscription.objects.get(pk=sub.pk))
    assert faulted and set(faulted) == {200}  # a redirect is not resent: in doubt at once
    assert again.pk == first.pk and first.state == "pending"
    calls = billing_sandbox.requests("update_subscription")
    assert len(keys(calls)) == 1
    assert billing_sandbox.objects("subscription")[0]["auto_renew"] is False
    assert ChangeRequest.objects.count() == 1


@pytest.mark.parametrize("fault,count", CASES)
def test_change_plan_session(billing_sandbox, plans, logged_in, user, settings, fault, count):  # noqa: F811
    basic, pro = plans
    billing_sandbox.config(change_actions=["upgrade"])
    guesses(settings, **ON)
    subscribe(billing_sandbox, logged_in, user, basic)
    before = len(billing_sandbox.objects("checkout_session"))
    billing_sandbox.clear_requests()
    faulted = lose_answers(fault, "POST", "/checkout_sessions", count)
    request = until_done(lambda: change_plan(user, pro, "months-1", "XOF"))
    assert faulted == [200] * count
    assert request.via == ChangeVia.CHECKOUT
    assert len(billing_sandbox.objects("checkout_session")) == before + 1
    assert len(keys(billing_sandbox.requests("create_checkout_session"))) == 1
    assert ChangeRequest.objects.count() == 1
    assert Product.objects.count() == 2


def test_session_create_process_dies(billing_sandbox, product, user, settings):
    """With a database cache (the demo's): the attempt's key was written in the checkout's
    transaction, which rolled back with the process, and the next click made a second session
    with a new key."""
    use_database_cache(settings)
    lose_answers("dies", "POST", "/checkout_sessions")
    with pytest.raises(ProcessDied):
        start_checkout(user, product, "months-1", "XOF")
    session = start_checkout(user, product, "months-1", "XOF")
    assert [s["id"] for s in billing_sandbox.objects("checkout_session")] == [
        str(session.remote_id)
    ]
    assert len(keys(billing_sandbox.requests("create_checkout_session"))) == 1


def test_change_plan_session_process_dies(billing_sandbox, plans, logged_in, user, settings):  # noqa: F811
    basic, pro = plans
    billing_sandbox.config(change_actions=["upgrade"])
    guesses(settings, **ON)
    subscribe(billing_sandbox, logged_in, user, basic)
    use_database_cache(settings)
    before = len(billing_sandbox.objects("checkout_session"))
    billing_sandbox.clear_requests()
    lose_answers("dies", "POST", "/checkout_sessions")
    with pytest.raises(ProcessDied):
        change_plan(user, pro, "months-1", "XOF")
    request = change_plan(user, pro, "months-1", "XOF")
    assert request.via == ChangeVia.CHECKOUT
    assert len(billing_sandbox.objects("checkout_session")) == before + 1
    assert len(keys(billing_sandbox.requests("create_checkout_session"))) == 1


def test_stop_renewal_patch_process_dies(billing_sandbox, plans, logged_in, user, settings):  # noqa: F811
    basic, _pro = plans
    billing_sandbox.config(patch_subscriptions=True)
    guesses(settings, patch_auto_renew=True)
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    use_database_cache(settings)
    billing_sandbox.clear_requests()
    lose_answers("dies", "PATCH", f"/subscriptions/{sub.remote_id}")
    with pytest.raises(ProcessDied):
        cancel_at_period_end(Subscription.objects.get(pk=sub.pk))
    request = cancel_at_period_end(Subscription.objects.get(pk=sub.pk))
    assert request.via == ChangeVia.PATCH
    assert len(keys(billing_sandbox.requests("update_subscription"))) == 1


def test_checkout_view_under_atomic_requests_process_dies(
    billing_sandbox, product, logged_in, monkeypatch, settings
):
    """With ``ATOMIC_REQUESTS`` the view ran inside the request's transaction, so the attempt's
    key (the database cache) went with it when the process died after the call: the next click
    made a second session. The views that call the service opt out of it, as the callback."""
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    use_database_cache(settings)
    lose_answers("dies", "POST", "/checkout_sessions")
    with pytest.raises(ProcessDied):
        logged_in.post("/billing/checkout/", {"product": product.pk, "cycle": "months-1"})
    again = logged_in.post("/billing/checkout/", {"product": product.pk, "cycle": "months-1"})
    (remote,) = billing_sandbox.objects("checkout_session")
    assert again.status_code == 302 and again["Location"].endswith(f"/checkout/{remote['id']}")
    assert len(keys(billing_sandbox.requests("create_checkout_session"))) == 1
