"""The DRF endpoints against the sandbox over HTTP."""

from __future__ import annotations

import base64

import pytest
from django.urls import reverse

from billing_integration.models import CheckoutSession, Customer

pytestmark = pytest.mark.django_db(transaction=True)

SESSIONS = "/billing/api/checkout-sessions/"
SUBSCRIPTIONS = "/billing/api/subscriptions/"


def test_url_names():
    assert reverse("billing_integration:api_checkout_sessions") == SESSIONS
    assert reverse("billing_integration:api_subscriptions") == SUBSCRIPTIONS


def test_create_checkout_session(billing_sandbox, product, logged_in):
    response = logged_in.post(
        SESSIONS,
        {"product": str(product.pk), "cycle": "months-1", "currency": "XOF"},
        content_type="application/json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    session = CheckoutSession.objects.get()
    assert set(body) == {"id", "url", "expires_at"}
    assert body["id"] == str(session.remote_id)
    assert body["url"] == f"{billing_sandbox.checkout_url}/checkout/{session.remote_id}"
    assert body["expires_at"]
    [call] = billing_sandbox.requests(operation="create_checkout_session")
    assert call["body"]["selected_currency"] == 1
    assert call["body"]["product"] == str(product.remote_id)


def test_create_by_remote_id_with_basic_auth(billing_sandbox, product, client, user):
    auth = "Basic " + base64.b64encode(b"alice:pw-for-tests").decode()
    response = client.post(
        SESSIONS,
        {"product": str(product.remote_id), "cycle": "years-1", "currency": 1},
        content_type="application/json",
        HTTP_AUTHORIZATION=auth,
    )
    assert response.status_code == 201, response.content
    body = billing_sandbox.requests(operation="create_checkout_session")[0]["body"]
    assert body["selected_billing_cycle"] == "years-1"


@pytest.mark.parametrize(
    "payload,status,code",
    [
        ({"product": "1", "cycle": "weeks-1", "currency": "XOF"}, 400, "unknown_cycle"),
        ({"product": "1", "cycle": "months-1", "currency": "EUR"}, 400, "unknown_currency"),
        ({"product": "424242", "cycle": "months-1"}, 404, "product_not_found"),
    ],
)
def test_create_errors(billing_sandbox, product, logged_in, payload, status, code):
    payload = {
        **payload,
        "product": str(product.pk) if payload["product"] == "1" else payload["product"],
    }
    response = logged_in.post(SESSIONS, payload, content_type="application/json")
    assert response.status_code == status
    assert response.json()["code"] == code and response.json()["detail"]
    assert not CheckoutSession.objects.exists()
    assert not Customer.objects.exists()


@pytest.mark.parametrize(
    "payload,code",
    [
        ({"cycle": "months-²", "currency": "XOF"}, "unknown_cycle"),
        ({"cycle": "months-1", "currency": "²"}, "invalid_choice"),
        ({"product": "²", "cycle": "months-1"}, "product_not_found"),
    ],
)
def test_unicode_digits_are_a_clear_error_not_a_crash(
    billing_sandbox, product, logged_in, payload, code
):
    payload = {"product": str(product.pk), **payload}
    response = logged_in.post(SESSIONS, payload, content_type="application/json")
    assert response.status_code in (400, 404)
    assert response.json()["code"] == code
    assert not CheckoutSession.objects.exists()


def test_create_missing_product_is_400(logged_in):
    response = logged_in.post(SESSIONS, {}, content_type="application/json")
    assert response.status_code == 400 and "product" in response.json()


def test_a_body_nested_too_deep_is_400_not_a_server_error(logged_in):
    """Any signed-in user could post ``[[[[...`` (100 KB): DRF's JSON parser lets Python's
    RecursionError through (it turns only ValueError into a 400), so the endpoint answered 500,
    a traceback logged (and mailed to ADMINS) per request."""
    logged_in.raise_request_exception = False
    for body in ("[" * 100_000, '{"product": ' * 50_000):
        response = logged_in.post(SESSIONS, body, content_type="application/json")
        assert response.status_code == 400, response.content[:200]
        assert "nested" in response.json()["detail"]
    assert not CheckoutSession.objects.exists() and not Customer.objects.exists()


def test_create_during_outage_is_503(billing_sandbox, product, logged_in):
    billing_sandbox.faults(outage_seconds=30)
    response = logged_in.post(
        SESSIONS, {"product": str(product.pk), "cycle": "months-1"}, content_type="application/json"
    )
    assert response.status_code == 503
    assert response.json()["code"] == "service_unavailable"
    assert not CheckoutSession.objects.exists()


def test_anonymous_is_refused(client, billing_sandbox, product):
    assert (
        client.post(
            SESSIONS, {"product": str(product.pk)}, content_type="application/json"
        ).status_code
        == 403
    )
    assert client.get(SUBSCRIPTIONS).status_code == 403
    assert billing_sandbox.requests(operation="create_checkout_session") == []


def test_list_subscriptions_after_checkout(billing_sandbox, product, logged_in, client, other_user):
    assert logged_in.get(SUBSCRIPTIONS).json() == []
    created = logged_in.post(
        SESSIONS,
        {"product": str(product.pk), "cycle": "months-1", "currency": "XOF"},
        content_type="application/json",
    )
    billing_sandbox.complete_checkout(created.json()["id"], "0700000001")
    assert logged_in.get("/billing/checkout/return/").status_code == 200  # pulls

    rows = logged_in.get(SUBSCRIPTIONS).json()
    assert len(rows) == 1
    row = rows[0]
    remote = billing_sandbox.objects("subscription")[0]
    assert row["id"] == remote["id"]
    assert row["product"]["id"] == str(product.remote_id)
    assert row["product"]["name"] == product.name
    assert row["is_active"] is True and row["selected_billing_cycle"] == "months-1"
    assert row["selected_currency"] == "XOF"
    assert len(logged_in.get(SUBSCRIPTIONS, {"active": "1"}).json()) == 1

    # another user sees none of them
    client.force_login(other_user)
    assert client.get(SUBSCRIPTIONS).json() == []
