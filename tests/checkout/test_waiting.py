"""Requests a person waits on never hang: the checkout and return views call the service within
``BILLING['INTERACTIVE_DEADLINE']``; a customer push cut short is finished by the outbox; the
return page pulls once per window.

The process's client is built with a recorded ``sleep`` (no real waits, and the waits the
retry loop asked for are asserted) and the patient background policy (the client's default: 4
retries, Retry-After honoured up to 60 s), so what bounds the person's wait is the deadline
alone. Nothing here
asserts wall-clock time.
"""

from __future__ import annotations

import os
import time

import pytest

import billing_integration.client as client_module
from billing_integration.client import BillingClient, SharedBackoff
from billing_integration.client.retry import PAGE_MARGIN
from billing_integration.models import CheckoutSession, Customer, OutboxEntry
from billing_integration.outbox.push import PushOutcome, push_entry

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/billing/checkout/"
RETURN = "/billing/checkout/return/"


def post(client, product, cycle="months-1", currency="XOF"):
    return client.post(URL, {"product": product.pk, "cycle": cycle, "currency": currency})


def install_client() -> tuple[list[float], list[tuple[str, tuple[float, float, float]]]]:
    """Make the process client one whose sleep only records; return the recorded waits and
    the (url, (connect, read, total)) timeouts its transport was given. Settings changes replace the
    process client, so call this after them."""
    waits: list[float] = []
    timeouts: list[tuple[str, tuple[float, float, float]]] = []
    client_module.reset_client()
    now = [time.time()]  # the wall clock of the shared backoff moves with the recorded waits

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    client = BillingClient(sleep=sleep, backoff=SharedBackoff(clock=lambda: now[0]))
    real = client.session.request

    def spy(method, url, *args, **kwargs):
        timeout = kwargs["timeout"]  # a urllib3 Timeout with a deadline, else (connect, read)
        if isinstance(timeout, tuple):
            timeouts.append((url, (*timeout, None)))
        else:
            timeouts.append((url, (timeout.connect_timeout, timeout.read_timeout, timeout.total)))
        return real(method, url, *args, **kwargs)

    client.session.request = spy
    client_module._client = client
    client_module._pid = os.getpid()
    return waits, timeouts


@pytest.fixture(autouse=True)
def fast_retries():
    """Not here: the client keeps its patient defaults (conftest's fixture overridden)."""


@pytest.fixture
def patient(billing_sandbox, product):
    """The background retry policy; the process client records waits and timeouts."""
    yield install_client()
    client_module.reset_client()


@pytest.fixture
def waits(patient):
    return patient[0]


@pytest.fixture
def timeouts(patient):
    return patient[1]


@pytest.fixture
def enqueued(monkeypatch):
    """Pushes handed to the outbox, with their countdown."""
    from billing_integration.outbox import tasks

    calls: list[tuple[int, float | None]] = []
    monkeypatch.setattr(
        tasks, "enqueue", lambda pk, countdown=None: calls.append((pk, countdown)) or True
    )
    return calls


def _forget_token() -> None:
    from django.core.cache import caches

    caches["default"].clear()
    client_module.get_client().tokens._local = None


# --- the checkout view -----------------------------------------------------------------------
@pytest.mark.parametrize("token_cached", [True, False])
def test_outage_answers_503_at_once(billing_sandbox, logged_in, product, waits, token_cached):
    """The outage's Retry-After (its remaining length) is beyond the deadline: one attempt,
    no wait, the "try again, nothing was charged" page."""
    if not token_cached:
        _forget_token()
    billing_sandbox.clear_requests()
    billing_sandbox.faults(outage_seconds=30)
    response = post(logged_in, product)
    assert response.status_code == 503
    html = response.content.decode()
    assert 'data-error-code="service_unavailable"' in html and "Nothing was charged" in html
    assert waits == []
    sent = [r["operation"] for r in billing_sandbox.requests()]
    assert sent == (["create_customer"] if token_cached else ["token"])
    assert not CheckoutSession.objects.exists()


def test_session_creation_refused_for_longer_than_the_deadline(
    billing_sandbox, logged_in, product, waits
):
    billing_sandbox.faults(
        operation="create_checkout_session", status=503, retry_after=30, count=10
    )
    response = post(logged_in, product)
    assert response.status_code == 503
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 1
    assert waits == []
    assert not CheckoutSession.objects.exists()


