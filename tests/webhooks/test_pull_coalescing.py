"""Events naming objects not known locally: the pulls they trigger are coalesced (one list pull
serves many events), never one pull per event. Lists come from the sandbox over real HTTP;
the count of list requests it received is asserted."""

from __future__ import annotations

import json
import threading
import uuid

import pytest
from django.db import connection

from billing_integration.conf import shared_cache
from billing_integration.models import Customer, EventState, Payment, Subscription, WebhookEvent
from billing_integration.sync import coalesce
from billing_integration.webhooks.ingest import store_delivery
from billing_integration.webhooks.processing import process_event
from billing_integration.webhooks.verification import Verification

from .conftest import envelope, payment_data, subscription_data

pytestmark = pytest.mark.django_db(transaction=True)

N = 20


def store(payload: dict) -> int:
    result = store_delivery(
        json.dumps(payload).encode(), {}, Verification("signature", payload.get("id"))
    )
    assert result.created
    return result.event.pk


@pytest.fixture
def remote(billing_sandbox):
    """N customers with one subscription each in the sandbox, none known locally."""
    billing_sandbox.seed(customers=N, subscriptions=N)
    subs = billing_sandbox.objects("subscription")
    assert len(subs) == N
    billing_sandbox.clear_requests()
    return subs


def payment_events(subs) -> list[int]:
    return [
        store(
            envelope(
                "payment.completed",
                payment_data(
                    uuid.uuid4(),
                    status="completed",
                    subscription=s["id"],
                    customer=s["customer"],
                    product=s["product"],
                ),
            )
        )
        for s in subs
    ]


def list_calls(sandbox, resource: str) -> int:
    """The pulls of ``resource``: its list read from the first page."""
    calls = sandbox.requests(operation=f"list_{resource}")
    return len([c for c in calls if c["query"].get("offset") == "0"])


def assert_all_applied(subs) -> None:
    assert WebhookEvent.objects.filter(state=EventState.PROCESSED).count() == N
    assert Payment.objects.count() == N
    assert not Payment.objects.filter(subscription__isnull=True).exists()
    assert not Payment.objects.filter(customer__isnull=True).exists()
    assert Subscription.objects.count() == N
    assert not Subscription.objects.filter(customer__isnull=True).exists()


def test_twenty_unknown_subscriptions_in_a_row_cost_one_pull(billing_sandbox, remote):
    for pk in payment_events(remote):
        process_event(pk)
    assert_all_applied(remote)
    assert list_calls(billing_sandbox, "subscriptions") == 1  # one pull each
    assert list_calls(billing_sandbox, "customers") == 1


