"""Checkouts while the settings point at another service than the mirror's
(``billing_integration.service``): refused with the "not charged" page or a 503, nothing
created remotely or locally; the return page does not pull from the other service."""

from __future__ import annotations

import pytest

from billing_integration.checkout.services import ServiceUnavailable, start_checkout
from billing_integration.models import CheckoutSession, Customer, OutboxEntry

pytestmark = pytest.mark.django_db(transaction=True)

SESSIONS = "/billing/api/checkout-sessions/"


@pytest.fixture
def pointed_elsewhere(billing_sandbox, product, settings):
    """The product was pushed (the mirror belongs to the sandbox); the settings now name the
    same sandbox under another address, so anything sent would reach its request log."""
    moved = billing_sandbox.base_url.replace("127.0.0.1", "localhost")
    settings.BILLING = {**settings.BILLING, "BASE_URL": moved}
    billing_sandbox.clear_requests()
    return moved


def test_the_checkout_view_shows_the_not_charged_page_and_sends_nothing(
    billing_sandbox, product, logged_in, pointed_elsewhere
):
    response = logged_in.post(
        "/billing/checkout/", {"product": product.pk, "cycle": "months-1", "currency": "XOF"}
    )
    assert response.status_code == 503
    page = response.content.decode()
    assert 'data-error-code="service_unavailable"' in page and "Nothing was charged" in page
    assert billing_sandbox.requests() == []
    assert not CheckoutSession.objects.exists()
    assert not Customer.objects.exists() and not OutboxEntry.objects.open().exists()


def test_the_api_answers_503_and_sends_nothing(
    billing_sandbox, product, logged_in, pointed_elsewhere
):
    response = logged_in.post(
        SESSIONS,
        {"product": str(product.pk), "cycle": "months-1"},
        content_type="application/json",
    )
    assert response.status_code == 503
    assert response.json()["code"] == "service_unavailable"
    assert billing_sandbox.requests() == []
    assert not CheckoutSession.objects.exists() and not Customer.objects.exists()


def test_start_checkout_refuses_and_logs_both_services(
    billing_sandbox, product, user, pointed_elsewhere, caplog
):
    with pytest.raises(ServiceUnavailable):
        start_checkout(user, product, "months-1", "XOF")
    assert pointed_elsewhere in caplog.text and billing_sandbox.base_url in caplog.text
    assert "billing_service relink" in caplog.text
    assert billing_sandbox.requests() == []


def test_the_return_page_does_not_pull_from_the_other_service(
    billing_sandbox, product, logged_in, settings
):
    response = logged_in.post(
        "/billing/checkout/", {"product": product.pk, "cycle": "months-1", "currency": "XOF"}
    )
    assert response.status_code == 302
    session = CheckoutSession.objects.get()
    settings.BILLING = {
        **settings.BILLING,
        "BASE_URL": billing_sandbox.base_url.replace("127.0.0.1", "localhost"),
    }
    billing_sandbox.clear_requests()
    page = logged_in.get("/billing/checkout/return/", {"session_id": str(session.remote_id)})
    assert page.status_code == 200
    assert "could not reach the payment service" in page.content.decode()
    assert billing_sandbox.requests() == []
