"""The client against the sandbox over real HTTP, asserting what the sandbox received."""

import logging
import re
import threading
import time
import uuid

import pytest
from django.core.cache import cache

from billing_integration.client import BillingClient, RetryPolicy, SharedBackoff, get_client
from billing_integration.exceptions import (
    BillingAuthenticationError,
    BillingIdempotencyConflict,
    BillingNotFoundError,
    BillingServerError,
    BillingTransportError,
    BillingValidationError,
)

pytestmark = pytest.mark.django_db

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

PRODUCT = {
    "status": "published",
    "name": "Pro",
    "description": "Pro plan",
    "selected_currencies": ["1"],
    "subscription_blueprint": {
        "billing_type": "flat-rate",
        "billing_cycles": [
            {"cycle": "months", "frequency": 1, "prices": [{"currency": 1, "amount": 5000}]}
        ],
    },
}


def fast_client(**kwargs) -> BillingClient:
    """A client that does not really sleep between retries, recording the waits; its shared
    backoff reads a clock its sleeps move on."""
    waits: list[float] = []
    now = [time.time()]

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    kwargs.setdefault("backoff", SharedBackoff(clock=lambda: now[0]))
    client = BillingClient(
        retry=RetryPolicy(max_retries=3, backoff_base=0.01, backoff_max=0.05, retry_after_max=5),
        sleep=sleep,
        **kwargs,
    )
    client.waits = waits
    return client


def headers_of(entry) -> dict:
    return {k.lower(): v for k, v in entry["headers"].items()}


def test_headers_on_the_wire(billing_sandbox):
    client = get_client()
    product = client.create_product(PRODUCT)
    assert UUID_RE.match(product["id"])
    assert client.get_product(product["id"])["name"] == "Pro"
    client.update_product(product["id"], {"description": "Changed"})
    list(client.list_products())

    token_calls = billing_sandbox.requests(operation="token")
    assert len(token_calls) == 1
    token_call = token_calls[0]
    assert headers_of(token_call)["content-type"] == "application/x-www-form-urlencoded"
    assert token_call["body"] == {
        "grant_type": "client_credentials",
        "client_id": billing_sandbox.client_id,
        "client_secret": billing_sandbox.client_secret,
    }
    assert token_call["path"].endswith("/realms/sandbox/protocol/openid-connect/token")

    billing_calls = [r for r in billing_sandbox.requests() if r["operation"] != "token"]
    assert [r["operation"] for r in billing_calls] == [
        "create_product",
        "get_product",
        "update_product",
        "list_products",
        "list_products",  # the empty page that ends the list
    ]
    for call in billing_calls:
        h = headers_of(call)
        assert call["path"].startswith("/v1/api/billing/")
        assert h["accept"] == "application/json"
        assert h["content-type"] == "application/json"
        assert h["x-kc-token"]
        assert "authorization" not in h
        if call["method"] in ("POST", "PATCH"):
            assert UUID_RE.match(h["x-idempotency-id"])
        else:
            assert "x-idempotency-id" not in h


@pytest.mark.parametrize("amount", [float("nan"), float("inf"), float("-inf")])
def test_a_body_that_is_not_json_is_never_sent(billing_sandbox, amount):
    """NaN and infinity are not JSON: the client refuses to write them, nothing is sent."""
    one_time = {**PRODUCT, "prices": [{"currency": 1, "amount": amount}]}
    del one_time["subscription_blueprint"]
    client = get_client()
    with pytest.raises(ValueError):
        client.create_product(one_time)
    with pytest.raises(ValueError):
        client.raw("POST", "/products", token=client.tokens.get(), payload=one_time)
    assert billing_sandbox.requests(operation="create_product") == []


def test_one_token_for_many_calls(billing_sandbox):
    client = get_client()
    for _ in range(20):
        client.create_customer(
            {"identifier": str(uuid.uuid4()), "first_name": "A", "last_name": "B", "email": "a@b.c"}
        )
    assert len(billing_sandbox.requests(operation="token")) == 1
    assert len(billing_sandbox.requests(operation="create_customer")) == 20


def test_token_shared_between_clients_through_the_cache(billing_sandbox):
    # Two clients stand for two processes: they share the token through Django's cache.
    BillingClient().create_customer(
        {"identifier": "1", "first_name": "a", "last_name": "b", "email": "e@x.y"}
    )
    BillingClient().create_customer(
        {"identifier": "2", "first_name": "a", "last_name": "b", "email": "e@x.y"}
    )
    assert len(billing_sandbox.requests(operation="token")) == 1


