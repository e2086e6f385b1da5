"""Fixtures of the notice tests: the webhook test helpers, notices turned on."""

from __future__ import annotations

import pytest

from ..webhooks.conftest import (  # noqa: F401  (fixtures reused here)
    SECRET,
    mirror,
    webhook_settings,
)

SITE = "https://app.example.com"
ALL_ON = {
    "payment_failed": True,
    "subscription_canceled": True,
    "subscription_paused": True,
    "refund_approved": True,
}


@pytest.fixture
def notice_settings(settings, eager):
    """Signed deliveries processed in the request, every notice on, the locmem backend."""
    settings.BILLING = {
        **settings.BILLING,
        "WEBHOOK_SECRET": SECRET,
        "NOTICES": dict(ALL_ON),
        "SITE_URL": SITE,
    }
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.DEFAULT_FROM_EMAIL = "billing@example.com"
    return settings


@pytest.fixture
def customer_email(request):
    """The ``mirror`` objects, the customer with an email address."""
    from billing_integration.outbox import from_remote

    objects = request.getfixturevalue("mirror")
    with from_remote():
        objects.customer.email = "ada@example.com"
        objects.customer.save()
    return objects
