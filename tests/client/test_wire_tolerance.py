"""The client against answers the interface says nothing about (redirects, odd token answers,
204s, bodies in other shapes): a clear error of the package's tree, nothing sent twice, no
secret sent or shown anywhere else."""

import logging

import pytest
import responses
from django.core.cache import caches

from billing_integration.client import BillingClient, RetryPolicy
from billing_integration.exceptions import BillingAPIError, BillingError

pytestmark = pytest.mark.django_db

SECRET = "cl1ent-S3cret"
TOKEN = "opaque-ACCESS-token-0123456789abcdef"
AUTH_URL = "http://auth.test/realms/sandbox/protocol/openid-connect/token"
API = "http://billing.test/v1/api/billing"


@pytest.fixture(autouse=True)
def no_shared_token():
    caches["default"].clear()


def make_client(**kwargs) -> BillingClient:
    kwargs.setdefault("retry", RetryPolicy(max_retries=2))
    return BillingClient(
        base_url="http://billing.test",
        auth_url="http://auth.test",
        checkout_url="http://pay.test",
        client_id="app",
        client_secret=SECRET,
        sleep=lambda seconds: None,
        **kwargs,
    )


def to_elsewhere() -> list:
    return [c.request for c in responses.calls if "elsewhere.test" in c.request.url]


@pytest.mark.parametrize("status", [301, 302, 307, 308])
@responses.activate
def test_a_redirected_call_is_not_followed_with_the_token(status, caplog):
    caplog.set_level(logging.DEBUG)
    responses.post(AUTH_URL, json={"access_token": TOKEN, "expires_in": 300})
    location = "http://elsewhere.test/v1/api/billing/products"
    responses.post(API + "/products", status=status, headers={"Location": location})
    responses.post(location, json={"data": {"id": "p1"}})
    responses.get(location, json={"data": [{"id": "p1"}]})
    with pytest.raises(BillingAPIError) as info:
        make_client().create_product({"name": "x"})
    assert not to_elsewhere()
    assert not info.value.retryable and info.value.status == status
    assert location in str(info.value)
    assert len([c for c in responses.calls if c.request.url == API + "/products"]) == 1
    assert TOKEN not in str(info.value) + repr(info.value) + caplog.text


@pytest.mark.parametrize("status", [301, 302, 307, 308])
@responses.activate
def test_a_redirected_token_call_does_not_send_the_secret_on(status):
    location = "http://elsewhere.test/token"
    responses.post(AUTH_URL, status=status, headers={"Location": location})
    responses.post(location, json={"access_token": TOKEN, "expires_in": 300})
    responses.get(location, json={"access_token": TOKEN, "expires_in": 300})
    with pytest.raises(BillingError) as info:
        make_client().get_product("p1")
    assert not to_elsewhere()
    assert info.value.operation == "token" and location in str(info.value)
    assert SECRET not in str(info.value)
