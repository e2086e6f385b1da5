"""What the "Unrecognised events" page says each type needs, and its grouping."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from billing_integration.models import EventState, WebhookEvent
from billing_integration.webhooks.unrecognised import (
    closest_type,
    needed_handler,
    unrecognised_types,
)


def test_a_prefixed_spelling_reads_as_the_known_type():
    assert closest_type("billing.invoice.paid") == "invoice.paid"
    assert closest_type("acme_SUBSCRIPTION_RENEWED") == "subscription.renewal"
    assert closest_type("plan.extended") == ""
    assert "EVENT_TYPE_ALIASES" in needed_handler("billing.invoice.paid")
    assert '"invoice.paid"' in needed_handler("billing.invoice.paid")
    assert '@handler("plan.extended")' in needed_handler("plan.extended")
    needs = needed_handler("subscription.canceled", "subscription.canceled")
    assert needs.startswith("SubscriptionHandler") and "more data" in needs


def test_a_type_mapped_since_says_replay(settings):
    settings.BILLING = {**settings.BILLING, "EVENT_TYPE_ALIASES": {"plan.extended": "invoice.paid"}}
    assert (
        needed_handler("plan.extended")
        == "mapped to invoice.paid now (InvoiceHandler): replay them"
    )


@pytest.mark.django_db
def test_grouped_by_type_with_counts_times_and_a_redacted_sample():
    now = timezone.now()
    for n, (raw, age) in enumerate([("plan.extended", 3), ("plan.extended", 1), ("x.y", 2)]):
        body = {"id": f"e{n}", "type": raw, "data": {"id": f"p{n}", "api_token": "tok-secret"}}
        WebhookEvent.objects.create(
            event_id=f"e{n}",
            raw_type=raw,
            body=json.dumps(body),
            state=EventState.UNRECOGNISED,
            received_at=now - timedelta(hours=age),
            error=f"No handler for event type {raw!r}.",
        )
    WebhookEvent.objects.create(event_id="done", raw_type="x.y", state=EventState.PROCESSED)
    found = unrecognised_types()
    assert [(t.raw_type, t.count) for t in found] == [("plan.extended", 2), ("x.y", 1)]
    first = found[0]
    assert first.first_seen == now - timedelta(hours=3) and first.last_seen == now - timedelta(
        hours=1
    )
    assert first.sample["data"] == {"id": "p1", "api_token": "[redacted]"}  # the newest one
    assert "tok-secret" not in json.dumps([t.sample for t in found])
