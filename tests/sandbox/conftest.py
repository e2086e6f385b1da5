"""Fixtures for the sandbox tests: an API client speaking plain HTTP, and object factories.

The ``billing_sandbox`` fixture comes from the ``billing_integration.testing`` plugin (the
``pytest11`` entry point of the installed package; ``make test`` installs it).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
import requests

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
TS_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


class Api:
    """A bare client: token in x-kc-token, a fresh idempotency key unless given."""

    def __init__(self, sandbox: Any) -> None:
        self.sandbox = sandbox
        self.base = sandbox.api_url
        self.http = requests.Session()
        self.token = sandbox.token()

    def headers(self, key: str | None = None, **extra: str) -> dict[str, str]:
        headers = {"x-kc-token": self.token, "Accept": "application/json"}
        if key is not None:
            headers["x-idempotency-id"] = key
        headers.update(extra)
        return headers

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("headers", self.headers())
        kwargs.setdefault("timeout", 10)
        return self.http.get(self.base + path, **kwargs)

    def post(self, path: str, body: Any, key: str | None = None, **kwargs: Any):
        kwargs.setdefault("headers", self.headers(key or str(uuid.uuid4())))
        kwargs.setdefault("timeout", 10)
        return self.http.post(self.base + path, json=body, **kwargs)

    def patch(self, path: str, body: Any, key: str | None = None, **kwargs: Any):
        kwargs.setdefault("headers", self.headers(key or str(uuid.uuid4())))
        kwargs.setdefault("timeout", 10)
        return self.http.patch(self.base + path, json=body, **kwargs)

    # -- factories -----------------------------------------------------------------------
    def product(self, **overrides: Any) -> dict[str, Any]:
        body = product_body(**overrides)
        response = self.post("/products", body)
        assert response.status_code == 200, response.text
        return response.json()["data"]

    def customer(self, identifier: str = "user-1", **overrides: Any) -> dict[str, Any]:
        body = {
            "identifier": identifier,
            "first_name": "Ada",
            "last_name": "Lovelace",
            "email": "ada@example.com",
            **overrides,
        }
        response = self.post("/customers", body)
        assert response.status_code == 200, response.text
        return response.json()["data"]

    def session(self, customer: dict, product: dict, **overrides: Any) -> dict[str, Any]:
        body = {
            "customer": customer["id"],
            "product": product["id"],
            "selected_currency": 1,
            "selected_billing_cycle": "months-1",
            "action": "new_subscription",
            **overrides,
        }
        response = self.post("/checkout_sessions", body)
        assert response.status_code == 200, response.text
        return response.json()["data"]


def product_body(**overrides: Any) -> dict[str, Any]:
    body = {
        "name": "Pro plan",
        "description": "Everything",
        "status": "published",
        "selected_currencies": ["1", "2"],
        "subscription_blueprint": {
            "billing_type": "flat-rate",
            "billing_cycles": [
                {
                    "cycle": "months",
                    "frequency": 1,
                    "prices": [{"currency": 1, "amount": 5000}, {"currency": 2, "amount": 9.5}],
                },
                {"cycle": "years", "frequency": 1, "prices": [{"currency": 1, "amount": 50000}]},
            ],
        },
    }
    body.update(overrides)
    return body


@pytest.fixture
def sandbox(billing_sandbox: Any) -> Any:
    return billing_sandbox


@pytest.fixture
def api(sandbox: Any) -> Api:
    return Api(sandbox)
