"""Stored delivery headers: an allow-list of harmless headers keeps its values; every other
header (credentials under any name, signatures, cookies, names nobody listed) is stored with
its value replaced by a marker, through the real view and on the admin page."""

from __future__ import annotations

import json
import uuid

import pytest
from django.urls import reverse

from billing_integration.models import WebhookEvent
from billing_integration.webhooks import ingest

from .conftest import SECRET, envelope, post_signed

pytestmark = pytest.mark.django_db

#: What a header outside the allow-list is stored as (``ingest.REDACTED``).
MARKER = "[redacted]"
#: Header values that must never be stored in clear, by WSGI environ key.
SECRET_VALUES = {
    "HTTP_X_PRIVATE_KEY": "pk-4f1c0ffee-private",
    "HTTP_X_PASSWD": "hunter2-passwd-value",
    "HTTP_X_CREDENTIAL": "cred-7a9e-credential",
    "HTTP_AUTHORIZATION": "Bearer tok-9b8c7d6e5f",
    "HTTP_COOKIE": "sessionid=cookie-3e2d1c",
    "HTTP_X_SOMETHING_NEW": "unlisted-header-value",
}


@pytest.fixture
def delivery(client, webhook_settings):
    payload = envelope("invoice.paid", {"id": str(uuid.uuid4()), "status": "paid"})
    extra = {
        **SECRET_VALUES,
        "HTTP_USER_AGENT": "Svix-Webhooks/1.0",
        "HTTP_X_REQUEST_ID": "req-123",
        "HTTP_X_FORWARDED_FOR": "203.0.113.7",
    }
    response = post_signed(client, payload, extra=extra)
    assert response.status_code == 200, response.content
    return payload, WebhookEvent.objects.get(event_id=payload["id"])


def test_the_stored_row_holds_no_secret_value(delivery):
    payload, event = delivery
    stored = json.dumps(event.headers)
    for value in SECRET_VALUES.values():
        assert value not in stored
    assert SECRET not in stored
    assert event.headers["webhook-signature"] == MARKER
    # Present, but only as a marker: an operator sees the header was sent.
    for name in (
        "x-private-key",
        "x-passwd",
        "x-credential",
        "authorization",
        "cookie",
        "x-something-new",
    ):
        assert event.headers[name] == MARKER
    # The allow-list is stored verbatim.
    assert event.headers["webhook-id"] == payload["id"]
    assert event.headers["webhook-timestamp"].isdigit()
    assert event.headers["content-type"] == "application/json"
    assert event.headers["user-agent"] == "Svix-Webhooks/1.0"
    assert event.headers["x-request-id"] == "req-123"
    assert event.headers["x-forwarded-for"] == "203.0.113.7"


def test_the_admin_page_shows_no_secret_value(delivery, admin_client):
    _, event = delivery
    page = admin_client.get(
        reverse("admin:billing_integration_webhookevent_change", args=[event.pk])
    )
    assert page.status_code == 200
    html = page.content.decode()
    assert "x-private-key" in html and "x-passwd" in html  # the names are shown
    for value in SECRET_VALUES.values():
        assert value not in html
    assert SECRET not in html


def test_only_listed_names_keep_their_value():
    headers = {name: "v" for name in ingest.STORED_HEADERS}
    headers.update({"X-Api-Token": "t", "Proxy-Authorization": "p", "Svix-Signature": "s"})
    stored = ingest.safe_headers(headers)
    assert {k for k, v in stored.items() if v != ingest.REDACTED} == set(ingest.STORED_HEADERS)
    assert stored["x-api-token"] == stored["proxy-authorization"] == ingest.REDACTED
    assert stored["svix-signature"] == ingest.REDACTED
    assert MARKER == ingest.REDACTED
