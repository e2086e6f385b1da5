"""Deadlines of calls a person waits on: attempts, waits, and each attempt's timeouts end by
the deadline; background calls keep the patient policy. No wall-clock assertions: a fake clock
and a fake sleep drive the retry loop, and the timeouts handed to the transport are recorded."""

from __future__ import annotations

import json

import pytest
import requests

from billing_integration.client import BillingClient, RetryPolicy
from billing_integration.client.retry import MIN_ATTEMPT, Deadline
from billing_integration.exceptions import (
    BillingRateLimitError,
    BillingServerError,
    BillingTransportError,
)

pytestmark = pytest.mark.django_db

TOKEN = {"access_token": "tok", "expires_in": 300}


def parts(timeout) -> tuple[float, float, float | None]:
    """``(connect, read, total)`` of a timeout handed to the transport: a ``(connect, read)``
    tuple (background calls) or a urllib3 ``Timeout`` (calls with a deadline)."""
    if isinstance(timeout, tuple):
        return (*timeout, None)
    return (timeout.connect_timeout, timeout.read_timeout, timeout.total)


class FakeClock:
    """A monotonic clock that moves only when the code sleeps or a request "takes" time."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class FakeSession:
    """Stands in for ``requests.Session``: records (operation, timeout, time left) per request;
    billing calls answer from ``answers`` (status, headers, seconds taken), tokens answer 200
    unless ``token_answers`` says otherwise. A ``"hang"`` answer, or one slower than the read
    timeout, takes the whole read timeout and raises ``requests.Timeout``."""

    def __init__(self, clock: FakeClock, answers: list, token_answers: list | None = None):
        self.clock = clock
        self.answers = list(answers)
        self.token_answers = list(token_answers or [])
        self.calls: list[dict] = []
        self.deadline: Deadline | None = None

    def request(self, method, url, data=None, headers=None, params=None, timeout=None, **kw):
        is_token = "openid-connect/token" in url
        connect, read, total = parts(timeout)
        self.calls.append(
            {
                "token": is_token,
                "timeout": (connect, read),
                "total": total,
                "left": self.deadline.remaining() if self.deadline else None,
            }
        )
        queue = self.token_answers if is_token else self.answers
        answer = queue.pop(0) if queue else (200, {}, 0.0)
        if answer == "hang":
            self.clock.now += read
            raise requests.Timeout("read timed out")
        status, extra_headers, took = answer
        if took > read:  # the transport gives up at its read timeout
            self.clock.now += read
            raise requests.Timeout("read timed out")
        self.clock.now += took
        response = requests.Response()
        response.status_code = status
        response.headers.update(extra_headers)
        body = TOKEN if is_token and status == 200 else {"data": {"id": "x"}}
        if status >= 400:
            body = {"errors": [{"message": "down"}]}
        response._content = json.dumps(body).encode()
        return response

    def close(self) -> None:
        pass


def make_client(answers, token_answers=None, *, max_retries=4, retry_after_max=60.0):
    clock = FakeClock()
    session = FakeSession(clock, answers, token_answers)
    client = BillingClient(
        base_url="http://billing.test",
        auth_url="http://auth.test",
        checkout_url="http://pay.test",
        client_id="id",
        client_secret="secret",
        session=session,
        retry=RetryPolicy(
            max_retries=max_retries,
            backoff_base=0.5,
            backoff_max=20.0,
            retry_after_max=retry_after_max,
        ),
        timeout=(5.0, 30.0),
        sleep=clock.sleep,
    )
    return client, clock, session


@pytest.fixture(autouse=True)
def fresh_token_cache():
    from django.core.cache import caches

    caches["default"].clear()


def test_latency_over_http_is_cut_by_the_deadline(billing_sandbox):
    """A slow service: the attempt's read timeout is the time left, so the call fails in time
    instead of waiting for the answer (the timeouts the transport got are asserted)."""
    client = BillingClient(sleep=lambda s: None)
    client.tokens.get()
    seen: list = []
    real = client.session.request

    def spy(*args, **kwargs):
        seen.append(kwargs["timeout"])
        return real(*args, **kwargs)

    client.session.request = spy
    billing_sandbox.faults(operation="list_products", latency=1.5)
    with pytest.raises(BillingTransportError):
        list(client.list_products(deadline=0.6))
    [(connect, read, total)] = [parts(t) for t in seen]
    assert read <= 0.6 and connect <= 0.6 and total <= 0.6


def test_retry_after_beyond_the_deadline_gives_up_at_once():
    client, clock, session = make_client([(503, {"Retry-After": "30"}, 0.0)] * 10)
    deadline = Deadline(8, clock=clock)
    session.deadline = deadline
    with pytest.raises(BillingServerError):
        client.create_customer({"identifier": "a"}, deadline=deadline)
    billing = [c for c in session.calls if not c["token"]]
    assert len(billing) == 1
    assert clock.sleeps == []


def test_background_call_keeps_the_patient_policy():
    client, clock, session = make_client([(503, {"Retry-After": "30"}, 0.0)] * 10)
    with pytest.raises(BillingServerError):
        client.create_customer({"identifier": "a"})
    assert len([c for c in session.calls if not c["token"]]) == 5  # 1 + MAX_RETRIES
    assert clock.sleeps == [30.0] * 4
    assert all(c["timeout"] == (5.0, 30.0) for c in session.calls)


def test_slow_service_attempts_and_timeouts_end_by_the_deadline():
    """Every attempt hangs until its read timeout: the first is cut to the deadline, and no
    second one starts because no time is left."""
    client, clock, session = make_client(["hang"] * 10)
    deadline = Deadline(8, clock=clock)
    session.deadline = deadline
    start = clock.now
    with pytest.raises(BillingTransportError):
        client.create_checkout_session({"customer": "c"}, idempotency_key="k", deadline=deadline)
    billing = [c for c in session.calls if not c["token"]]
    assert len(billing) == 1
    assert billing[0]["timeout"] == (5.0, 8.0)
    assert clock.now - start <= 8.0


def test_retries_fit_in_the_deadline_and_each_timeout_is_the_time_left():
    """503s that each take 2 s: retries go on while another attempt fits, every attempt's
    connect and read timeouts are at most the time left (a late one times out), and the total
    stays within 8 s."""
    client, clock, session = make_client([(503, {}, 2.0)] * 10)
    deadline = Deadline(8, clock=clock)
    session.deadline = deadline
    start = clock.now
    with pytest.raises((BillingServerError, BillingTransportError)):
        client.create_customer({"identifier": "a"}, deadline=deadline)
    billing = [c for c in session.calls if not c["token"]]
    assert 2 <= len(billing) <= 5
    for call in billing:
        connect, read = call["timeout"]
        assert connect <= min(5.0, call["left"]) and read <= call["left"]
        assert call["left"] >= MIN_ATTEMPT
    assert clock.now - start <= 8.0


def test_connect_and_read_together_end_by_the_deadline():
    """Each attempt's timeout also has a ``total`` (connect and read together) of the time
    left: with a (connect, read) pair alone a slow connect plus a read cut to the time left
    could outlast the deadline by the connect time."""
    client, clock, session = make_client([(503, {}, 2.0)] * 10)
    deadline = Deadline(8, clock=clock)
    session.deadline = deadline
    with pytest.raises((BillingServerError, BillingTransportError)):
        client.create_customer({"identifier": "a"}, deadline=deadline)
    calls = session.calls  # the token fetch too
    assert len(calls) >= 3
    for call in calls:
        assert call["total"] is not None and call["total"] == pytest.approx(call["left"])


def test_no_attempt_without_time_left():
    client, clock, session = make_client([(200, {}, 0.0)])
    deadline = Deadline(8, clock=clock)
    clock.now += 8
    with pytest.raises(BillingTransportError, match="deadline"):
        client.create_customer({"identifier": "a"}, deadline=deadline)
    assert session.calls == []


def test_token_fetch_keeps_the_callers_deadline():
    """The service is down for the token too: the fetch gives up with the call's deadline
    instead of the background policy's four Retry-After waits."""
    client, clock, session = make_client(
        [(200, {}, 0.0)], token_answers=[(503, {"Retry-After": "30"}, 0.0)] * 10
    )
    deadline = Deadline(8, clock=clock)
    with pytest.raises(BillingServerError):
        client.create_customer({"identifier": "a"}, deadline=deadline)
    assert [c["token"] for c in session.calls] == [True]
    assert clock.sleeps == []


