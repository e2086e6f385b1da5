"""Backing off together: two clients (two "workers", each with its own ``SharedBackoff``)
share the window only through the Django cache. Real HTTP to the sandbox; a fake clock and a
fake sleep (no wall-clock assertions): a "wait" is what the fake sleep recorded, and what the
sandbox received during it is read from its request log."""

from __future__ import annotations

import json
import uuid

import pytest
import requests
from django.core.cache import caches
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from billing_integration.client import BillingClient, RetryPolicy, SharedBackoff
from billing_integration.client.backoff import KEY, KNOWN_DOWN_SECONDS, PACE_KEY, PACE_MIN
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
    """A LocMem cache standing in for the shared one, named by BACKOFF_CACHE."""
    settings.CACHES = {
        **settings.CACHES,
        ALIAS: {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "bo"},
    }
    settings.BILLING = {**settings.BILLING, "BACKOFF_CACHE": ALIAS}
    caches[ALIAS].clear()
    yield billing_sandbox
    caches[ALIAS].clear()


def worker(clock: FakeClock, *, alias: str = ALIAS, max_retries: int = 0) -> BillingClient:
    """A client as one worker process has it: its own session, local copy and failure run."""
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


def test_a_run_of_failures_pauses_every_worker(shared):
    """Three 503s in a row without Retry-After (A's call and its two retries): the window is
    the policy's base backoff, and B waits it out."""
    clock = FakeClock()
    a, b = worker(clock, max_retries=2), worker(clock)
    shared.faults(operation="list_products", status=503, count=3)
    with pytest.raises(BillingServerError):
        list(a.list_products())
    waited_by_a = list(clock.sleeps)
    clock.sleeps.clear()
    list(b.list_products())
    assert len(waited_by_a) == 2
    assert clock.sleeps == [0.5]


def test_a_success_ends_the_run_of_failures(shared):
    clock = FakeClock()
    backoff = SharedBackoff(ALIAS, clock=clock, failure_run=3)
    policy = RetryPolicy()
    backoff.failed(None, policy)
    backoff.failed(None, policy)
    backoff.succeeded()
    backoff.failed(None, policy)
    assert caches[ALIAS].get(KEY) is None
    backoff.failed(None, policy)
    backoff.failed(None, policy)
    assert caches[ALIAS].get(KEY) == clock.now + 0.5


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

    def request(self, method, url, data=None, headers=None, params=None, timeout=None):
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


def test_shared_backoff_off_keeps_each_worker_on_its_own(shared, settings):
    settings.BILLING = {**settings.BILLING, "SHARED_BACKOFF": False}
    clock = FakeClock()
    a = BillingClient(sleep=clock.sleep, retry=RetryPolicy(max_retries=0))
    b = BillingClient(sleep=clock.sleep, retry=RetryPolicy(max_retries=0))
    shared.faults(operation="list_products", status=429, retry_after=2, count=1)
    with pytest.raises(BillingRateLimitError):
        list(a.list_products())
    list(b.list_products())
    assert clock.sleeps == []
    assert caches[ALIAS].get(KEY) is None


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
    caches["redis"].delete_many([KEY, PACE_KEY])


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


# --- the shared pace after a 429 ------------------------------------------------------------
def send_times(client: BillingClient, clock: FakeClock) -> list[float]:
    """The fake-clock times at which ``client`` sent its billing requests (filled as it
    sends)."""
    times: list[float] = []
    real = client.session.request

    def request(method, url, *args, **kwargs):
        if "/token" not in url:
            times.append(clock.now)
        return real(method, url, *args, **kwargs)

    client.session.request = request
    return times


