"""Checkout against a sandbox that applies a create and loses its first answer (per
idempotency key): a second click never makes a second customer or a second session."""

from __future__ import annotations

from contextlib import suppress
from datetime import timedelta

import pytest
from django.utils import timezone

from billing_integration.checkout.services import CheckoutError, ServiceUnavailable, start_checkout
from billing_integration.models import CheckoutSession, Customer

from .conftest import first_save_fails

pytestmark = pytest.mark.django_db(transaction=True)


def keys_of(calls: list[dict]) -> set[str]:
    return {{k.lower(): v for k, v in c["headers"].items()}["x-idempotency-id"] for c in calls}


def test_one_click_gets_through_every_lost_answer(billing_sandbox, product, user):
    billing_sandbox.faults(operation="*", lose_first_answer=True)
    session = start_checkout(user, product, "months-1", "XOF")
    assert [c["id"] for c in billing_sandbox.objects("customer")] == [
        str(Customer.objects.get().remote_id)
    ]
    assert [s["id"] for s in billing_sandbox.objects("checkout_session")] == [
        str(session.remote_id)
    ]


def test_a_second_click_after_a_lost_customer_answer_makes_no_second_customer(
    billing_sandbox, product, user, settings, monkeypatch
):
    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    billing_sandbox.faults(operation="create_customer", lose_first_answer=True)
    with pytest.raises(ServiceUnavailable):
        start_checkout(user, product, "months-1", "XOF")
    assert len(billing_sandbox.objects("customer")) == 1  # applied, answer lost

    session = start_checkout(user, product, "months-1", "XOF")
    (remote,) = billing_sandbox.objects("customer")
    customer = Customer.objects.get()
    assert str(customer.remote_id) == remote["id"]
    assert session.customer_id == customer.pk
    assert len(billing_sandbox.requests(operation="create_customer")) == 1


def test_a_session_whose_answer_was_lost_is_not_created_again(
    billing_sandbox, product, user, settings, monkeypatch
):
    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    billing_sandbox.faults(operation="create_checkout_session", lose_first_answer=True)
    with pytest.raises(ServiceUnavailable):
        start_checkout(user, product, "months-1", "XOF")
    assert len(billing_sandbox.objects("checkout_session")) == 1
    assert CheckoutSession.objects.count() == 0

    session = start_checkout(user, product, "months-1", "XOF")
    (remote,) = billing_sandbox.objects("checkout_session")
    assert str(session.remote_id) == remote["id"]
    calls = billing_sandbox.requests(operation="create_checkout_session")
    assert [c["outcome"] for c in calls] == ["answer_lost", "answered"]
    assert len(keys_of(calls)) == 1 and calls[0]["body"] == calls[1]["body"]
    assert CheckoutSession.objects.count() == 1


def test_a_session_lost_then_refused_within_one_click_is_not_created_again(
    billing_sandbox, product, user
):
    """The client's retry of a session applied but unanswered (connection reset) is refused
    (401, and again with a fresh token): the next click resends the same key."""
    billing_sandbox.faults(operation="create_checkout_session", reset_after_commit_rate=1, count=1)
    billing_sandbox.faults(operation="create_checkout_session", status=401, count=3)
    with pytest.raises(ServiceUnavailable):
        start_checkout(user, product, "months-1", "XOF")
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 3
    assert len(billing_sandbox.objects("checkout_session")) == 1

    session = start_checkout(user, product, "months-1", "XOF")
    (remote,) = billing_sandbox.objects("checkout_session")
    assert str(session.remote_id) == remote["id"]
    assert len(keys_of(billing_sandbox.requests(operation="create_checkout_session"))) == 1


def test_another_choice_after_a_lost_session_is_a_new_session(
    billing_sandbox, product, user, settings, monkeypatch
):
    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    billing_sandbox.faults(operation="create_checkout_session", lose_first_answer=True, count=1)
    with pytest.raises(ServiceUnavailable):
        start_checkout(user, product, "months-1", "XOF")
    other = start_checkout(user, product, "years-1", "XOF")
    assert other.selected_billing_cycle == "years-1"
    calls = billing_sandbox.requests(operation="create_checkout_session")
    assert len(keys_of(calls)) == 2
    assert len(billing_sandbox.objects("checkout_session")) == 2


def test_a_refused_session_or_customer_is_sent_afresh_on_the_next_click(
    billing_sandbox, product, user
):
    """A refusal (4xx: nothing created) keeps no key: the next click sends a new one."""
    from billing_integration.checkout.services import CheckoutRefused
    from billing_integration.models import OutboxEntry

    billing_sandbox.faults(operation="create_customer", status=400, count=1)
    with pytest.raises(CheckoutRefused):
        start_checkout(user, product, "months-1", "XOF")
    billing_sandbox.faults(operation="create_checkout_session", status=400, count=1)
    with pytest.raises(CheckoutRefused):
        start_checkout(user, product, "months-1", "XOF")
    session = start_checkout(user, product, "months-1", "XOF")

    customers = billing_sandbox.requests(operation="create_customer")
    assert len(customers) == 2 and len(keys_of(customers)) == 2
    assert OutboxEntry.objects.filter(state="failed").count() == 1  # the refused one stays
    sessions = billing_sandbox.requests(operation="create_checkout_session")
    assert len(sessions) == 2 and len(keys_of(sessions)) == 2
    (remote,) = billing_sandbox.objects("checkout_session")
    assert str(session.remote_id) == remote["id"]


