"""The admin's change requests (issue 28): the list staff work from, "Done on the service"
records when without confirming anything; switched-off guesses; a subscription's coupon."""

from __future__ import annotations

import uuid

import pytest
from django.urls import reverse

from billing_integration.models import (
    ChangeKind,
    ChangeRequest,
    ChangeState,
    Customer,
    Subscription,
    SwitchedOffGuess,
)
from billing_integration.outbox import from_remote

pytestmark = pytest.mark.django_db


@pytest.fixture
def request_row(db) -> ChangeRequest:
    with from_remote():
        customer = Customer.objects.create(
            identifier="c-1", email="ann@example.com", remote_id=uuid.uuid4()
        )
        sub = Subscription.objects.create(
            remote_id=uuid.uuid4(),
            customer=customer,
            status="published",
            discount_coupon={"code": "SPRING", "percent_off": 10},
        )
    return ChangeRequest.objects.create(
        customer=customer, subscription=sub, kind=ChangeKind.STOP_RENEWAL, via="request"
    )


def test_done_on_the_service_records_when_but_confirms_nothing(admin_client, request_row):
    url = reverse("admin:billing_integration_changerequest_changelist")
    page = admin_client.get(url).content.decode()
    assert "ann@example.com" in page and "stop renewal of" in page
    response = admin_client.post(
        url, {"action": "mark_done", "_selected_action": [request_row.pk]}, follow=True
    )
    assert "1 request marked done on the service" in response.content.decode()
    again = admin_client.post(
        url, {"action": "mark_done", "_selected_action": [request_row.pk]}, follow=True
    )
    assert "Nothing marked: none of the selected requests is pending" in again.content.decode()
    request_row.refresh_from_db()
    assert request_row.staff_done_at is not None
    assert request_row.state == ChangeState.PENDING  # until the service shows it
    assert (
        admin_client.get(reverse("admin:billing_integration_changerequest_add")).status_code == 403
    )


def test_switched_off_guesses_are_listed_and_can_be_deleted(admin_client):
    guess = SwitchedOffGuess.objects.create(name="change_plan_action", status=400, operation="x")
    url = reverse("admin:billing_integration_switchedoffguess_changelist")
    assert "change_plan_action" in admin_client.get(url).content.decode()
    delete = reverse("admin:billing_integration_switchedoffguess_delete", args=[guess.pk])
    admin_client.post(delete, {"post": "yes"})
    assert not SwitchedOffGuess.objects.exists()


def test_the_subscription_page_shows_the_coupon_as_received(admin_client, request_row):
    url = reverse(
        "admin:billing_integration_subscription_change", args=[request_row.subscription_id]
    )
    page = admin_client.get(url).content.decode()
    assert "discount coupon" in page.lower() and "SPRING" in page
