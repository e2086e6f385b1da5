"""One object's refusal does not switch a guess off for every customer. A 404 or 405 (no such
route or method) switches the guess off (a 404 on the PATCH of a subscription only when the
list of subscriptions shows it); a 400 or 422 sends that one request to staff and
leaves the guess on, unless the error names the guessed field unknown or unsupported. The
real sandbox where it answers so (a paused subscription, an expiry in the past, an unknown
target); ``responses`` plays the other answers."""

from __future__ import annotations

import logging

import pytest
import responses
from django.core import mail

from billing_integration.checkout.changes import (
    CHANGE_ACTION,
    PATCH_AUTO_RENEW,
    cancel_at_period_end,
    change_plan,
    guess_on,
    refuses_guess,
)
from billing_integration.checkout.services import CheckoutRefused, ProductUnavailable
from billing_integration.models import ChangeRequest, ChangeVia, SwitchedOffGuess

from . import test_changes
from .test_changes import ON, guesses, subscribe
from .test_one_purchase import hold

pytestmark = pytest.mark.django_db(transaction=True)

plans, staff = test_changes.plans, test_changes.staff  # its fixtures


def entry(message: str, code: str, field: str | None = None) -> dict:
    """The sandbox's error body (docs/sandbox.md)."""
    return {"errors": [{"message": message, "code": code, "field": field}]}


# --- the rule ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "status", "body", "switched_off"),
    [
        # no such route or method
        (CHANGE_ACTION, 404, {}, True),
        (PATCH_AUTO_RENEW, 405, "Method Not Allowed", True),
        # the guessed field named unknown or unsupported, in the shapes a service may use
        (
            CHANGE_ACTION,
            400,
            entry("Unsupported action 'upgrade'.", "invalid_choice", "action"),
            True,
        ),
        (CHANGE_ACTION, 422, entry("Unknown field.", "unknown_field", "downgrade_to"), True),
        (
            CHANGE_ACTION,
            400,
            {"statusCode": 400, "error": "invalid_choice", "message": "Unsupported action 'x'."},
            True,
        ),
        (CHANGE_ACTION, 400, {"error": {"param": "upgrade_to", "message": "Invalid value."}}, True),
        (PATCH_AUTO_RENEW, 400, {"message": "auto_renew cannot be set: not allowed"}, True),
        (PATCH_AUTO_RENEW, 400, "Unrecognized field: auto-renew", True),
        # about one object or one value: the guess stays on
        (
            PATCH_AUTO_RENEW,
            400,
            entry("The subscription is paused.", "invalid_state", "auto_renew"),
            False,
        ),
        (
            CHANGE_ACTION,
            400,
            entry("expires_at must be in the future.", "in_the_past", "expires_at"),
            False,
        ),
        (
            CHANGE_ACTION,
            400,
            entry("Unknown subscription or product 4f0c.", "not_found", "upgrade_to"),
            False,
        ),
        (
            CHANGE_ACTION,
            400,
            entry("Unknown currency id 9.", "unknown_currency", "selected_currency"),
            False,
        ),
        (CHANGE_ACTION, 422, {"errors": [{"code": "idempotency_key_in_use"}]}, False),
        (CHANGE_ACTION, 400, "Bad Request", False),
        (CHANGE_ACTION, 400, None, False),
        # the other guess's field does not count
        (PATCH_AUTO_RENEW, 400, entry("Unsupported action.", "invalid_choice", "action"), False),
        # not a refusal at all
        (CHANGE_ACTION, 409, entry("Unknown action.", "conflict", "action"), False),
        (CHANGE_ACTION, 500, {}, False),
    ],
)
def test_which_answers_switch_a_guess_off(name, status, body, switched_off):
    assert refuses_guess(name, status, body) is switched_off


# --- a 400 about one object: this request to staff, the guess kept -------------------------
def test_a_patch_refused_for_a_subscription_paused_on_the_service_goes_to_staff(
    billing_sandbox, plans, logged_in, user, settings, staff, caplog
):
    """The sandbox refuses to PATCH a paused subscription (400 ``invalid_state``); paused
    there, not yet here. That customer's stop goes to staff; everyone else's still PATCHes."""
    basic, _pro = plans
    billing_sandbox.config(patch_subscriptions=True)
    guesses(settings, patch_auto_renew=True)
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    billing_sandbox.trigger("subscription.paused", str(sub.remote_id))
    sub.refresh_from_db()
    assert sub.status == "published"  # the mirror does not know yet

    with caplog.at_level(logging.WARNING, logger="billing_integration.changes"):
        request = cancel_at_period_end(sub)

    [call] = billing_sandbox.requests(operation="update_subscription")
    assert call["status"] == 400
    assert request.via == ChangeVia.REQUEST and len(mail.outbox) == 1
    assert not SwitchedOffGuess.objects.exists() and guess_on(PATCH_AUTO_RENEW)
    assert "The subscription is paused" in caplog.text
    assert billing_sandbox.client_secret not in caplog.text