def test_twenty_unknown_subscriptions_at_once_are_coalesced(billing_sandbox, remote):
    """Four workers process the events concurrently: the pulls they ask for run one at a time
    and serve the others."""
    pks = payment_events(remote)
    billing_sandbox.faults(operation="list_subscriptions", latency=0.3)
    billing_sandbox.faults(operation="list_customers", latency=0.3)
    errors: list[BaseException] = []

    def worker(chunk: list[int]) -> None:
        try:
            for pk in chunk:
                process_event(pk)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(pks[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert_all_applied(remote)
    assert list_calls(billing_sandbox, "subscriptions") <= 2
    assert list_calls(billing_sandbox, "customers") <= 2


def test_unknown_customers_of_subscription_events(billing_sandbox, remote):
    """subscription.renewal for subscriptions whose customers are unknown: one customer pull."""
    pks = [
        store(
            envelope(
                "subscription.renewal",
                subscription_data(s["id"], customer=s["customer"], product=s["product"]),
            )
        )
        for s in remote
    ]
    for pk in pks:
        process_event(pk)
    assert Subscription.objects.filter(customer__isnull=False).count() == N
    assert Customer.objects.count() == N
    assert list_calls(billing_sandbox, "customers") == 1


# --- the coalescing itself -----------------------------------------------------------------
def _burst(resource: str, n: int, present=lambda: False, pull_seconds: float = 0.2) -> int:
    """``n`` threads ask for a pull of ``resource`` at the same moment; how many pulls ran."""
    pulls: list[int] = []
    started = threading.Event()
    barrier = threading.Barrier(n)

    def pull() -> None:
        pulls.append(1)
        started.set()
        threading.Event().wait(pull_seconds)  # the pull takes a while

    def ask() -> None:
        try:
            barrier.wait()
            coalesce.coalesced_pull(resource, pull, present)
        finally:
            connection.close()

    threads = [threading.Thread(target=ask) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return len(pulls)


def test_concurrent_requests_share_at_most_two_pulls(billing_sandbox):
    assert 1 <= _burst(f"test-{uuid.uuid4()}", 10) <= 2


def test_requests_served_by_a_running_pull_do_not_pull(billing_sandbox):
    found = threading.Event()
    resource = f"test-{uuid.uuid4()}"

    def present() -> bool:
        return found.is_set()

    pulls: list[int] = []

    def pull() -> None:
        pulls.append(1)
        found.set()  # the pull brings the object everyone asked for

    for _ in range(5):
        coalesce.coalesced_pull(resource, pull, present)
    assert pulls == [1]


def test_a_pull_that_started_before_the_request_does_not_count(billing_sandbox):
    """Asked after a pull started and the object is still unknown: one more pull, never more."""
    resource = f"test-{uuid.uuid4()}"
    calls: list[int] = []
    coalesce.coalesced_pull(resource, lambda: calls.append(1))
    coalesce.coalesced_pull(resource, lambda: calls.append(1))
    assert calls == [1, 1]


def test_a_later_request_pulls_once_the_caches_default_timeout_has_passed(settings, tmp_path):
    """The database and file caches' ``incr`` writes the key with the cache's default timeout
    (300 s): the count of started pulls expired then, and every later request was taken for
    one a newer pull had served, so events named unknown objects and nothing was pulled.
    ``TIMEOUT: 0`` stands for that time having passed."""
    backend = "django.core.cache.backends.filebased.FileBasedCache"
    settings.CACHES = {**settings.CACHES, "files": {"BACKEND": backend, "LOCATION": str(tmp_path)}}
    settings.CACHES["files"]["TIMEOUT"] = 0
    settings.BILLING = {**settings.BILLING, "CACHE": "files"}
    calls: list[int] = []
    coalesce.coalesced_pull("subscriptions", lambda: calls.append(1))
    coalesce.coalesced_pull("subscriptions", lambda: calls.append(1))
    assert calls == [1, 1]


def test_a_request_pulls_when_the_cache_dropped_the_count_of_started_pulls(billing_sandbox):
    """An evicted (or culled, or expired) started count with the finished one kept: requests
    were taken for ones a newer pull had served, for good."""
    resource = f"test-{uuid.uuid4()}"
    calls: list[int] = []
    coalesce.coalesced_pull(resource, lambda: calls.append(1))
    shared_cache().delete(f"billing:pull:{resource}:started")
    coalesce.coalesced_pull(resource, lambda: calls.append(1))
    coalesce.coalesced_pull(resource, lambda: calls.append(1))
    assert calls == [1, 1, 1]


def test_cache_outage_still_coalesces_within_the_process(billing_sandbox, monkeypatch):
    class Down:
        def __getattr__(self, name):
            def fail(*args, **kwargs):
                raise ConnectionError("cache down")

            return fail

    monkeypatch.setattr(coalesce, "shared_cache", lambda: Down())
    assert 1 <= _burst(f"test-{uuid.uuid4()}", 8) <= 2


def test_a_failed_pull_serves_no_one(billing_sandbox):
    resource = f"test-{uuid.uuid4()}"

    def broken() -> None:
        raise RuntimeError("service down")

    with pytest.raises(RuntimeError):
        coalesce.coalesced_pull(resource, broken)
    calls: list[int] = []
    assert coalesce.coalesced_pull(resource, lambda: calls.append(1)) is True
    assert calls == [1]