def test_every_call_of_a_checkout_is_bounded_by_the_deadline(
    billing_sandbox, logged_in, product, timeouts, settings
):
    assert post(logged_in, product).status_code == 302
    assert [url.rsplit("/", 1)[-1] for url, _ in timeouts] == ["customers", "checkout_sessions"]
    # The whole request ends by the deadline: the calls get it less the page's margin, counted
    # from when the request came in, and connect and read together (total) fit in it.
    deadline = settings.BILLING.get("INTERACTIVE_DEADLINE", 8.0) - PAGE_MARGIN
    for _, (connect, read, total) in timeouts:
        assert connect <= 5.0 and read <= deadline  # READ_TIMEOUT (30 s) is for background work
        assert total <= deadline


def test_slow_service_gets_the_time_left_then_a_503(
    billing_sandbox, logged_in, product, patient, settings
):
    """One deadline for the whole request: a slow customer push leaves the session creation
    only what remains, and an answer later than the deadline is not waited for."""
    settings.BILLING = {**settings.BILLING, "INTERACTIVE_DEADLINE": 2.0}
    _, timeouts = install_client()
    billing_sandbox.faults(operation="create_customer", latency=1.0)
    billing_sandbox.faults(operation="create_checkout_session", latency=3.0)
    response = post(logged_in, product)
    assert response.status_code == 503
    customer = [t for u, t in timeouts if u.endswith("/customers")]
    session = [t for u, t in timeouts if u.endswith("/checkout_sessions")]
    assert len(customer) == 1 and customer[0][1] <= 2.0 - PAGE_MARGIN
    assert len(session) == 1 and session[0][2] <= 1.0 - PAGE_MARGIN  # the push took 1 s
    assert not CheckoutSession.objects.exists()


def test_customer_push_cut_short_is_finished_by_the_outbox(
    billing_sandbox, logged_in, product, user, waits, enqueued
):
    billing_sandbox.faults(operation="create_customer", status=503, retry_after=30, count=10)
    response = post(logged_in, product)
    assert response.status_code == 503
    assert waits == []

    customer = Customer.objects.get(subscriber=user)
    entry = OutboxEntry.objects.for_object(customer).get()
    assert entry.state == "pending" and customer.remote_id is None
    assert (entry.pk, entry.next_attempt_at is not None) in [
        (pk, countdown is not None) for pk, countdown in enqueued
    ], "handed to the outbox with a countdown"

    billing_sandbox.clear_faults()
    assert push_entry(entry.pk).status == PushOutcome.DONE  # what the worker does
    calls = billing_sandbox.requests(operation="create_customer")
    assert {c["headers"]["x-idempotency-id"] for c in calls} == {str(entry.idempotency_key)}
    assert len(billing_sandbox.objects("customer")) == 1
    assert post(logged_in, product).status_code == 302
    assert len(billing_sandbox.objects("customer")) == 1


# --- the return view -------------------------------------------------------------------------
def test_return_page_pulls_once_per_window(billing_sandbox, logged_in, product):
    assert post(logged_in, product).status_code == 302
    session = CheckoutSession.objects.get()
    billing_sandbox.clear_requests()
    for _ in range(3):
        page = logged_in.get(RETURN, {"session_id": str(session.remote_id)})
        assert page.status_code == 200
    assert len(billing_sandbox.requests(operation="list_subscriptions")) == 1

    from django.core.cache import caches

    caches["default"].delete(f"billing:return-pull:{session.customer_id}")  # window over
    logged_in.get(RETURN)
    assert len(billing_sandbox.requests(operation="list_subscriptions")) == 2


def test_return_page_without_cache_still_pulls_once_per_request(
    billing_sandbox, logged_in, product, monkeypatch
):
    assert post(logged_in, product).status_code == 302
    billing_sandbox.clear_requests()

    class Down:
        def add(self, *args, **kwargs):
            raise ConnectionError("cache down")

    monkeypatch.setattr("billing_integration.sync.coalesce.shared_cache", lambda: Down())
    for _ in range(2):
        assert logged_in.get(RETURN).status_code == 200
    assert len(billing_sandbox.requests(operation="list_subscriptions")) == 2