def test_a_change_refused_for_its_expiry_goes_to_staff_and_the_next_one_uses_the_guess(
    billing_sandbox, plans, logged_in, user, settings, staff, caplog
):
    """Clock skew: the sandbox's clock an hour ahead, the session's ``expires_at`` (5 minutes
    ahead here) is in the past there (400). That change goes to staff; the guess stays on."""
    basic, pro = plans
    billing_sandbox.config(change_actions=["upgrade"])
    guesses(settings, **ON)
    subscribe(billing_sandbox, logged_in, user, basic)
    billing_sandbox.advance(seconds=3600)

    with caplog.at_level(logging.WARNING, logger="billing_integration.changes"):
        request = change_plan(user, pro, "months-1", "XOF")

    calls = billing_sandbox.requests(operation="create_checkout_session")
    assert calls[-1]["status"] == 400 and calls[-1]["body"]["action"] == "upgrade"
    assert request.via == ChangeVia.REQUEST and request.checkout_url is None
    assert len(mail.outbox) == 1
    assert not SwitchedOffGuess.objects.exists() and guess_on(CHANGE_ACTION)
    assert "expires_at must be in the future" in caplog.text

    # the skew gone (sessions open long enough), the next change goes through the guess
    settings.BILLING = {**settings.BILLING, "CHECKOUT_EXPIRY": 7200}
    again = change_plan(user, pro, "years-1", "XOF")
    assert again.via == ChangeVia.CHECKOUT and again.checkout_url
    assert len(mail.outbox) == 1


def test_a_change_whose_target_the_service_does_not_know_goes_to_staff(
    billing_sandbox, plans, user, settings, staff
):
    """The held subscription is unknown to the sandbox (400 on ``upgrade_to``, ``not_found``):
    about that subscription, not the guess."""
    basic, pro = plans
    billing_sandbox.config(change_actions=["upgrade"])
    guesses(settings, **ON)
    hold(user, basic)  # a remote id the sandbox never saw

    request = change_plan(user, pro, "months-1", "XOF")

    [call] = billing_sandbox.requests(operation="create_checkout_session")
    assert call["status"] == 400
    assert request.via == ChangeVia.REQUEST and len(mail.outbox) == 1
    assert guess_on(CHANGE_ACTION)


def test_a_patch_of_a_subscription_the_service_does_not_have_goes_to_staff(
    billing_sandbox, plans, user, settings, staff
):
    """The sandbox takes PATCH but has no such subscription (404 ``not_found``): the app reads
    the list of subscriptions, does not find it there, and keeps the guess on."""
    basic, _pro = plans
    billing_sandbox.config(patch_subscriptions=True)
    guesses(settings, patch_auto_renew=True)
    sub = hold(user, basic)  # a remote id the sandbox never saw
    listed = len(billing_sandbox.requests(operation="list_subscriptions"))

    request = cancel_at_period_end(sub)

    [call] = billing_sandbox.requests(operation="update_subscription")
    assert call["status"] == 404
    assert len(billing_sandbox.requests(operation="list_subscriptions")) > listed
    assert request.via == ChangeVia.REQUEST and len(mail.outbox) == 1
    assert not SwitchedOffGuess.objects.exists() and guess_on(PATCH_AUTO_RENEW)


# --- answers the sandbox does not give (``responses``) -------------------------------------
def answered(sandbox, method: str, path: str, status: int, body) -> responses.RequestsMock:
    """``method path`` answered ``status`` / ``body``; every other call reaches the sandbox."""
    mock = responses.RequestsMock(assert_all_requests_are_fired=True)
    mock.add_passthru(sandbox.url)
    kwargs = {"json": body} if not isinstance(body, str) else {"body": body}
    mock.add(method, f"{sandbox.api_url}{path}", status=status, **kwargs)
    return mock


