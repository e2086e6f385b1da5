"""The sandbox's dialects (behaviours the interface allows that the app's guesses do not
cover): each switches on and off, and the app works, or fails loudly, in each."""

from __future__ import annotations

import pytest
import requests

from billing_integration.client import BillingClient
from billing_integration.exceptions import BillingNotFoundError, BillingValidationError
from billing_integration.sandbox.config import DEFAULT_CURRENCIES, ISO_NUMERIC_CURRENCIES

PRODUCT = {
    "name": "Dialect plan",
    "status": "draft",
    "selected_currencies": ["1"],
    "subscription_blueprint": {
        "billing_type": "flat-rate",
        "billing_cycles": [
            {"cycle": "months", "frequency": 1, "prices": [{"currency": 1, "amount": 10}]}
        ],
    },
}


@pytest.fixture
def client(billing_sandbox, settings, db):
    return BillingClient(page_size=2)


def test_dialects_switch_on_and_off(billing_sandbox):
    assert billing_sandbox.dialects("currency_ids", "no_paging")["dialects"] == [
        "currency_ids",
        "no_paging",
    ]
    assert billing_sandbox.config()["currencies"] == {
        str(k): v for k, v in ISO_NUMERIC_CURRENCIES.items()
    }
    assert billing_sandbox.dialects()["currencies"] == {
        str(k): v for k, v in DEFAULT_CURRENCIES.items()
    }
    answer = requests.post(
        billing_sandbox.url + "/_sandbox/config", json={"dialects": ["klingon"]}, timeout=10
    )
    assert answer.status_code == 400 and "klingon" in answer.text
    assert billing_sandbox.config()["dialects"] == []


def test_no_paging_the_app_reads_each_item_once(billing_sandbox, client):
    billing_sandbox.dialects("no_paging")
    billing_sandbox.seed(customers=5)
    ids = [c["id"] for c in client.list_customers()]
    assert len(ids) == len(set(ids)) == 5
    pages = billing_sandbox.requests("list_customers")
    assert [r["query"] for r in pages] == [
        {"limit": "2", "offset": "0"},
        {"limit": "2", "offset": "5"},
    ]


def test_other_currency_ids_fail_loudly(billing_sandbox, client):
    billing_sandbox.dialects("currency_ids")
    with pytest.raises(BillingValidationError, match="Unknown currency id 1") as refused:
        client.create_product(PRODUCT)
    assert refused.value.status == 400
    assert billing_sandbox.objects("product") == []


def test_another_error_shape_is_still_quoted(billing_sandbox, client):
    billing_sandbox.dialects("error_shape")
    with pytest.raises(BillingNotFoundError, match="not found") as missing:
        client.get_product("00000000-0000-4000-8000-000000000000")
    assert missing.value.body["statusCode"] == 404 and missing.value.body["error"] == "not_found"


def test_expires_in_in_milliseconds_the_app_still_calls(billing_sandbox, client):
    billing_sandbox.dialects("expires_in_ms")
    assert client.raw_token().body["expires_in"] == 300_000
    assert list(client.list_products()) == []
    assert [r["status"] for r in billing_sandbox.requests("list_products")] == [200]


def test_a_refused_status_move_fails_loudly(billing_sandbox, client):
    billing_sandbox.dialects("refuse_draft_archive")
    product = client.create_product(PRODUCT)
    with pytest.raises(BillingValidationError, match="cannot become archived") as refused:
        client.update_product(product["id"], {"status": "archived"})
    assert refused.value.body["errors"][0]["code"] == "invalid_transition"
    assert billing_sandbox.object("product", product["id"])["status"] == "draft"
    published = client.update_product(product["id"], {"status": "published"})
    assert client.update_product(published["id"], {"status": "archived"})["status"] == "archived"


@pytest.mark.parametrize(
    ("dialect", "written"),
    [
        ("events_upper", "SUBSCRIPTION_RENEWAL"),
        ("events_past", "subscription.renewed"),
        ("events_prefixed", "billing.subscription.renewal"),
    ],
)
def test_event_type_styles(billing_sandbox, dialect, written):
    billing_sandbox.dialects(dialect)
    billing_sandbox.seed(customers=1, subscriptions=1)
    subscription = billing_sandbox.objects("subscription")[0]["id"]
    assert billing_sandbox.trigger("subscription.renewal", subscription)["type"] == written