def test_single_flight_under_concurrency(billing_sandbox, settings):
    if "DatabaseCache" in settings.CACHES["default"]["BACKEND"]:
        # Threads cannot see the test's uncommitted cache rows; a process-wide cache stands in
        # (CI runs this against Redis through CACHE_URL).
        settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
        cache.clear()  # LocMemCache storage outlives settings changes: start empty
    billing_sandbox.faults(operation="token", latency=0.3)
    clients = [BillingClient() for _ in range(6)]
    errors = []

    def work(client):
        try:
            list(client.list_products())
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(billing_sandbox.requests(operation="token")) == 1


def test_refresh_ahead_of_expiry(billing_sandbox):
    billing_sandbox.config(token_lifetime=10)  # refreshed once tokens.REFRESH_RATIO (0.8) passed
    client = get_client()
    list(client.list_products())
    token = client.tokens._local
    assert 7.5 <= token.refresh_at - (token.expires_at - 10) <= 8.5
    # Pretend 80% of the lifetime has passed: the next call fetches a new token first.
    cached = cache.get(client.tokens._key)
    cached["refresh_at"] = 0
    cache.set(client.tokens._key, cached)
    client.tokens._local = None
    list(client.list_products())
    assert len(billing_sandbox.requests(operation="token")) == 2
    calls = [r for r in billing_sandbox.requests() if r["operation"] == "list_products"]
    assert headers_of(calls[0])["x-kc-token"] != headers_of(calls[1])["x-kc-token"]


def test_401_refetches_once_then_succeeds(billing_sandbox):
    client = get_client()
    list(client.list_products())
    billing_sandbox.revoke_tokens()
    list(client.list_products())
    assert len(billing_sandbox.requests(operation="token")) == 2
    assert [r["status"] for r in billing_sandbox.requests(operation="list_products")] == [
        200,
        401,
        200,
    ]


def test_401_twice_is_an_authentication_error(billing_sandbox):
    client = get_client()
    billing_sandbox.faults(operation="list_products", status=401, count=5)
    with pytest.raises(BillingAuthenticationError):
        list(client.list_products())
    assert len(billing_sandbox.requests(operation="list_products")) == 2
    assert len(billing_sandbox.requests(operation="token")) == 2


def test_403_drops_the_token_without_retrying_the_call(billing_sandbox):
    """A revoked or re-scoped token may answer 403: the call fails (not resent), and the next
    call fetches a new token."""
    client = get_client()
    list(client.list_products())
    billing_sandbox.faults(operation="list_products", status=403, count=1)
    with pytest.raises(BillingAuthenticationError) as info:
        list(client.list_products())
    assert info.value.status == 403
    assert len(billing_sandbox.requests(operation="token")) == 1  # no fetch, no loop
    list(client.list_products())
    assert len(billing_sandbox.requests(operation="token")) == 2
    calls = billing_sandbox.requests(operation="list_products")
    assert [c["status"] for c in calls] == [200, 403, 200]
    tokens = [headers_of(c)["x-kc-token"] for c in calls]
    assert tokens[0] == tokens[1] != tokens[2]


def test_wrong_credentials(billing_sandbox, settings):
    settings.BILLING = {**settings.BILLING, "CLIENT_SECRET": "wrong-secret-value"}
    with pytest.raises(BillingAuthenticationError) as info:
        list(get_client().list_products())
    assert "wrong-secret-value" not in str(info.value)
    assert len(billing_sandbox.requests(operation="token")) == 1


def test_retry_after_is_honoured_and_key_reused(billing_sandbox):
    client = fast_client()
    billing_sandbox.faults(operation="create_product", status=429, retry_after=2, count=2)
    product = client.create_product(PRODUCT)
    calls = billing_sandbox.requests(operation="create_product")
    assert [c["status"] for c in calls] == [429, 429, 200]
    assert client.waits == [2.0, 2.0]
    keys = {headers_of(c)["x-idempotency-id"] for c in calls}
    assert len(keys) == 1
    assert [p["id"] for p in client.list_products()] == [product["id"]]


