"""Events the app does not understand, end to end in the example project: sent by the sandbox
in another spelling, kept ``unrecognised``, listed on the admin's page, reported by the doctor
and the Health page, then applied in order by "Replay unrecognised events" once aliased."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from billing_integration.billing import EventHandler, HandlerResult, deliver_event, handler
from billing_integration.health import FACTS
from billing_integration.models import EventState, Subscription, WebhookEvent
from billing_integration.webhooks import handlers, types

from .conftest import staff_with

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = reverse("admin:billing_integration_webhookevent_unrecognised")
CHANGELIST = reverse("admin:billing_integration_webhookevent_changelist")
HEALTH = reverse("admin:billing_integration_health_changelist")
ALIASES = {
    "billing.subscription.renewal": "subscription.renewal",
    "billing.subscription.canceled": "subscription.canceled",
}


def doctor_fact() -> dict:
    others = [f for f in FACTS if f != "events_unrecognised"]
    out = StringIO()
    call_command("billing_doctor", "--json", "--skip", *others, stdout=out)
    (fact,) = json.loads(out.getvalue())["facts"]
    return fact


@pytest.fixture
def delivered(billing_sandbox, client, eager):
    """A renewal then a cancellation of one subscription, as billing.subscription.*."""
    billing_sandbox.dialects("events_prefixed")
    billing_sandbox.seed(customers=1, subscriptions=1)
    subscription = billing_sandbox.objects("subscription")[0]["id"]
    for event_type in ("subscription.renewal", "subscription.canceled"):
        event = billing_sandbox.trigger(event_type, subscription)
        billing_sandbox.advance(60)
        response = deliver_event(
            client,
            event["type"],
            event["data"],
            event_id=event["id"],
            created_at=event["created_at"],
        )
        assert response.status_code == 200
    return subscription


def test_unknown_types_are_kept_shown_and_replayed_after_an_alias(
    delivered, admin_client, settings, billing_sandbox
):
    events = list(WebhookEvent.objects.order_by("received_at"))
    assert [e.raw_type for e in events] == list(ALIASES)
    assert {e.state for e in events} == {EventState.UNRECOGNISED}
    assert not Subscription.objects.filter(remote_id=delivered).exists()

    assert 'class="billing-unrecognised-link"' in admin_client.get(CHANGELIST).content.decode()
    page = admin_client.get(PAGE).content.decode()
    assert page.count('class="unrecognised-type"') == 2
    assert "billing.subscription.canceled" in page and 'class="count">1<' in page
    assert "an alias" in page and "&quot;subscription.canceled&quot;" in page
    assert delivered in page  # the sample payload
    assert billing_sandbox.webhook_secret not in page and "replay-unrecognised" in page

    fact = doctor_fact()
    assert fact["status"] == "warning" and fact["data"]["count"] == 2
    assert "billing.subscription.renewal 1" in fact["summary"]
    health = admin_client.get(HEALTH).content.decode()
    assert "unrecognised events: 2 in the last day" in health

    settings.BILLING = {**settings.BILLING, "EVENT_TYPE_ALIASES": ALIASES}
    response = admin_client.post(PAGE, follow=True)
    assert "Replayed: processed: 2" in response.content.decode()
    events = list(WebhookEvent.objects.order_by("received_at"))
    assert [(e.type, e.state, e.outcome) for e in events] == [
        ("subscription.renewal", EventState.PROCESSED, "applied"),
        ("subscription.canceled", EventState.PROCESSED, "applied"),
    ]
    assert Subscription.objects.get(remote_id=delivered).status == "canceled"
    assert doctor_fact()["status"] == "ok"
    assert "No unrecognised event is stored." in admin_client.get(PAGE).content.decode()


def test_a_type_of_its_own_is_applied_by_its_handler_as_the_page_advises(
    client, eager, billing_sandbox, admin_client, monkeypatch
):
    """docs/events.md: a handler registered with ``@handler("<type>")`` applies that type,
    and the events stored before it are picked up by a replay."""
    monkeypatch.setattr(handlers, "HANDLERS", dict(handlers.HANDLERS))
    monkeypatch.setattr(types, "OWN_TYPES", set())
    assert deliver_event(client, "plan.extended", {"id": "p1"}).status_code == 200
    assert WebhookEvent.objects.get().state == EventState.UNRECOGNISED
    assert "@handler(&quot;plan.extended&quot;)" in admin_client.get(PAGE).content.decode()
    seen = []

    @handler("plan.extended")
    class Extended(EventHandler):
        def handle(self, ctx):
            seen.append(ctx.data["id"])
            return HandlerResult("applied")

    assert "Replayed: processed: 1" in admin_client.post(PAGE, follow=True).content.decode()
    assert deliver_event(client, "plan.extended", {"id": "p2"}).status_code == 200
    assert seen == ["p1", "p2"]
    assert {(e.type, e.state, e.outcome) for e in WebhookEvent.objects.all()} == {
        ("plan.extended", EventState.PROCESSED, "applied")
    }


@pytest.mark.parametrize("name", ["x" * 65, "", " "])
def test_a_type_that_cannot_be_stored_is_refused_at_registration(monkeypatch, name):
    """A delivery's type is stored in 64 characters: a longer one could never match."""
    monkeypatch.setattr(handlers, "HANDLERS", dict(handlers.HANDLERS))
    monkeypatch.setattr(types, "OWN_TYPES", set())
    with pytest.raises(ValueError, match="an event type is 1 to 64 characters"):
        handler("plan.extended", name)
    assert handler("y" * 64)(EventHandler) is EventHandler
    assert "plan.extended" not in handlers.HANDLERS and "y" * 64 in types.OWN_TYPES


def test_replay_needs_the_change_permission(delivered, client):
    client.force_login(staff_with("view_webhookevent"))
    assert client.get(PAGE).status_code == 200
    assert client.post(PAGE).status_code == 403
    assert set(WebhookEvent.objects.values_list("state", flat=True)) == {EventState.UNRECOGNISED}


def test_data_without_what_the_handler_needs_is_kept_unrecognised(client, eager, settings):
    settings.BILLING = {**settings.BILLING, "WEBHOOK_SECRET": "whsec_" + "MDEyMzQ1Njc4OWFiY2RlZg=="}
    assert deliver_event(client, "subscription.canceled", {"status": "canceled"}).status_code == 200
    event = WebhookEvent.objects.get()
    assert event.state == EventState.UNRECOGNISED and "data.id" in event.error
    # Not picked up again by the sweep of received events.
    from billing_integration.webhooks.tasks import process_pending_webhook_events

    assert process_pending_webhook_events(older_than=0) == 0


@pytest.mark.parametrize("configured", [None, "", []])
def test_deliver_event_without_a_secret_says_so(client, settings, configured):
    settings.BILLING = {**settings.BILLING, "WEBHOOK_SECRET": configured}
    with pytest.raises(ValueError, match="No secret"):
        deliver_event(client, "invoice.paid", {"id": "x"})