def test_a_session_answered_without_its_id_is_not_created_again(
    billing_sandbox, product, user, monkeypatch
):
    """A 2xx with no session id was a refusal (502) and forgot the key: the next click sent
    a new one, and the service held two sessions."""
    from tests.mirror.test_lost_answer import first_answer_without_id

    first_answer_without_id(monkeypatch, "/checkout_sessions")
    with suppress(CheckoutError):
        start_checkout(user, product, "months-1", "XOF")
    session = start_checkout(user, product, "months-1", "XOF")
    (remote,) = billing_sandbox.objects("checkout_session")
    assert str(session.remote_id) == remote["id"]
    assert len(keys_of(billing_sandbox.requests(operation="create_checkout_session"))) == 1


def test_a_session_key_answered_with_an_idempotency_conflict_is_kept_for_the_next_click(
    billing_sandbox, product, user, monkeypatch
):
    """The first click's session is applied, its answer lost; the second click's resend of
    the key is answered 409 naming idempotency (the key still in use there). That refusal
    forgot the key: the third click sent a new one and the service held two sessions."""
    import json

    from billing_integration.client import get_client

    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    billing_sandbox.faults(operation="create_checkout_session", lose_first_answer=True)
    session = get_client().session
    real, posts = session.request, []

    def request(method, url, **kwargs):
        response = real(method, url, **kwargs)
        if url.endswith("/checkout_sessions") and len(posts) == 1:
            conflict = {"errors": [{"code": "idempotency_key_in_use", "message": "In use."}]}
            response.status_code, response._content = 409, json.dumps(conflict).encode()
        posts.append(url) if url.endswith("/checkout_sessions") else None
        return response

    monkeypatch.setattr(session, "request", request)
    for _click in range(2):
        with suppress(CheckoutError):
            start_checkout(user, product, "months-1", "XOF")
    started = start_checkout(user, product, "months-1", "XOF")
    (remote,) = billing_sandbox.objects("checkout_session")
    assert str(started.remote_id) == remote["id"]
    assert len(keys_of(billing_sandbox.requests(operation="create_checkout_session"))) == 1


def test_a_session_answered_with_an_id_that_is_not_a_uuid_is_not_created_again(
    billing_sandbox, product, user, logged_in, monkeypatch
):
    """A 2xx naming the session by an id that is not a UUID (no hosted page to send the
    customer to) was a refusal (502) and forgot the key: the next click sent a new one, and
    the service held two sessions. It is a lost answer: 503, the key kept for the next click."""
    import json

    from tests.mirror.test_lost_answer import first_answer_changed

    def odd_id(response) -> None:
        body = response.json()
        body["data"]["id"] = "sess_42"
        response._content = json.dumps(body).encode()

    first_answer_changed(monkeypatch, "/checkout_sessions", odd_id)
    first = logged_in.post("/billing/checkout/", {"product": product.pk, "cycle": "months-1"})
    assert first.status_code == 503 and 'data-error-code="service_unavailable"' in (
        first.content.decode()
    )
    assert not CheckoutSession.objects.exists()

    second = logged_in.post("/billing/checkout/", {"product": product.pk, "cycle": "months-1"})
    (remote,) = billing_sandbox.objects("checkout_session")
    assert second.status_code == 302 and second["Location"].endswith(f"/checkout/{remote['id']}")
    assert str(CheckoutSession.objects.get().remote_id) == remote["id"]
    assert len(keys_of(billing_sandbox.requests(operation="create_checkout_session"))) == 1


@pytest.mark.parametrize("cache", ["outside", "database"])
def test_a_session_created_there_but_not_stored_here_is_not_created_again(
    billing_sandbox, product, user, monkeypatch, settings, cache
):
    """The service created the session, and storing it here failed (the database): the key
    was forgotten before the row was written, so the next click sent a new one and the service
    held two payable sessions. The key is now kept unless the session is stored; the click
    answers 503 once its transaction committed, so the database cache keeps the key too (it
    rolled back with the failed save)."""
    failed = first_save_fails(monkeypatch, settings, CheckoutSession, cache=cache)
    with pytest.raises(ServiceUnavailable):
        start_checkout(user, product, "months-1", "XOF")
    assert failed and not CheckoutSession.objects.exists()
    assert len(billing_sandbox.objects("checkout_session")) == 1

    session = start_checkout(user, product, "months-1", "XOF")
    (remote,) = billing_sandbox.objects("checkout_session")
    assert str(session.remote_id) == remote["id"]
    assert len(keys_of(billing_sandbox.requests(operation="create_checkout_session"))) == 1


def test_a_double_clicks_unsent_attempt_leaves_no_key_for_the_next_session(
    billing_sandbox, product, user, settings
):
    """The attempt's key and expiry are kept before the checkout's transaction; a double click
    whose session is reused never sends its own, which is forgotten: the next session, once
    the first has expired, is a new attempt with the expiry configured then, not the double
    click's."""
    settings.BILLING = {**settings.BILLING, "CHECKOUT_EXPIRY": 60}
    first = start_checkout(user, product, "months-1", "XOF")
    settings.BILLING = {**settings.BILLING, "CHECKOUT_EXPIRY": 7200}
    assert start_checkout(user, product, "months-1", "XOF").pk == first.pk  # reused, not sent
    settings.BILLING = {**settings.BILLING, "CHECKOUT_EXPIRY": 300}
    CheckoutSession.objects.filter(pk=first.pk).update(expires_at=timezone.now())

    second = start_checkout(user, product, "months-1", "XOF")
    assert second.pk != first.pk
    assert second.expires_at < timezone.now() + timedelta(seconds=600)
    one, two = billing_sandbox.requests(operation="create_checkout_session")
    assert one["headers"]["x-idempotency-id"] != two["headers"]["x-idempotency-id"]
