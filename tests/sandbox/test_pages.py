"""The sandbox's pages for people, over HTTP (issue 14): the PIN step survives a reload, an
empty phone number gets a message, the dashboard shows readable times, ``/`` is an index."""

from __future__ import annotations

import re

import pytest
import requests

from .test_checkout_events import outcome_of

READABLE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


def test_a_reload_of_the_pin_step_stays_on_it(api, sandbox):
    session = api.session(api.customer(), api.product())
    page = f"{sandbox.checkout_url}/checkout/{session['id']}"
    posted = requests.post(
        page, data={"step": "phone", "phone": "0700000001"}, allow_redirects=False, timeout=5
    )
    assert posted.status_code == 303  # POST, redirect, GET: a reload re-GETs the PIN step
    location = posted.headers["Location"]
    assert location.startswith(f"/checkout/{session['id']}?") and "step=pin" in location
    for _ in range(2):  # the first load and a reload
        shown = requests.get(sandbox.checkout_url + location, timeout=5)
        assert shown.status_code == 200 and outcome_of(shown) == "pin"
        assert "Confirm with your PIN on your phone" in shown.text
        assert 'name="step" value="confirm"' in shown.text
    # nothing was paid by showing the step
    assert requests.get(page, timeout=5).status_code == 200
    confirm = {"step": "confirm", "phone": "0700000001", "form_token": form_token(shown.text)}
    confirmed = requests.post(page, data=confirm, timeout=5)
    assert outcome_of(confirmed) == "success"


def form_token(html: str) -> str:
    return re.search(r'name="form_token" value="([0-9a-f]+)"', html).group(1)


@pytest.mark.parametrize(
    "sent",
    [
        {},  # a page of another site: it cannot read the PIN step
        {"form_token": ""},
        {"form_token": "0" * 64},
        {"form_token": "of another session"},
    ],
)
def test_a_confirmation_without_the_pin_step_token_pays_nothing(api, sandbox, sent):
    """A cross-site form POSTs ``step=confirm`` straight to the page: refused 403, the
    session still open and no payment; the page's own form then pays."""
    session = api.session(api.customer(), api.product())
    other = api.session(api.customer(), api.product())
    page = f"{sandbox.checkout_url}/checkout/{session['id']}"
    if sent.get("form_token") == "of another session":
        shown = requests.get(
            f"{sandbox.checkout_url}/checkout/{other['id']}",
            params={"step": "pin", "phone": "0700000001"},
            timeout=5,
        )
        sent = {"form_token": form_token(shown.text)}
    data = {"step": "confirm", "phone": "0700000001", **sent}
    forged = requests.post(page, data=data, headers={"Origin": "https://evil.example"}, timeout=5)
    assert forged.status_code == 403 and outcome_of(forged) == "invalid_form"
    assert sandbox.object("checkout_session", session["id"])["status"] == "open"
    assert sandbox.objects("payment") == [] and sandbox.objects("subscription") == []

    assert outcome_of(sandbox.complete_checkout(session["id"], "0700000001")) == "success"
    assert sandbox.object("checkout_session", session["id"])["status"] == "completed"


def test_an_empty_phone_number_gets_a_clear_message(api, sandbox):
    session = api.session(api.customer(), api.product())
    page = f"{sandbox.checkout_url}/checkout/{session['id']}"
    for data in (
        {"step": "phone", "phone": ""},
        {"step": "phone", "phone": "   "},
        {"step": "phone"},
    ):
        answer = requests.post(page, data=data, timeout=5)
        assert answer.status_code == 400 and outcome_of(answer) == "missing_phone"
        assert "Enter your mobile-money phone number" in answer.text
        assert 'name="phone"' in answer.text and " novalidate>" in answer.text
    pin = requests.get(page, params={"step": "pin", "phone": ""}, timeout=5)
    assert pin.status_code == 400 and outcome_of(pin) == "missing_phone"


def test_the_dashboard_shows_readable_times(api, sandbox):
    sandbox.config(max_attempts=1, retry_schedule=[0.01])
    sandbox.set_callback("http://127.0.0.1:9/unreachable")
    sub = api.post(
        "/subscriptions",
        {
            "customer": api.customer()["id"],
            "product": api.product()["id"],
            "selected_currency": "XOF",
            "selected_billing_cycle": "months-1",
        },
    ).json()["data"][0]
    sandbox.trigger("subscription.canceled", sub["id"])
    assert sandbox.wait_for_deliveries(5)
    html = requests.get(sandbox.url + "/_sandbox/", timeout=5).text
    deliveries = html.split("Deliveries (latest first)")[1]
    assert "subscription.canceled" in deliveries
    assert len(READABLE.findall(deliveries)) >= 2  # created, last attempt
    assert '"at":' not in deliveries and "&quot;at&quot;" not in deliveries  # no raw JSON
    assert not re.search(r"\b1\d{9}(\.\d+)?\b", deliveries)  # no epoch numbers
    assert READABLE.search(html.split("Sandbox time:")[1])


def test_the_root_is_an_index_page(sandbox):
    answer = requests.get(sandbox.url + "/", timeout=5)
    assert answer.status_code == 200 and answer.headers["Content-Type"].startswith("text/html")
    assert 'href="/_sandbox/"' in answer.text and "/v1/api/billing/" in answer.text
    assert "docs/sandbox.md" in answer.text


def test_no_other_site_may_frame_the_pages(api, sandbox):
    """The dashboard's forms and the checkout's buttons cannot be laid under a decoy."""
    session = api.session(api.customer(), api.product())
    for path in ("/", "/_sandbox/", f"/checkout/{session['id']}", "/checkout/unknown"):
        page = requests.get(sandbox.url + path, timeout=5)
        assert page.headers["Content-Type"].startswith("text/html")
        assert page.headers.get("X-Frame-Options") == "DENY", path
