"""The hosted checkout page, signed event delivery with retries, the trigger and the clock."""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from billing_integration.testing import sign_webhook

from .conftest import TS_RE, UUID_RE

ROOT = Path(__file__).resolve().parents[2]


class Receiver:
    """A local callback that answers ``fail_first`` non-2xx responses, then 200."""

    def __init__(self, fail_first: int = 0, status: int = 500) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.fail_first = fail_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                code = status if len(outer.received) <= outer.fail_first else 200
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/billing/webhook/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self) -> list[dict]:
        return [json.loads(body) for _, body in self.received]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


def outcome_of(response: requests.Response) -> str:
    return response.text.split('data-outcome="', 1)[1].split('"', 1)[0]


# -- checkout page ----------------------------------------------------------------------------


def test_page_shows_product_price_cycle_and_phone_field(api, sandbox):
    product, customer = api.product(name="Gold <plan>"), api.customer()
    session = api.session(customer, product)
    page = requests.get(f"{sandbox.checkout_url}/checkout/{session['id']}", timeout=5)
    assert page.status_code == 200
    assert "Gold &lt;plan&gt;" in page.text and "<plan>" not in page.text  # escaped
    assert "5000 XOF" in page.text and "every month" in page.text
    assert 'name="phone"' in page.text
    step = requests.post(
        f"{sandbox.checkout_url}/checkout/{session['id']}",
        data={"step": "phone", "phone": "0700000001"},
        timeout=5,
    )
    assert "Confirm with your PIN on your phone" in step.text
    assert "I entered my PIN" in step.text


def test_success_enrols_the_customer(api, sandbox, receiver):
    sandbox.set_callback(receiver.url)
    product, customer = api.product(), api.customer()
    session = api.session(customer, product)
    before = sandbox.now()
    result = sandbox.complete_checkout(session["id"], "0700000001")
    assert result.status_code == 200 and outcome_of(result) == "success"
    subs = api.get("/subscriptions").json()["data"]
    assert len(subs) == 1
    sub = subs[0]
    assert sub["customer"] == customer["id"] and sub["product"] == product["id"]
    assert sub["status"] == "published" and sub["selected_billing_cycle"] == "months-1"
    assert sub["selected_currency"] == "XOF"
    start, end = parse(sub["cycle_start_date"]), parse(sub["cycle_end_date"])
    assert sub["cycle_start_date"] >= before
    assert (end.year * 12 + end.month) - (start.year * 12 + start.month) == 1
    assert sub["next_billing_date"] == sub["cycle_end_date"]
    stored = sandbox.object("checkout_session", session["id"])
    assert stored["status"] == "completed" and TS_RE.match(stored["completed_at"])
    assert sandbox.wait_for_deliveries(5)
    types = [e["type"] for e in receiver.events()]
    assert types == ["payment.completed", "invoice.paid"]
    payment = receiver.events()[0]["data"]
    assert payment["status"] == "completed" and payment["amount"] == 5000
    assert payment["currency"] == "XOF" and payment["subscription"] == sub["id"]
    assert payment["customer"] == customer["id"] and payment["failure_reason"] is None
    assert UUID_RE.match(payment["invoice"])
    again = requests.get(f"{sandbox.checkout_url}/checkout/{session['id']}", timeout=5)
    assert again.status_code == 200 and outcome_of(again) == "completed"
    assert "already completed" in again.text


@pytest.mark.parametrize(
    "phone,reason", [("0700000002", "declined"), ("0700000003", "insufficient_funds")]
)
def test_failing_numbers(api, sandbox, phone, reason):
    product, customer = api.product(), api.customer()
    session = api.session(customer, product)
    result = sandbox.complete_checkout(session["id"], phone)
    assert result.status_code == 402 and outcome_of(result) == reason
    assert api.get("/subscriptions").json()["data"] == []
    assert sandbox.object("checkout_session", session["id"])["status"] == "open"
    events = sandbox.events()
    assert [e["type"] for e in events] == ["payment.failed"]
    assert events[0]["data"]["failure_reason"] == reason
    assert events[0]["data"]["status"] == "failed"