def test_5xx_retried_with_same_key_then_gives_up(billing_sandbox):
    client = fast_client()
    billing_sandbox.faults(operation="create_customer", status=503, count=10)
    with pytest.raises(BillingServerError) as info:
        client.create_customer(
            {"identifier": "x", "first_name": "a", "last_name": "b", "email": "e@x.y"}
        )
    assert info.value.status == 503
    calls = billing_sandbox.requests(operation="create_customer")
    assert len(calls) == 4  # first attempt + MAX_RETRIES (3)
    assert len({headers_of(c)["x-idempotency-id"] for c in calls}) == 1
    assert all(0 <= w <= 0.05 for w in client.waits) and len(client.waits) == 3


def test_caller_key_is_sent_and_replayed(billing_sandbox):
    client = get_client()
    key = str(uuid.uuid4())
    first = client.create_product(PRODUCT, idempotency_key=key)
    second = client.create_product(PRODUCT, idempotency_key=key)
    assert first["id"] == second["id"]
    assert len(list(client.list_products())) == 1
    with pytest.raises(BillingIdempotencyConflict):
        client.create_product({**PRODUCT, "name": "Other"}, idempotency_key=key)


def test_lost_response_retried_with_same_key_creates_one(billing_sandbox):
    client = fast_client()
    billing_sandbox.faults(operation="create_product", reset_after_commit_rate=1.0, count=1)
    product = client.create_product(PRODUCT)
    assert [p["id"] for p in client.list_products()] == [product["id"]]
    calls = billing_sandbox.requests(operation="create_product")
    assert len({headers_of(c)["x-idempotency-id"] for c in calls}) == 1


def test_timeout_is_retried(billing_sandbox):
    client = fast_client(timeout=(2.0, 0.5))
    billing_sandbox.faults(operation="list_customers", timeout_rate=1.0, timeout_seconds=2, count=1)
    assert list(client.list_customers()) == []
    assert len(client.waits) == 1


@pytest.mark.parametrize("status", [400, 404, 422])
def test_no_retry_on_client_errors(billing_sandbox, status):
    client = fast_client()
    billing_sandbox.faults(operation="get_product", status=status, count=5)
    with pytest.raises((BillingValidationError, BillingNotFoundError)):
        client.get_product(str(uuid.uuid4()))
    assert len(billing_sandbox.requests(operation="get_product")) == 1
    assert client.waits == []


def test_unknown_product_is_not_found(billing_sandbox):
    with pytest.raises(BillingNotFoundError) as info:
        get_client().get_product(str(uuid.uuid4()))
    assert info.value.status == 404 and info.value.operation == "get_product"


def test_paging_uses_limit_and_offset(billing_sandbox):
    billing_sandbox.seed(customers=25)
    client = BillingClient(page_size=10)
    pages = list(client.iter_pages("customers"))
    assert [len(p) for p in pages] == [10, 10, 5]
    queries = [r["query"] for r in billing_sandbox.requests(operation="list_customers")]
    # a short page does not end the list (a service may cap its pages): the empty one does
    assert [(q["limit"], q["offset"]) for q in queries] == [
        ("10", "0"),
        ("10", "10"),
        ("10", "20"),
        ("10", "25"),
    ]


def test_paging_terminates_when_server_ignores_parameters(billing_sandbox):
    billing_sandbox.seed(customers=25)
    billing_sandbox.faults(operation="list_customers", ignore_paging=True)
    client = BillingClient(page_size=10)
    ids = [c["id"] for c in client.list_customers()]
    assert len(ids) == 25 == len(set(ids))
    assert len(billing_sandbox.requests(operation="list_customers")) == 2


def test_create_subscription_unwraps_the_array(billing_sandbox):
    client = get_client()
    product = client.create_product(PRODUCT)
    customer = client.create_customer(
        {"identifier": "u1", "first_name": "a", "last_name": "b", "email": "e@x.y"}
    )
    sub = client.create_subscription(
        {
            "customer": customer["id"],
            "product": product["id"],
            "selected_currency": "XOF",
            "selected_billing_cycle": "months-1",
            "trial_end_date": "2030-01-01T00:00:00.000Z",
            "auto_renew": True,
        }
    )
    assert isinstance(sub, dict) and sub["customer"] == customer["id"]
    assert [s["id"] for s in client.list_subscriptions()] == [sub["id"]]


def test_checkout_url(billing_sandbox):
    client = get_client()
    assert client.checkout_url("abc") == f"{billing_sandbox.checkout_url}/checkout/abc"


