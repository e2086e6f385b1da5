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