def test_never_confirmed_number_lets_the_session_expire(api, sandbox):
    product, customer = api.product(), api.customer()
    session = api.session(customer, product)
    result = sandbox.complete_checkout(session["id"], "0700000004")
    assert outcome_of(result) == "pending"
    assert sandbox.object("checkout_session", session["id"])["status"] == "open"
    assert sandbox.events() == []
    summary = sandbox.advance(301)
    assert summary["expired_sessions"] == 1
    assert sandbox.object("checkout_session", session["id"])["status"] == "expired"
    page = requests.get(f"{sandbox.checkout_url}/checkout/{session['id']}", timeout=5)
    assert page.status_code == 410 and "expired" in page.text


def test_return_url_from_config(api, sandbox):
    product, customer = api.product(), api.customer()
    session = api.session(customer, product)
    sandbox.config(return_url="http://platform.test/billing/return/?session={session_id}")
    done = sandbox.complete_checkout(session["id"], "0700000001")
    expected = f"http://platform.test/billing/return/?session={session['id']}"
    assert f'href="{expected}"' in done.text and 'http-equiv="refresh"' in done.text
    sandbox.config(return_url="http://platform.test/back/{session_id}")
    other = api.session(customer, product)
    done = sandbox.complete_checkout(other["id"], "0700000009")
    assert f'href="http://platform.test/back/{other["id"]}"' in done.text


def test_invalid_phone_and_unknown_session(api, sandbox):
    product, customer = api.product(), api.customer()
    session = api.session(customer, product)
    bad = requests.post(
        f"{sandbox.checkout_url}/checkout/{session['id']}",
        data={"step": "phone", "phone": "call me"},
        timeout=5,
    )
    assert bad.status_code == 400 and outcome_of(bad) == "invalid_phone"
    missing = requests.get(
        f"{sandbox.checkout_url}/checkout/00000000-0000-0000-0000-000000000000", timeout=5
    )
    assert missing.status_code == 404


def test_one_time_product_checkout_pays_without_subscription(api, sandbox):
    product = api.product(subscription_blueprint=None, prices=[{"currency": 1, "amount": 700}])
    customer = api.customer()
    session = api.session(customer, product, selected_billing_cycle=None)
    assert session["selected_billing_cycle"] is None
    done = sandbox.complete_checkout(session["id"])
    assert outcome_of(done) == "success"
    assert api.get("/subscriptions").json()["data"] == []
    payment = sandbox.events("payment.completed")[0]["data"]
    assert payment["amount"] == 700 and payment["subscription"] is None


# -- event delivery ---------------------------------------------------------------------------


def test_deliveries_are_signed_per_standard_webhooks(api, sandbox, receiver):
    sandbox.set_callback(receiver.url)
    sub = api.post(
        "/subscriptions",
        {
            "customer": api.customer()["id"],
            "product": api.product()["id"],
            "selected_currency": "XOF",
            "selected_billing_cycle": "months-1",
        },
    ).json()["data"][0]
    event = sandbox.trigger("subscription.canceled", sub["id"])
    assert sandbox.wait_for_deliveries(5)
    headers, body = receiver.received[0]
    assert sandbox.webhook_secret.startswith("whsec_")
    verified = Webhook(sandbox.webhook_secret).verify(body, headers)
    assert verified == event
    assert headers["webhook-id"] == event["id"]
    assert headers["webhook-signature"].startswith("v1,")
    assert headers["content-type"] == "application/json"
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + "A" * 32).verify(body, headers)
    # the helper users' tests call signs the same way
    mine = sign_webhook(
        body,
        sandbox.webhook_secret,
        msg_id=headers["webhook-id"],
        timestamp=int(headers["webhook-timestamp"]),
    )
    assert mine["webhook-signature"] == headers["webhook-signature"]