def test_transport_error_when_server_is_down(settings):
    settings.BILLING = {
        **settings.BILLING,
        "BASE_URL": "http://127.0.0.1:9",
        "AUTH_URL": "http://127.0.0.1:9/auth",
        "CHECKOUT_URL": "http://127.0.0.1:9",
        "CLIENT_ID": "x",
        "CLIENT_SECRET": "y",
    }
    client = fast_client()
    with pytest.raises(BillingTransportError) as info:
        list(client.list_products())
    assert info.value.operation == "token"
    assert len(client.waits) == 3


def test_no_secret_or_token_in_logs_errors_or_repr(billing_sandbox, caplog, settings):
    caplog.set_level(logging.DEBUG, logger="billing_integration")
    client = fast_client()
    list(client.list_products())
    token = client.tokens._local.access_token
    billing_sandbox.faults(operation="create_product", status=500, count=10)
    with pytest.raises(BillingServerError) as info:
        client.create_product(PRODUCT)
    billing_sandbox.clear_faults()
    settings.BILLING = {**settings.BILLING, "CLIENT_SECRET": "wrong-" + "s3cr3t"}
    with pytest.raises(BillingAuthenticationError) as auth_info:
        list(BillingClient().list_products())
    secret = settings.BILLING["CLIENT_SECRET"]
    texts = [
        caplog.text,
        str(info.value),
        repr(info.value),
        str(auth_info.value),
        repr(client),
        repr(client.tokens),
        repr(client.tokens._local),
    ]
    for text in texts:
        assert token not in text
        assert secret not in text
        assert billing_sandbox.client_secret not in text
    assert "create_product" in caplog.text  # the log does say what happened


def test_the_retry_constants_are_read_at_each_call(billing_sandbox, monkeypatch):
    """Tests (and hosts) tune the retries by patching ``client.retry``'s constants; the
    process's client, already built, follows them at its next call."""
    from billing_integration.client import retry

    client = get_client()
    monkeypatch.setattr(retry, "MAX_RETRIES", 0)
    billing_sandbox.faults(operation="create_customer", status=503, count=10)
    with pytest.raises(BillingServerError):
        client.create_customer({"identifier": "x", "first_name": "", "last_name": "", "email": ""})
    assert len(billing_sandbox.requests(operation="create_customer")) == 1


def test_an_answer_nested_beyond_what_python_reads_is_a_lost_answer(billing_sandbox, monkeypatch):
    """A 200 whose JSON is nested deeper than Python's reader goes (``RecursionError``, which
    escaped the client) is an answer not read: ``BillingAnswerLostError``, retried as such."""
    from billing_integration.exceptions import BillingAnswerLostError

    client = fast_client()
    real = client.session.request
    deep = b'{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"

    def request(method, url, **kwargs):
        response = real(method, url, **kwargs)
        if "/customers" in url:
            response._content = deep
        return response

    monkeypatch.setattr(client.session, "request", request)
    with pytest.raises(BillingAnswerLostError, match="not JSON"):
        list(client.list_customers())
    assert len(billing_sandbox.requests(operation="list_customers")) == 4  # retried 3 times


def test_an_error_answer_nested_deeply_is_reported_cut(billing_sandbox, monkeypatch):
    """A 422 whose JSON Python reads but nests 600 levels: building the error (redacting the
    answer) raised ``RecursionError`` out of the client; the error keeps the first levels."""
    client = fast_client()
    real = client.session.request

    def request(method, url, **kwargs):
        response = real(method, url, **kwargs)
        if "/customers" in url:
            response.status_code = 422
            response._content = b'{"errors": ' + b"[" * 600 + b"]" * 600 + b"}"
        return response

    monkeypatch.setattr(client.session, "request", request)
    with pytest.raises(BillingValidationError, match="nested too deeply") as caught:
        client.create_customer({"identifier": "x", "first_name": "A", "last_name": "B"})
    assert caught.value.status == 422


def test_a_cache_alias_not_in_caches_refuses_calls_naming_the_key(billing_sandbox, settings):
    # Where the checks (E023) do not run, the missing alias was taken for a cache outage: each
    # process fetched its own token, a warning said "The connection 'nowhere' doesn't exist.".
    from billing_integration.exceptions import BillingConfigurationError

    settings.BILLING = {**settings.BILLING, "CACHE": "nowhere"}
    with pytest.raises(BillingConfigurationError) as info:
        BillingClient().get_product(str(uuid.uuid4()))
    assert info.value.setting == "BILLING['CACHE']"
    assert billing_sandbox.requests(operation="token") == []