def test_return_page_during_an_outage_answers_without_waiting(
    billing_sandbox, logged_in, product, waits
):
    assert post(logged_in, product).status_code == 302
    billing_sandbox.clear_requests()
    billing_sandbox.faults(operation="list_subscriptions", status=503, retry_after=30, count=10)
    page = logged_in.get(RETURN)
    assert page.status_code == 200
    assert "could not reach the payment service" in page.content.decode()
    assert len(billing_sandbox.requests(operation="list_subscriptions")) == 1
    assert waits == []
    # A reload within the window asks nothing more and still says the page may be stale.
    again = logged_in.get(RETURN)
    assert "could not reach the payment service" in again.content.decode()
    assert len(billing_sandbox.requests(operation="list_subscriptions")) == 1


# --- while the service is known down ---------------------------------------------------------
ACCOUNT = "/billing/account/"
STALE = "could not reach the payment service"


@pytest.fixture
def background_pulls(monkeypatch):
    """The pulls asked of a worker (``sync_all`` messages), recorded instead of sent."""
    from billing_integration.sync import tasks

    sent: list[dict] = []
    monkeypatch.setattr(tasks.sync_all, "apply_async", lambda *a, **k: sent.append(k))
    return sent


def test_checkout_while_the_service_is_known_down_sends_nothing(
    billing_sandbox, logged_in, product, waits, enqueued
):
    """The service stopped (connections dropped, no Retry-After): the first checkout tries
    within its deadline and answers 503; the service is then known down, so the next checkout
    answers 503 at once: no request (the sandbox's log), no wait."""
    billing_sandbox.faults(outage_seconds=30, outage_mode="reset")
    assert post(logged_in, product).status_code == 503
    assert len(billing_sandbox.requests(operation="create_customer")) >= 2  # retried in time
    billing_sandbox.clear_requests()
    before = len(waits)

    response = post(logged_in, product)
    assert response.status_code == 503
    assert 'data-error-code="service_unavailable"' in response.content.decode()
    assert billing_sandbox.requests() == []
    assert waits[before:] == []
    assert not CheckoutSession.objects.exists()


def test_pages_answer_from_the_mirror_while_the_service_is_known_down(
    billing_sandbox, logged_in, product, waits, background_pulls
):
    """The first return page into an outage tries within its deadline, then says the page may
    be out of date. Then the service is known down: the return page and the billing page send
    nothing (the sandbox's log), wait for nothing, say the mirror may be out of date, and one
    pull is asked of a worker instead."""
    from django.core.cache import caches

    assert post(logged_in, product).status_code == 302
    session = CheckoutSession.objects.get()
    assert STALE not in logged_in.get(ACCOUNT).content.decode()
    billing_sandbox.faults(outage_seconds=30, outage_mode="reset")
    billing_sandbox.clear_requests()
    first = logged_in.get(RETURN, {"session_id": str(session.remote_id)})
    assert first.status_code == 200 and STALE in first.content.decode()
    assert len(billing_sandbox.requests(operation="list_subscriptions")) >= 2  # retried in time
    billing_sandbox.clear_requests()
    caches["default"].delete(f"billing:return-pull:{session.customer_id}")  # its window over
    before = len(waits)

    again = logged_in.get(RETURN, {"session_id": str(session.remote_id)})
    assert again.status_code == 200 and STALE in again.content.decode()
    assert 'data-outcome="pending"' in again.content.decode()  # the mirror's state
    account = logged_in.get(ACCOUNT)
    assert account.status_code == 200 and STALE in account.content.decode()
    assert billing_sandbox.requests() == []
    assert waits[before:] == []
    assert len(background_pulls) == 1  # one pull asked of a worker, however many pages


def test_a_broker_refusing_the_background_pull_loses_no_page(
    billing_sandbox, logged_in, product, waits, monkeypatch
):
    """The service known down and the broker refusing the pull's message: the pages still
    answer from the mirror with their notice (the periodic pull refreshes later)."""
    from billing_integration.client import get_client
    from billing_integration.sync import tasks

    def refuse(*args, **kwargs):
        raise ConnectionError("broker down")

    assert post(logged_in, product).status_code == 302
    monkeypatch.setattr(tasks.sync_all, "apply_async", refuse)
    get_client().backoff.publish(2.0)  # a short window: known down all the same
    billing_sandbox.clear_requests()
    for url in (RETURN, ACCOUNT):
        page = logged_in.get(url)
        assert page.status_code == 200 and STALE in page.content.decode()
    assert billing_sandbox.requests() == []
    assert waits == []