def _listed_keys(text: str) -> tuple[list[str], list[str]]:
    """The keys a page lists for a delivery (``each ... {"seq", "id", ...}``) and for an item of
    its ``log`` (up to ``webhook-timestamp``), in the page's order."""
    found = re.search(r'each\s+(?:item\s+)?`\{.*?webhook-timestamp["`]', text, re.S)
    assert found, "the page no longer lists a delivery's keys"
    listed = re.sub(r"\(`pending`[^)]*\)", "", found[0])  # the status values
    delivery, _, log = listed.partition("}")
    keys = re.findall(r'"([\w-]+)"', delivery)
    return keys, [k for k in re.findall(r'[`"]([a-z][\w-]*)[`"]', log) if k != "log"]


def test_the_pages_list_the_keys_of_a_delivery(api, sandbox, receiver):
    """README ("In your own tests") and docs/sandbox.md list what ``deliveries()`` returns."""
    sandbox.set_callback(receiver.url)
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
    [delivery] = sandbox.deliveries()
    for page in (ROOT / "README.md", ROOT / "docs" / "sandbox.md"):
        keys, log = _listed_keys(page.read_text())
        assert (keys, log) == (list(delivery), list(delivery["log"][0])), page.name


class FakeDeliveryClock:
    """The delivery worker's wall clock, moved only by ``advance`` (it starts an hour ahead
    of real time, so an event queued just before is due at once)."""

    def __init__(self) -> None:
        self.now = float(int(time.time()) + 3600)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def wait_until(predicate, timeout: float = 10.0):
    """Poll ``predicate`` until it is true; fail after ``timeout`` (a bound on waiting, not a
    measurement)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {predicate}")
        time.sleep(0.01)
    return value


def test_failing_callback_is_retried_with_backoff(
    api, sandbox, billing_sandbox_server, monkeypatch
):
    worker = billing_sandbox_server.app.delivery
    clock = FakeDeliveryClock()
    monkeypatch.setattr(worker, "clock", clock)
    sandbox.config(retry_schedule=[100, 200], max_attempts=5)
    start = clock.now
    receiver = Receiver(fail_first=2, status=503)
    try:
        sandbox.set_callback(receiver.url)
        sub = api.post(
            "/subscriptions",
            {
                "customer": api.customer()["id"],
                "product": api.product()["id"],
                "selected_currency": "XOF",
                "selected_billing_cycle": "months-1",
            },
        ).json()["data"][0]
        sandbox.trigger("subscription.paused", sub["id"])

        def delivery_after(attempts: int) -> dict:
            return wait_until(
                lambda: next((d for d in sandbox.deliveries() if d["attempts"] >= attempts), None)
            )

        # The first attempt fails: the next one is scheduled retry_schedule[0] later and is
        # not made while the clock stands still.
        first = delivery_after(1)
        assert (first["status"], first["attempts"]) == ("pending", 1)
        assert first["next_attempt"] == start + 100
        worker.notify()
        assert sandbox.deliveries()[0]["attempts"] == 1 and len(receiver.received) == 1
        clock.advance(100)
        worker.notify()
        second = delivery_after(2)
        assert (second["status"], second["attempts"]) == ("pending", 2)
        assert second["next_attempt"] == start + 100 + 200  # the backoff grows
        clock.advance(200)
        worker.notify()
        assert sandbox.wait_for_deliveries(5)
        assert len(receiver.received) == 3
        ids = {h["webhook-id"] for h, _ in receiver.received}
        assert len(ids) == 1  # same message id on every attempt
        delivery = sandbox.deliveries()[0]
        assert delivery["status"] == "delivered" and delivery["attempts"] == 3
        log = delivery["log"]
        assert [a["status_code"] for a in log] == [503, 503, 200]
        assert [a["at"] - start for a in log] == [0, 100, 300]  # made when due, not before
        page = requests.get(sandbox.url + "/_sandbox/", timeout=5)
        assert "subscription.paused" in page.text and "delivered" in page.text
    finally:
        receiver.close()


def test_delivery_gives_up_after_max_attempts(api, sandbox):
    sandbox.config(max_attempts=2, retry_schedule=[0.01])
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
    delivery = sandbox.deliveries()[0]
    assert delivery["status"] == "failed" and delivery["attempts"] == 2
    assert delivery["log"][0]["error"]


# -- trigger ----------------------------------------------------------------------------------


@pytest.fixture
def subscription(api):
    return api.post(
        "/subscriptions",
        {
            "customer": api.customer()["id"],
            "product": api.product()["id"],
            "selected_currency": "XOF",
            "selected_billing_cycle": "months-1",
        },
    ).json()["data"][0]


@pytest.mark.parametrize(
    "event_type,status", [("subscription.canceled", "canceled"), ("subscription.paused", "paused")]
)
def test_trigger_subscription_state(api, sandbox, subscription, event_type, status):
    event = sandbox.trigger(event_type, subscription["id"])
    assert UUID_RE.match(event["id"]) and event["type"] == event_type
    assert TS_RE.match(event["created_at"])
    assert event["data"]["id"] == subscription["id"] and event["data"]["status"] == status
    assert TS_RE.match(event["data"]["date_updated"])
    assert api.get("/subscriptions").json()["data"][0]["status"] == status


def test_trigger_renewal_moves_the_cycle(sandbox, subscription):
    event = sandbox.trigger("subscription.renewal", subscription["id"])
    assert event["data"]["cycle_start_date"] == subscription["next_billing_date"]
    assert event["data"]["next_billing_date"] > subscription["next_billing_date"]


def test_trigger_payments_refunds_invoices(sandbox, subscription):
    paid = sandbox.trigger("payment.completed", subscription["id"])["data"]
    assert paid["status"] == "completed" and paid["subscription"] == subscription["id"]
    assert set(paid) == {
        "id",
        "status",
        "amount",
        "currency",
        "customer",
        "subscription",
        "product",
        "invoice",
        "failure_reason",
        "date_created",
        "date_updated",
    }
    failed = sandbox.trigger("payment.failed", subscription["id"], reason="insufficient_funds")
    assert failed["data"]["failure_reason"] == "insufficient_funds"
    canceled = sandbox.trigger("payment.canceled", paid["id"])["data"]
    assert canceled["id"] == paid["id"] and canceled["status"] == "canceled"
    refund = sandbox.trigger("refund.initiated", paid["id"])["data"]
    assert refund["status"] == "initiated" and refund["payment"] == paid["id"]
    assert set(refund) == {
        "id",
        "status",
        "payment",
        "amount",
        "currency",
        "customer",
        "subscription",
        "reason",
        "date_created",
        "date_updated",
    }
    approved = sandbox.trigger("refund.approved", refund["id"])["data"]
    assert approved["id"] == refund["id"] and approved["status"] == "approved"
    rejected = sandbox.trigger("refund.rejected", paid["id"])["data"]  # a new refund, rejected
    assert rejected["status"] == "rejected" and rejected["id"] != refund["id"]
    for event_type, status in [
        ("invoice.paid", "paid"),
        ("invoice.voided", "void"),
        ("invoice.marked_uncollectable", "uncollectable"),
        ("invoice.deleted", "deleted"),
    ]:
        invoice = sandbox.trigger(event_type, paid["invoice"])["data"]
        assert invoice["id"] == paid["invoice"] and invoice["status"] == status
    fresh = sandbox.trigger("invoice.voided", subscription["id"])["data"]
    assert fresh["id"] != paid["invoice"] and fresh["status"] == "void"
    assert set(fresh) == {
        "id",
        "status",
        "customer",
        "subscription",
        "product",
        "amount",
        "currency",
        "period_start",
        "period_end",
        "date_created",
        "date_updated",
    }
    assert len(sandbox.events()) == 11


def test_trigger_errors(sandbox, subscription):
    url = sandbox.url + "/_sandbox/trigger"
    assert (
        requests.post(
            url, json={"type": "subscription.exploded", "object": subscription["id"]}, timeout=5
        ).status_code
        == 400
    )
    assert (
        requests.post(
            url,
            json={
                "type": "subscription.canceled",
                "object": "00000000-0000-0000-0000-000000000000",
            },
            timeout=5,
        ).status_code
        == 404
    )
    assert (
        requests.post(
            url,
            json={"type": "subscription.canceled", "object": subscription["customer"]},
            timeout=5,
        ).status_code
        == 400
    )


# -- clock ------------------------------------------------------------------------------------


def test_clock_bills_a_renewal(api, sandbox, receiver):
    sandbox.set_callback(receiver.url)
    product, customer = api.product(), api.customer()
    session = api.session(customer, product)
    sandbox.complete_checkout(session["id"], "0700000001")
    sub = api.get("/subscriptions").json()["data"][0]
    summary = sandbox.advance(days=32)
    assert summary["renewals"] == 1
    api.token = sandbox.token()  # tokens expire on the sandbox clock too
    renewed = api.get("/subscriptions").json()["data"][0]
    assert renewed["cycle_start_date"] == sub["next_billing_date"]
    assert renewed["next_billing_date"] == renewed["cycle_end_date"] > sub["next_billing_date"]
    assert TS_RE.match(renewed["date_updated"])
    assert sandbox.wait_for_deliveries(5)
    types = [e["type"] for e in receiver.events()]
    assert types == [
        "payment.completed",
        "invoice.paid",
        "payment.completed",
        "invoice.paid",
        "subscription.renewal",
    ]
    invoice = receiver.events()[3]["data"]
    assert invoice["period_start"] == sub["next_billing_date"]
    assert invoice["period_end"] == renewed["next_billing_date"]


def test_clock_renewal_fails_for_the_failing_renewal_number(api, sandbox):
    product, customer = api.product(), api.customer()
    session = api.session(customer, product)
    sandbox.complete_checkout(session["id"], "0700000005")
    sub = api.get("/subscriptions").json()["data"][0]
    summary = sandbox.advance(days=32)
    assert summary["renewals"] == 0 and summary["payment_failures"] == 1
    api.token = sandbox.token()
    failed = sandbox.events("payment.failed")
    assert failed[0]["data"]["failure_reason"] == "insufficient_funds"
    assert (
        api.get("/subscriptions").json()["data"][0]["next_billing_date"] == sub["next_billing_date"]
    )
    sandbox.advance(days=1)
    sandbox.advance(days=1)
    api.token = sandbox.token()
    assert api.get("/subscriptions").json()["data"][0]["status"] == "canceled"
    assert len(sandbox.events("subscription.canceled")) == 1


def test_clock_ends_trials(api, sandbox):
    product, customer = api.product(), api.customer()
    clock = parse(sandbox.now())
    body = {
        "customer": customer["id"],
        "product": product["id"],
        "selected_currency": "XOF",
        "selected_billing_cycle": "months-1",
        "trial_end_date": "2099-01-01T00:00:00Z",
    }
    sub = api.post("/subscriptions", body).json()["data"][0]
    assert sub["next_billing_date"] == "2099-01-01T00:00:00.000Z"
    days = (datetime(2099, 1, 2, tzinfo=clock.tzinfo) - clock).days
    summary = sandbox.advance(days=days)
    assert summary["renewals"] >= 1
    api.token = sandbox.token()
    after = api.get("/subscriptions").json()["data"][0]
    assert after["cycle_start_date"].startswith("2099-01-01")
    assert after["next_billing_date"].startswith("2099-02-01")