@pytest.mark.parametrize(
    ("status", "body", "switched_off"),
    [
        (404, {"message": "Not Found"}, True),
        (405, "Method Not Allowed", True),
        (400, entry("Unknown field upgrade_to.", "unknown_field", "upgrade_to"), True),
        (422, {"error": {"param": "action", "message": "Invalid value for action."}}, True),
        (400, entry("expires_at must be in the future.", "in_the_past", "expires_at"), False),
        (422, entry("The customer is blocked.", "invalid_state", "customer"), False),
    ],
)
def test_a_refused_change_of_plan(
    billing_sandbox, plans, logged_in, user, settings, staff, status, body, switched_off
):
    basic, pro = plans
    guesses(settings, **ON)
    subscribe(billing_sandbox, logged_in, user, basic)

    with answered(billing_sandbox, "POST", "/checkout_sessions", status, body):
        request = change_plan(user, pro, "months-1", "XOF")

    assert request.via == ChangeVia.REQUEST and len(mail.outbox) == 1
    assert guess_on(CHANGE_ACTION) is not switched_off
    rows = list(SwitchedOffGuess.objects.values_list("name", "status"))
    assert rows == ([(CHANGE_ACTION, status)] if switched_off else [])


def test_an_idempotency_conflict_is_not_handed_to_staff(
    billing_sandbox, plans, logged_in, user, settings, staff
):
    """422 naming the key: the session may exist (in doubt), so no staff request beside it."""
    basic, pro = plans
    guesses(settings, **ON)
    subscribe(billing_sandbox, logged_in, user, basic)
    conflict = entry("Idempotency key in use.", "idempotency_key_in_use")

    with (
        answered(billing_sandbox, "POST", "/checkout_sessions", 422, conflict),
        pytest.raises(CheckoutRefused),
    ):
        change_plan(user, pro, "months-1", "XOF")

    assert not ChangeRequest.objects.exists() and mail.outbox == []
    assert guess_on(CHANGE_ACTION)


def test_a_product_the_service_does_not_sell_is_refused_not_handed_to_staff(
    billing_sandbox, plans, logged_in, user, settings, staff
):
    """400 ``product_archived``: the new plan is not on sale there, as checkout says; neither
    a staff request nor the guess switched off."""
    basic, pro = plans
    guesses(settings, **ON)
    subscribe(billing_sandbox, logged_in, user, basic)
    archived = entry("The product is archived.", "product_archived", "product")

    with (
        answered(billing_sandbox, "POST", "/checkout_sessions", 400, archived),
        pytest.raises(ProductUnavailable),
    ):
        change_plan(user, pro, "months-1", "XOF")

    assert not ChangeRequest.objects.exists() and mail.outbox == []
    assert guess_on(CHANGE_ACTION)


@pytest.mark.parametrize(
    ("status", "body", "switched_off"),
    [
        # a 404 for a subscription the list shows: no such route
        (404, {"message": "Not Found"}, True),
        (405, "Method Not Allowed", True),
        (400, entry("auto_renew is not supported.", "unsupported", "auto_renew"), True),
        (400, entry("The subscription is past_due.", "invalid_state", "auto_renew"), False),
    ],
)
def test_a_refused_patch(
    billing_sandbox, plans, logged_in, user, settings, staff, status, body, switched_off
):
    basic, _pro = plans
    billing_sandbox.config(patch_subscriptions=True)
    guesses(settings, patch_auto_renew=True)
    sub = subscribe(billing_sandbox, logged_in, user, basic)

    with answered(billing_sandbox, "PATCH", f"/subscriptions/{sub.remote_id}", status, body):
        request = cancel_at_period_end(sub)

    assert request.via == ChangeVia.REQUEST and len(mail.outbox) == 1
    assert guess_on(PATCH_AUTO_RENEW) is not switched_off
    assert SwitchedOffGuess.objects.filter(name=PATCH_AUTO_RENEW).exists() is switched_off


def test_a_404_on_the_patch_keeps_the_guess_when_the_list_cannot_be_read(
    billing_sandbox, plans, logged_in, user, settings, staff
):
    """404 on the PATCH, and the list of subscriptions refused (403): nothing tells the route
    from the subscription, so that request goes to staff and the guess stays on."""
    basic, _pro = plans
    billing_sandbox.config(patch_subscriptions=True)
    guesses(settings, patch_auto_renew=True)
    sub = subscribe(billing_sandbox, logged_in, user, basic)

    with answered(billing_sandbox, "PATCH", f"/subscriptions/{sub.remote_id}", 404, {}) as mock:
        mock.add("GET", f"{billing_sandbox.api_url}/subscriptions", status=403, json={})
        request = cancel_at_period_end(sub)

    assert request.via == ChangeVia.REQUEST and len(mail.outbox) == 1
    assert not SwitchedOffGuess.objects.exists() and guess_on(PATCH_AUTO_RENEW)