def test_after_a_429_every_worker_keeps_to_half_the_rate_it_had(shared):
    """A had 8 calls answered in the last second, then a 429 (Retry-After 2): the shared pace
    is 4 calls a second from the end of the window. B, another worker, then sends 8 calls:
    none before the window ends, one in each quarter of a second (so at most 5 in any
    second), and all are answered."""
    clock = FakeClock()
    a = worker(clock)
    b = BillingClient(  # a pace that does not grow within the test, so its slots stay 0.25 s
        sleep=clock.sleep,
        retry=RetryPolicy(max_retries=0),
        backoff=SharedBackoff(ALIAS, clock=clock, pace_doubling=3600),
    )
    for _ in range(8):
        list(a.list_products())
        clock.now += 0.1
    shared.faults(operation="list_products", status=429, retry_after=2, count=1)
    with pytest.raises(BillingRateLimitError):
        list(a.list_products())
    window_end = clock.now + 2
    assert caches[ALIAS].get(PACE_KEY) == (4.0, window_end)
    sent = send_times(b, clock)
    for _ in range(8):
        assert list(b.list_products()) == []
    assert min(sent) >= window_end
    assert len(sent) == 8
    assert len({int(t // 0.25) for t in sent}) == 8  # one call per slot of the pace
    assert max(sum(1 for t in sent if start <= t < start + 1) for start in sent) <= 5


def test_the_429s_of_calls_in_flight_halve_the_pace_once(shared):
    """Three 429s at once (calls already sent) halve it once; a 429 a second after the window
    halves it again, from what it had grown to."""
    clock = FakeClock()
    backoff = SharedBackoff(ALIAS, clock=clock, pace_doubling=5.0)
    policy = RetryPolicy()
    for _ in range(12):
        backoff.succeeded()
    for _ in range(3):
        backoff.failed(2.0, policy, rate_limited=True)
    assert caches[ALIAS].get(PACE_KEY) == (6.0, clock.now + 2)
    clock.now += 2 + 5  # the window, then one doubling time
    assert SharedBackoff(ALIAS, clock=clock).wait() == 0
    other = SharedBackoff(ALIAS, clock=clock)
    other.wait()
    assert other.pace() == pytest.approx(12.0)
    other.failed(2.0, policy, rate_limited=True)
    assert caches[ALIAS].get(PACE_KEY) == (6.0, clock.now + 2)


def test_a_pace_never_falls_below_its_floor_and_ends_once_grown(shared):
    clock = FakeClock()
    backoff = SharedBackoff(ALIAS, clock=clock, pace_doubling=5.0)
    backoff.failed(None, RetryPolicy(), rate_limited=True)  # nothing answered before
    assert backoff.pace() == PACE_MIN
    clock.now += 5 * 10  # 2**10 times the floor: over 1,000 a second
    assert backoff.pace() is None
    assert backoff.slot() == 0.0


def test_an_interactive_call_fails_fast_when_the_pace_has_no_turn_for_it(shared):
    """At one call a second, a call with a 0.5 s deadline whose slot is taken fails at once,
    with nothing sent; without a deadline it waits for the next slot."""
    clock = FakeClock()
    a, b = worker(clock), worker(clock)
    b.tokens.get()
    shared.faults(operation="list_products", status=429, retry_after=1, count=1)
    with pytest.raises(BillingRateLimitError):
        list(a.list_products())
    clock.now += 1.0
    list(a.list_products())  # takes this second's slot
    before = len(billing_requests(shared))
    with pytest.raises(BillingTransportError, match="calls a second"):
        list(b.list_products(deadline=Deadline(0.5, clock=clock)))
    assert len(billing_requests(shared)) == before
    sent = send_times(b, clock)
    list(b.list_products())
    assert len(sent) == 1 and clock.sleeps and sum(clock.sleeps) <= 1.2


def test_no_pace_when_pace_doubling_is_zero(shared):
    clock = FakeClock()
    backoff = SharedBackoff(ALIAS, clock=clock, pace_doubling=0)
    backoff.succeeded()
    backoff.failed(2.0, RetryPolicy(), rate_limited=True)
    assert caches[ALIAS].get(KEY) == clock.now + 2  # the window still holds
    assert caches[ALIAS].get(PACE_KEY) is None
    assert backoff.pace() is None


def test_a_malformed_pace_in_the_cache_is_no_pace(shared):
    clock = FakeClock()
    for value in ("fast", (float("nan"), 1.0), (5,), None):
        caches[ALIAS].set(PACE_KEY, value)
        backoff = SharedBackoff(ALIAS, clock=clock)
        backoff.wait()
        assert backoff.pace() is None


@pytest.mark.redis
def test_workers_take_turns_under_the_pace_through_redis(billing_sandbox, redis_cache):
    """Over the real Redis, three workers (each its own ``SharedBackoff``) under a pace of 4
    a second: in each quarter of a second one of them gets the turn, the others are told to
    wait until the next quarter."""
    clock = FakeClock()
    redis_cache.set(PACE_KEY, (4.0, clock.now))
    workers = [SharedBackoff("redis", clock=clock) for _ in range(3)]
    for backoff in workers:
        assert backoff.wait() == 0 and backoff.pace() == 4.0
    turns = []
    for _ in range(4):
        waits = [backoff.slot() for backoff in workers]
        turns.append(sum(1 for w in waits if w == 0))
        assert all(0 < w <= 0.25 + 0.025 for w in waits if w)
        clock.now += 0.25
    assert turns == [1, 1, 1, 1]


@pytest.mark.parametrize(
    ("knobs", "error_id"),
    [
        ({"SHARED_BACKOFF": "yes"}, "E030"),
        ({"BACKOFF_CACHE": 3}, "E031"),
        ({"BACKOFF_CACHE": "nope"}, "E023"),
        ({"BACKOFF_REFRESH": -1}, "E032"),
        ({"BACKOFF_FAILURE_RUN": 0}, "E032"),
        ({"PACE_DOUBLING": -1}, "E032"),
        ({"PACE_DOUBLING": "5"}, "E032"),
    ],
)
def test_bad_backoff_settings_fail_the_checks(settings, knobs, error_id):
    settings.BILLING = {**settings.BILLING, **knobs}
    with pytest.raises(SystemCheckError, match=f"billing_integration.{error_id}"):
        call_command("check")
