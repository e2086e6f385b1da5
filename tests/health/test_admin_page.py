"""Admin → Billing → Health: the doctor's facts for staff with ``view_health``."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from billing_integration.models import WebhookEvent

from ..webhooks.conftest import OTHER_SECRET, SECRET, envelope, post_signed

pytestmark = pytest.mark.django_db(transaction=True)
URL = "admin:billing_integration_health_changelist"


def staff_client(*codenames: str) -> Client:
    user = get_user_model().objects.create_user(
        f"staff-{uuid.uuid4().hex[:6]}", "staff@example.com", "pw", is_staff=True
    )
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="billing_integration", codename__in=codenames
        )
    )
    client = Client()
    client.force_login(user)
    return client


def test_the_admin_index_links_to_health_for_those_who_may_see_it(healthy):
    viewer = staff_client("view_health")
    index = viewer.get(reverse("admin:index")).content.decode()
    assert reverse(URL) in index and "Health" in index
    other = staff_client("view_report")
    assert reverse(URL) not in other.get(reverse("admin:index")).content.decode()
    assert other.get(reverse(URL)).status_code == 403


def test_the_page_shows_each_fact_and_names_the_fault(healthy, issued_tokens):
    WebhookEvent.objects.create(
        event_id="evt-1", type="payment.failed", state="failed", received_at=timezone.now()
    )
    response = staff_client("view_health").get(reverse(URL))
    assert response.status_code == 200
    html = response.content.decode()
    for key in (
        "token",
        "service",
        "broker",
        "workers",
        "beat",
        "outbox",
        "outbox_failed",
        "events",
        "events_failed",
        "events_unrecognised",
        "notices",
        "refused",
        "pull",
        "guesses",
        "plans",
    ):
        assert f'class="fact-{key} status-' in html
    assert 'class="fact-token status-ok"' in html
    assert 'class="fact-service status-ok"' in html
    assert 'class="fact-beat status-ok"' in html
    assert 'class="fact-events_failed status-fail"' in html
    assert "failed events: 1" in html
    assert "Unhealthy" in html and "events_failed" in html
    assert issued_tokens and not any(token in html for token in issued_tokens)  # fetched, unseen
    assert healthy.client_secret not in html


def test_the_page_reports_refused_deliveries_and_what_to_check(healthy, webhook_settings):
    for _ in range(2):  # the service signs with another secret than ours
        payload = envelope("ping.test", {"id": str(uuid.uuid4())})
        assert post_signed(Client(), payload, secret=OTHER_SECRET).status_code == 401
    html = staff_client("view_health").get(reverse(URL)).content.decode()
    assert 'class="fact-refused status-fail"' in html
    assert "refused deliveries: 2 in the last hour (bad signature 2)" in html
    assert "none accepted since" in html and "BILLING[&#x27;WEBHOOK_SECRET&#x27;]" in html
    assert "Unhealthy" in html and "refused" in html
    assert SECRET not in html and OTHER_SECRET not in html


def test_the_page_shows_a_switched_off_guess(healthy):
    from billing_integration.models import SwitchedOffGuess

    SwitchedOffGuess.objects.create(
        name="patch_auto_renew", status=405, operation="update_subscription"
    )
    html = staff_client("view_health").get(reverse(URL)).content.decode()
    assert 'class="fact-guesses status-warning"' in html
    assert "patch_auto_renew (HTTP 405 on update_subscription)" in html
