"""The event log admin: filters, the raw body and headers readable, replay of a failed event."""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import Client
from django.urls import reverse

from billing_integration.models import EventState, Invoice, WebhookEvent

from .conftest import staff_with

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:billing_integration_webhookevent_changelist")


def invoice_event(state: str = EventState.FAILED, **data) -> WebhookEvent:
    remote = str(uuid.uuid4())
    body = {
        "id": str(uuid.uuid4()),
        "type": "invoice.paid",
        "created_at": "2026-01-01T00:00:00.000Z",
        "data": {
            "id": remote,
            "status": "paid",
            "customer": None,
            "subscription": None,
            "product": None,
            "amount": 5000,
            "currency": "XOF",
            "date_created": "2026-01-01T00:00:00.000Z",
            "date_updated": "2026-01-01T00:00:00.000Z",
            **data,
        },
    }
    return WebhookEvent.objects.create(
        event_id=body["id"],
        raw_type="invoice.paid",
        type="invoice.paid",
        body=json.dumps(body),
        headers={"webhook-signature": "[redacted]", "user-agent": "svc"},
        state=state,
        attempts=1 if state == EventState.FAILED else 0,
        error="OperationalError: database is locked" if state == EventState.FAILED else "",
        object_id=remote,
    )


def replay(client: Client, *events: WebhookEvent, name: str = "replay"):
    return client.post(
        CHANGELIST, {"action": name, "index": "0", "_selected_action": [str(e.pk) for e in events]}
    )


def test_replay_action_reprocesses_a_failed_event(admin_client):
    event = invoice_event()
    remote_id = json.loads(event.body)["data"]["id"]
    assert not Invoice.objects.filter(remote_id=remote_id).exists()
    response = replay(admin_client, event)
    assert response.status_code == 302
    event.refresh_from_db()
    assert event.state == EventState.PROCESSED and event.attempts == 2
    assert Invoice.objects.get(remote_id=remote_id).status == "paid"
    # A processed event is skipped by "Replay"; "Re-apply" forces it (nothing newer to lose).
    assert replay(admin_client, event).status_code == 302
    event.refresh_from_db()
    assert event.attempts == 2
    replay(admin_client, event, name="replay_force")
    event.refresh_from_db()
    assert event.attempts == 3 and event.state == EventState.PROCESSED


def test_view_only_staff_cannot_replay(db):
    client = Client()
    client.force_login(staff_with("view_webhookevent"))
    event = invoice_event()
    html = client.get(CHANGELIST).content.decode()
    assert 'value="replay"' not in html
    replay(client, event)
    event.refresh_from_db()
    assert event.state == EventState.FAILED and event.attempts == 1


def test_filters_search_and_bounded_queries(admin_client, django_assert_max_num_queries):
    from billing_integration.conf import shared_cache

    # No refused delivery counted: the shared cache (Redis under CI) outlives the tests, and
    # runs, that refused some, and the list's refused line then reads when one was accepted.
    shared_cache().clear()
    events = [invoice_event(EventState.PROCESSED) for _ in range(19)] + [invoice_event()]
    with django_assert_max_num_queries(12):  # 2: the savepoint around the list's counts
        response = admin_client.get(CHANGELIST)
    assert response.status_code == 200 and response.context["cl"].result_count == 20
    failed = admin_client.get(CHANGELIST + "?state__exact=failed").context["cl"].result_list
    assert [e.pk for e in failed] == [events[-1].pk]
    by_type = admin_client.get(CHANGELIST + "?type__exact=invoice.paid").context["cl"]
    assert by_type.result_count == 20
    assert (
        admin_client.get(CHANGELIST + "?type__exact=payment.failed").context["cl"].result_count == 0
    )
    found = admin_client.get(CHANGELIST + f"?q={events[3].event_id}").context["cl"].result_list
    assert [e.pk for e in found] == [events[3].pk]


def test_change_view_shows_body_headers_and_error_read_only(admin_client):
    event = invoice_event()
    url = reverse("admin:billing_integration_webhookevent_change", args=[event.pk])
    response = admin_client.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert "&quot;type&quot;: &quot;invoice.paid&quot;" in html  # pretty-printed, escaped
    assert "[redacted]" in html and "database is locked" in html
    assert 'name="_save"' not in html
    assert not response.context["adminform"].form.fields
    assert (
        admin_client.get(reverse("admin:billing_integration_webhookevent_add")).status_code == 403
    )
    admin_client.post(url, {"state": "processed", "body": "{}"})
    event.refresh_from_db()
    assert event.state == EventState.FAILED and event.body.startswith("{")