def test_rate_limit_within_the_deadline_is_waited_for():
    client, clock, _session = make_client([(429, {"Retry-After": "2"}, 0.0), (200, {}, 0.0)])
    deadline = Deadline(8, clock=clock)
    assert client.create_customer({"identifier": "a"}, deadline=deadline) == {"id": "x"}
    assert clock.sleeps == [2.0]


def test_rate_limit_beyond_the_deadline_is_not():
    client, clock, _session = make_client([(429, {"Retry-After": "9"}, 0.0), (200, {}, 0.0)])
    with pytest.raises(BillingRateLimitError):
        client.create_customer({"identifier": "a"}, deadline=Deadline(8, clock=clock))
    assert clock.sleeps == []


def test_with_deadline_shares_one_deadline_across_calls_and_pages():
    client, clock, session = make_client([(200, {}, 3.0)] * 10)
    deadline = Deadline(8, clock=clock)
    bound = client.with_deadline(deadline)
    assert bound.session is client.session and bound.tokens is client.tokens
    assert client.deadline is None
    bound.get_product("p1")  # takes 3 s of the 8
    bound.get_product("p2")  # 3 s more
    with pytest.raises(BillingTransportError, match="timed out"):
        bound.get_product("p3")  # starts with 2 s left: cut to that, it times out
    with pytest.raises(BillingTransportError, match="deadline"):
        bound.get_product("p4")  # nothing left: not sent
    timeouts = [c["timeout"] for c in session.calls if not c["token"]]
    assert timeouts == [(5.0, 8.0), (5.0, 5.0), (2.0, 2.0)]


def test_deadline_in_seconds_starts_at_the_call():
    client, _clock, session = make_client([(200, {}, 0.0)])
    client.get_product("p", deadline=3)
    [(connect, read)] = [c["timeout"] for c in session.calls if not c["token"]]
    assert 2.5 < connect <= 3.0 and 2.5 < read <= 3.0


# --- over real HTTP: the sandbox's faults ---------------------------------------------------
def test_outage_over_http_one_attempt_and_no_wait(billing_sandbox):
    """The sandbox's outage answers 503 with a Retry-After of the outage's length: a call with
    a deadline asks once and gives up, without sleeping."""
    waits: list[float] = []
    client = BillingClient(sleep=waits.append)
    client.tokens.get()  # a token first: the outage covers the token endpoint too
    billing_sandbox.faults(outage_seconds=30)
    with pytest.raises(BillingServerError):
        client.create_customer(
            {"identifier": "x", "first_name": "", "last_name": "", "email": ""}, deadline=8
        )
    assert len(billing_sandbox.requests(operation="create_customer")) == 1
    assert waits == []
