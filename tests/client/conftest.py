"""Helpers of the client tests: a client of the test hosts, and a cache with no token in it."""

from __future__ import annotations

import pytest
from django.core.cache import caches

from billing_integration.client import BillingClient

TOKEN = "opaque-ACCESS-token-0123456789abcdef"
AUTH_URL = "http://auth.test/realms/sandbox/protocol/openid-connect/token"


@pytest.fixture
def no_shared_token():
    """Each test fetches its own token: none is left in the shared cache by an earlier test."""
    caches["default"].clear()


def sandbox_client(secret: str, **kwargs) -> BillingClient:
    """A client of the test hosts (billing, auth, pay .test) that never sleeps between tries."""
    return BillingClient(
        base_url="http://billing.test",
        auth_url="http://auth.test",
        checkout_url="http://pay.test",
        client_id="app",
        client_secret=secret,
        sleep=lambda seconds: None,
        **kwargs,
    )
