"""Backing off together: two clients (two "workers", each with its own ``SharedBackoff``)
share the "known down until" window only through the Django cache. Real HTTP to the sandbox;
a fake clock and a fake sleep (no wall-clock assertions): a "wait" is what the fake sleep
recorded, and what the sandbox received during it is read from its request log."""

from __future__ import annotations

import json
import uuid

import pytest
import requests
from django.core.cache import caches

from billing_integration.client import BillingClient, RetryPolicy, SharedBackoff
from billing_integration.client.backoff import KEY, KNOWN_DOWN_SECONDS
from billing_integration.client.retry import Deadline
from billing_integration.exceptions import (
    BillingRateLimitError,
    BillingServerError,
    BillingTransportError,
)

pytestmark = pytest.mark.django_db

ALIAS = "backoff"


class FakeClock:
    """One clock for the wall time of the window and the monotonic time of deadlines; it moves
    only when a client sleeps (``sleeps`` records each wait) or a test advances it."""

    def __init__(self) -> None:
        self.now = 1_000_000.0
        self.sleeps: list[float] = []
        self.on_sleep = None

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        if self.on_sleep is not None:
            self.on_sleep()
        self.sleeps.append(round(seconds, 3))
        self.now += seconds


@pytest.fixture
def shared(billing_sandbox, settings):
    """A LocMem cache standing in for the shared one, named by BILLING['CACHE']."""
    settings.CACHES = {
        **settings.CACHES,
        ALIAS: {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "bo"},
    }
    settings.BILLING = {**settings.BILLING, "CACHE": ALIAS}
    caches[ALIAS].clear()
    yield billing_sandbox
    caches[ALIAS].clear()


def worker(clock: FakeClock, *, alias: str = ALIAS, max_retries: int = 0) -> BillingClient:
    """A client as one worker process has it: its own session and copy of the window."""
    return BillingClient(
        sleep=clock.sleep,
        retry=RetryPolicy(max_retries=max_retries, backoff_base=0.5, backoff_max=20.0),
        backoff=SharedBackoff(alias, clock=clock),
    )


def billing_requests(sandbox) -> list[dict]:
    return [r for r in sandbox.requests() if r.get("operation") != "token"]


def test_a_429_seen_by_one_worker_pauses_the_other(shared):
    """A gets 429 Retry-After: 2; B, calling next, waits 2 s without sending anything during
    the wait, then calls."""
    clock = FakeClock()
    a, b = worker(clock), worker(clock)
    a.tokens.get()
    b.tokens.get()
    shared.faults(operation="create_customer", status=429, retry_after=2, count=1)
    with pytest.raises(BillingRateLimitError):
        a.create_customer({"identifier": "a"}, idempotency_key=str(uuid.uuid4()))
    before = len(billing_requests(shared))
    during: list[int] = []
    clock.on_sleep = lambda: during.append(len(billing_requests(shared)))
    products = list(b.list_products())
    assert clock.sleeps == [2.0]
    assert during == [before]  # nothing from B reached the service during the window
    assert products == []
    assert [r["operation"] for r in billing_requests(shared)][-1] == "list_products"


def test_the_wait_is_capped_by_retry_after_max(shared):
    clock = FakeClock()
    a = BillingClient(
        sleep=clock.sleep,
        retry=RetryPolicy(max_retries=0, retry_after_max=3.0),
        backoff=SharedBackoff(ALIAS, clock=clock),
    )
    b = worker(clock)
    shared.faults(operation="list_products", status=429, retry_after=30, count=1)
    with pytest.raises(BillingRateLimitError):
        list(a.list_products())
    list(b.list_products())
    assert clock.sleeps == [3.0]


def test_an_interactive_call_fails_fast_during_the_shared_backoff(shared):
    """A 1 s deadline during a 2 s window: the error the checkout's 503 page handles, at once,
    with no request sent and no wait; an 8 s deadline too."""
    clock = FakeClock()
    a, b = worker(clock), worker(clock)
    b.tokens.get()
    shared.faults(operation="create_customer", status=429, retry_after=2, count=1)
    with pytest.raises(BillingRateLimitError):
        a.create_customer({"identifier": "a"}, idempotency_key=str(uuid.uuid4()))
    before = len(billing_requests(shared))
    with pytest.raises(BillingTransportError, match="backs off"):
        b.create_checkout_session({"customer": "c"}, deadline=Deadline(1, clock=clock))
    assert clock.sleeps == []
    assert len(billing_requests(shared)) == before
    # Even a deadline the window fits in does not wait it out: a person never waits on it.
    with pytest.raises(BillingTransportError, match="backs off"):
        list(b.list_products(deadline=Deadline(8, clock=clock)))
    assert clock.sleeps == []
    assert len(billing_requests(shared)) == before
    # Background work waits it out, then calls.
    list(b.list_products())
    assert clock.sleeps == [2.0]


