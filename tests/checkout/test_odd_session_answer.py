"""A checkout session's answer with values the columns cannot take (a status or action too
long or not text, times and a currency that do not parse): the customer still goes to the
hosted page, the session is stored with what fits, the raw answer kept beside it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import requests

from billing_integration.client import client as client_module
from billing_integration.models import CheckoutSession

from .conftest import make_product
from .test_one_purchase import post

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def session_answer(monkeypatch) -> Callable[[Callable[[Any], Any]], None]:
    """``session_answer(change)``: the ``data`` of the sandbox's answer to a checkout session's
    create passes through ``change`` as the client reads the real HTTP answer."""
    real = client_module._body

    def tamper(change: Callable[[Any], Any]) -> None:
        def body(response: requests.Response) -> Any:
            answer = real(response)
            if response.request.method == "POST" and str(response.request.url).endswith(
                "/checkout_sessions"
            ):
                answer = {**answer, "data": change(answer["data"])}
            return answer

        monkeypatch.setattr(client_module, "_body", body)

    return tamper


ODD = {
    "status": "open-" + "x" * 100,
    "action": 5,
    "expires_at": "31/12/2026",
    "completed_at": "soon",
    "date_created": "yesterday",
    "selected_currency": 999,
    "selected_billing_cycle": ["months-1"],
    "upgrade_to": "u" * 200,
}


def test_odd_values_in_the_session_answer_still_send_the_customer_to_pay(
    billing_sandbox, logged_in, session_answer
):
    product = make_product("Pro")
    session_answer(lambda answer: {**answer, **ODD})
    response = post(logged_in, product)
    assert response.status_code == 302, response.content[:500]
    session = CheckoutSession.objects.get()
    assert response["Location"].endswith(f"/checkout/{session.remote_id}")
    [sent] = billing_sandbox.requests(operation="create_checkout_session")
    assert sent["status"] == 200
    assert str(session.remote_id) in {s["id"] for s in billing_sandbox.objects("checkout_session")}
    assert session.status == ODD["status"][:32] and session.action == "new_subscription"
    assert session.expires_at is not None  # the one sent, kept
    assert session.completed_at is None and session.remote_created is None
    assert session.selected_currency == 1  # the one sent (XOF), not the unknown 999
    assert session.selected_billing_cycle == "" and session.upgrade_to == "u" * 64
    assert session.remote_data["selected_currency"] == 999  # the answer as received


def test_a_nul_or_a_lone_surrogate_in_the_session_answer_still_sends_the_customer_to_pay(
    billing_sandbox, logged_in, session_answer
):
    """PostgreSQL refuses both in ``jsonb`` (and any database a lone surrogate in a column):
    the answer was a 500 after the session was created."""
    product = make_product("Pro")
    odd = {"status": "op\x00en\ud800", "note": "a\x00b", "links": [{"k\x00": "\ud800"}]}
    session_answer(lambda answer: {**answer, **odd})
    response = post(logged_in, product)
    assert response.status_code == 302, response.content[:500]
    session = CheckoutSession.objects.get()
    assert response["Location"].endswith(f"/checkout/{session.remote_id}")
    assert session.status == "op\ufffden\ufffd"
    assert session.remote_data["note"] == "a\ufffdb"
    assert session.remote_data["links"] == [{"k\ufffd": "\ufffd"}]


def test_a_session_answered_as_an_array_of_one_still_sends_the_customer_to_pay(
    billing_sandbox, logged_in, session_answer
):
    """The way the service answers a new subscription: the session was created, then the
    checkout refused ("answered without a session id")."""
    product = make_product("Pro")
    session_answer(lambda answer: [answer])
    response = post(logged_in, product)
    assert response.status_code == 302, response.content[:500]
    session = CheckoutSession.objects.get()
    assert response["Location"].endswith(f"/checkout/{session.remote_id}")


@pytest.mark.parametrize("status", ["OPEN", "pending", ""])
def test_a_double_click_on_a_session_answered_in_another_status_spelling_makes_one_session(
    billing_sandbox, logged_in, session_answer, status
):
    """The session is still payable whatever its status says (sessions are never read back):
    the second click is sent to it, never to a second session that could be paid too."""
    product = make_product("Pro")
    session_answer(lambda answer: {**answer, "status": status})
    first = post(logged_in, product)
    second = post(logged_in, product)
    assert first.status_code == second.status_code == 302, second.content[:500]
    assert second["Location"] == first["Location"]
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 1
    assert CheckoutSession.objects.count() == 1
