"""A create answered 2xx but without the new object's id (``{"data": {}}``, ``{"data": []}``,
``{"data": null}``, an empty body, a proxy's 502) was probably applied: the client resends it
with the same idempotency key until an answer names the object."""

import json

import pytest
import responses
from django.core.cache import caches

from billing_integration.client import BillingClient, RetryPolicy

pytestmark = pytest.mark.django_db

AUTH_URL = "http://auth.test/realms/sandbox/protocol/openid-connect/token"
API = "http://billing.test/v1/api/billing"
CREATES = [
    ("create_product", "/products", {"id": "p1"}),
    ("create_customer", "/customers", {"id": "c1"}),
    ("create_subscription", "/subscriptions", [{"id": "s1"}]),
    ("create_checkout_session", "/checkout_sessions", {"id": "cs1"}),
]
LOST = [
    {"json": {"data": {"name": "no id"}}},
    {"json": {"data": []}},
    {"json": {"data": None}},
    {"body": ""},
    {"status": 502, "body": "<html>Bad gateway</html>"},
]


@pytest.mark.parametrize(("operation", "path", "answer"), CREATES)
@pytest.mark.parametrize("lost", LOST)
@responses.activate
def test_a_create_answered_without_its_id_is_resent_with_the_same_key(
    operation, path, answer, lost
):
    caches["default"].clear()
    responses.post(AUTH_URL, json={"access_token": "t", "expires_in": 300})
    responses.post(API + path, **lost)
    responses.post(API + path, json={"data": answer})
    client = BillingClient(
        base_url="http://billing.test",
        auth_url="http://auth.test",
        client_id="app",
        client_secret="s",
        retry=RetryPolicy(max_retries=2),
        sleep=lambda seconds: None,
    )
    created = getattr(client, operation)({"name": "x"})
    assert created["id"] == (answer[0] if isinstance(answer, list) else answer)["id"]
    sent = [c.request for c in responses.calls if c.request.url == API + path]
    assert len(sent) == 2
    assert len({r.headers["x-idempotency-id"] for r in sent}) == 1
    assert json.loads(sent[0].body) == json.loads(sent[1].body)


@responses.activate
def test_an_update_answered_without_an_id_is_taken_as_answered():
    """An update names its object already: its answer is not read for an id."""
    caches["default"].clear()
    responses.post(AUTH_URL, json={"access_token": "t", "expires_in": 300})
    responses.patch(API + "/products/p1", json={"data": {"name": "y"}})
    client = BillingClient(
        base_url="http://billing.test",
        auth_url="http://auth.test",
        client_id="app",
        client_secret="s",
        retry=RetryPolicy(max_retries=0),
    )
    assert client.update_product("p1", {"name": "y"}) == {"name": "y"}


WRITES = [
    ("create_product", "POST", "/products", ({"name": "x"},)),
    ("update_product", "PATCH", "/products/p1", ("p1", {"name": "x"})),
    ("create_customer", "POST", "/customers", ({"identifier": "x"},)),
    ("create_subscription", "POST", "/subscriptions", ({"customer": "c1"},)),
    ("update_subscription", "PATCH", "/subscriptions/s1", ("s1", {"auto_renew": False})),
    ("create_checkout_session", "POST", "/checkout_sessions", ({"customer": "c1"},)),
]
FAILURES = [
    {"status": 429},
    {"status": 429, "headers": {"Retry-After": "1"}},
    {"status": 503},
    {"status": 401, "json": {"errors": [{"message": "Token expired."}]}},
]


@pytest.mark.parametrize(("operation", "method", "path", "args"), WRITES)
@pytest.mark.parametrize("failure", FAILURES)
@responses.activate
def test_every_write_resends_its_key_after_a_failure_and_a_new_write_has_a_new_one(
    operation, method, path, args, failure
):
    """A 429 (with or without ``Retry-After``), a 5xx or an expired token (a new token, then
    the resend) keep the write's key; the next write, another change, gets another key."""
    caches["default"].clear()
    responses.post(AUTH_URL, json={"access_token": "t", "expires_in": 300})
    responses.add(method, API + path, **failure)
    responses.add(method, API + path, json={"data": {"id": "x1"}})
    responses.add(method, API + path, json={"data": {"id": "x2"}})
    client = BillingClient(
        base_url="http://billing.test",
        auth_url="http://auth.test",
        client_id="app",
        client_secret="s",
        retry=RetryPolicy(max_retries=2, retry_after_max=0),
        sleep=lambda seconds: None,
    )
    assert getattr(client, operation)(*args)["id"] == "x1"
    assert getattr(client, operation)(*args)["id"] == "x2"
    sent = [c.request for c in responses.calls if c.request.url == API + path]
    keys = [r.headers["x-idempotency-id"] for r in sent]
    assert len(keys) == 3 and keys[0] == keys[1] != keys[2]
    tokens = [c for c in responses.calls if c.request.url == AUTH_URL]
    assert len(tokens) == (2 if failure["status"] == 401 else 1)