def test_a_call_a_person_waited_on_that_failed_marks_the_service_known_down(shared):
    """The service stopped (connections dropped, no Retry-After): a call with a deadline
    retries within it, then gives up and opens the window for ``KNOWN_DOWN_SECONDS``. Another
    worker's call with a deadline then sends nothing and fails at once (the request log shows
    no request), and background work waits the window out before calling."""
    clock = FakeClock()
    a, b = worker(clock, max_retries=4), worker(clock)
    b.tokens.get()
    shared.faults(outage_seconds=30, outage_mode="reset")
    with pytest.raises(BillingTransportError, match="connection failed"):
        a.create_customer(
            {"identifier": "a"},
            idempotency_key=str(uuid.uuid4()),
            deadline=Deadline(8, clock=clock),
        )
    sent = len(billing_requests(shared))
    assert sent >= 2  # the first call into the outage keeps its deadline, retries included
    gave_up = clock.now
    waited = list(clock.sleeps)

    with pytest.raises(BillingTransportError, match="backs off"):
        b.create_checkout_session({"customer": "c"}, deadline=Deadline(8, clock=clock))
    assert len(billing_requests(shared)) == sent
    assert clock.sleeps == waited
    assert b.known_down() and a.known_down()
    assert float(caches[ALIAS].get(KEY)) == pytest.approx(gave_up + KNOWN_DOWN_SECONDS)

    shared.clear_faults()
    list(b.list_products())  # background: waits the window out, then calls
    assert clock.sleeps[-1] == pytest.approx(KNOWN_DOWN_SECONDS)
    assert len(billing_requests(shared)) == sent + 1
    assert not b.known_down()


def test_a_background_call_that_failed_to_the_end_marks_the_service_known_down(shared):
    """Three 503s without Retry-After (A's call and its two retries): the service is known
    down for ``KNOWN_DOWN_SECONDS``, and B, another worker, waits it out before calling."""
    clock = FakeClock()
    a, b = worker(clock, max_retries=2), worker(clock)
    shared.faults(operation="list_products", status=503, count=3)
    with pytest.raises(BillingServerError):
        list(a.list_products())
    waited_by_a = list(clock.sleeps)
    clock.sleeps.clear()
    assert b.known_down()
    list(b.list_products())
    assert len(waited_by_a) == 2
    assert clock.sleeps == [pytest.approx(KNOWN_DOWN_SECONDS)]


def test_a_call_that_succeeds_after_a_retry_opens_no_window(shared):
    """One 503 without Retry-After, then success: the other worker calls at once."""
    clock = FakeClock()
    a, b = worker(clock, max_retries=2), worker(clock)
    shared.faults(operation="list_products", status=503, count=1)
    assert list(a.list_products()) == []
    clock.sleeps.clear()
    assert not b.known_down()
    list(b.list_products())
    assert clock.sleeps == []
    assert caches[ALIAS].get(KEY) is None


def test_the_window_is_only_extended(shared):
    clock = FakeClock()
    SharedBackoff(ALIAS, clock=clock).publish(5)
    SharedBackoff(ALIAS, clock=clock).publish(2)
    assert caches[ALIAS].get(KEY) == clock.now + 5
    assert SharedBackoff(ALIAS, clock=clock).wait() == 5


def test_a_cache_outage_never_blocks_a_call(billing_sandbox, settings):
    """The shared cache is unreachable (a Redis on a closed port): A's 429 cannot be shared,
    B calls at once, and both calls go through."""
    settings.CACHES = {
        **settings.CACHES,
        "down": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
            "OPTIONS": {"socket_connect_timeout": 0.2, "socket_timeout": 0.2},
        },
    }
    clock = FakeClock()
    a, b = worker(clock, alias="down"), worker(clock, alias="down")
    billing_sandbox.faults(operation="list_products", status=429, retry_after=2, count=1)
    with pytest.raises(BillingRateLimitError):
        list(a.list_products())
    assert list(b.list_products()) == []
    assert clock.sleeps == []
    assert [r["operation"] for r in billing_requests(billing_sandbox)] == ["list_products"] * 2


class CountingSession:
    """A transport that answers 200 at once and counts requests (for the overhead test)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.sent = 0

    def request(self, method, url, data=None, headers=None, params=None, timeout=None, **kw):
        self.sent += 1
        self.clock.now += 0.001  # each call "takes" 1 ms
        response = requests.Response()
        response.status_code = 200
        body = {"access_token": "t", "expires_in": 300} if "token" in url else {"data": {}}
        response._content = json.dumps(body).encode()
        return response

    def close(self) -> None:
        pass


def test_all_is_well_costs_one_cache_read_per_refresh_interval(shared, monkeypatch):
    """1,000 calls over one (fake) second read the shared window at most 3 times (once per
    0.5 s), not once per call."""
    clock = FakeClock()
    reads: list[str] = []
    cache = caches[ALIAS]
    real_get = cache.get
    monkeypatch.setattr(cache, "get", lambda key, *a, **k: (reads.append(key), real_get(key))[1])
    client = BillingClient(
        session=CountingSession(clock), sleep=clock.sleep, backoff=SharedBackoff(ALIAS, clock=clock)
    )
    for _ in range(1000):
        client.get_product("p")
    assert client.session.sent >= 1000
    assert 1 <= reads.count(KEY) <= 3


@pytest.fixture
def redis_cache(settings):
    """The alias ``redis``: the real Redis (database 9), with a key prefix of the test's own,
    its shared keys deleted after the test."""
    settings.CACHES = {
        **settings.CACHES,
        "redis": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:6379/9",
            "KEY_PREFIX": f"backoff-test-{uuid.uuid4().hex[:8]}",
        },
    }
    yield caches["redis"]
    caches["redis"].delete(KEY)


@pytest.mark.redis
def test_two_workers_share_the_window_through_redis(billing_sandbox, redis_cache):
    """The same over the real Redis (database 9, a key prefix of its own)."""
    clock = FakeClock()
    a, b = worker(clock, alias="redis"), worker(clock, alias="redis")
    billing_sandbox.faults(operation="list_products", status=429, retry_after=2, count=1)
    with pytest.raises(BillingRateLimitError):
        list(a.list_products())
    before = len(billing_requests(billing_sandbox))
    during: list[int] = []
    clock.on_sleep = lambda: during.append(len(billing_requests(billing_sandbox)))
    list(b.list_products())
    assert clock.sleeps == [2.0]
    assert during == [before]