def test_change_view_of_a_body_nested_too_deep_shows_it_raw_and_truncated(admin_client):
    """A rejected delivery nested 100k levels deep: the JSON parser's RecursionError must
    not turn the page into a 500; the raw body is shown, cut."""
    from billing_integration.admin.events import RAW_TEXT_LIMIT

    depth = 100_000
    event = WebhookEvent.objects.create(
        event_id=f"deep-{uuid.uuid4()}",
        body="[" * depth + "]" * depth,
        state=EventState.REJECTED,
        error="body is not a JSON object",
    )
    url = reverse("admin:billing_integration_webhookevent_change", args=[event.pk])
    response = admin_client.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert "[" * 1000 in html and "]" * 1000 not in html  # the start, cut before the end
    assert f"{2 * depth - RAW_TEXT_LIMIT} more characters not shown" in html


def test_a_body_with_a_lone_surrogate_escape_is_shown_not_a_500(admin_client):
    """Valid JSON may escape a lone surrogate ("\\ud800"), which cannot be sent as UTF-8: the
    change page and the unrecognised events page show it escaped."""
    event = WebhookEvent.objects.create(
        event_id=f"surrogate-{uuid.uuid4()}",
        raw_type="customer.renamed",
        body='{"id": "x", "type": "customer.renamed", "data": {"name": "Ada \\ud800"}}',
        state=EventState.UNRECOGNISED,
    )
    change = reverse("admin:billing_integration_webhookevent_change", args=[event.pk])
    unrecognised = reverse("admin:billing_integration_webhookevent_unrecognised")
    for url in (change, unrecognised):
        response = admin_client.get(url)
        assert response.status_code == 200
        assert "Ada \\ud800" in response.content.decode()


def test_a_delivery_still_to_be_applied_cannot_be_deleted(admin_client):
    """As the prune: deleting a ``received`` delivery would lose its event; a finished one goes."""
    waiting, done = invoice_event(EventState.RECEIVED), invoice_event(EventState.PROCESSED)
    delete = reverse("admin:billing_integration_webhookevent_delete", args=[waiting.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    bulk = {"action": "delete_selected", "post": "yes", "index": "0"}
    admin_client.post(CHANGELIST, {**bulk, "_selected_action": [str(waiting.pk), str(done.pk)]})
    assert WebhookEvent.objects.filter(pk=waiting.pk).exists()
    admin_client.post(CHANGELIST, {**bulk, "_selected_action": [str(done.pk)]})
    assert list(WebhookEvent.objects.values_list("pk", flat=True)) == [waiting.pk]


def test_the_list_says_when_deliveries_are_refused(admin_client, settings):
    """Refused deliveries are not stored: the list of the accepted ones (all processed here)
    says that they are refused, why, and which setting to check, never the secret."""
    from billing_integration.conf import shared_cache

    from ..webhooks.conftest import OTHER_SECRET, SECRET, envelope, post_signed

    shared_cache().clear()
    settings.BILLING = {**settings.BILLING, "WEBHOOK_SECRET": SECRET}
    invoice_event(state=EventState.PROCESSED)
    html = admin_client.get(CHANGELIST).content.decode()
    assert "refused deliveries" not in html

    for _ in range(2):  # the service signs with another secret than ours
        payload = envelope("ping.test", {"id": str(uuid.uuid4())})
        assert post_signed(Client(), payload, secret=OTHER_SECRET).status_code == 401
    html = admin_client.get(CHANGELIST).content.decode()
    assert "refused deliveries: 2 in the last hour (bad signature 2)" in html
    assert "none accepted since" in html and "BILLING[&#x27;WEBHOOK_SECRET&#x27;]" in html
    assert reverse("admin:billing_integration_health_changelist") in html
    assert SECRET not in html and OTHER_SECRET not in html


def test_the_raw_body_and_a_records_raw_data_show_no_token_or_secret(admin_client):
    """As the unrecognised events' sample: secret-looking fields (token, secret, password) of a
    stored payload are redacted on the change pages; they were shown as received."""
    from billing_integration.models import Payment

    event = invoice_event(access_token="tok-live-123", client_secret="cs-live-456")
    payment = Payment.objects.create(
        remote_id=uuid.uuid4(),
        status="completed",
        remote_data={"id": "p", "payment_token": "tok-live-789", "amount": 5000},
    )
    pages = [
        reverse("admin:billing_integration_webhookevent_change", args=[event.pk]),
        reverse("admin:billing_integration_payment_change", args=[payment.pk]),
    ]
    for url in pages:
        html = admin_client.get(url).content.decode()
        assert "[redacted]" in html
        assert not [s for s in ("tok-live-123", "cs-live-456", "tok-live-789") if s in html]
    assert "5000" in html  # the rest is shown


def test_a_replay_of_many_events_names_those_that_failed_and_why(admin_client):
    """The others are applied; the message said only "Replayed: failed: 1, processed: 1"."""
    good, bad = invoice_event(), invoice_event(customer="not-a-uuid")
    response = replay(admin_client, good, bad)
    good.refresh_from_db()
    bad.refresh_from_db()
    assert good.state == EventState.PROCESSED and bad.state == EventState.FAILED
    texts = [str(m) for m in response.wsgi_request._messages]
    failed = [t for t in texts if bad.event_id in t]
    assert failed and bad.error.splitlines()[0][:60] in failed[0]
    assert not [t for t in texts if good.event_id in t]
