"""Odd but signed deliveries, through the real webhook view and inline processing: an event
never moves state backwards, never turns a date it cannot read into "no date", and ends
``failed`` with a clear error (never a 500, never an exception out of the worker)."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from billing_integration.models import EventState, Invoice, Payment, Refund, WebhookEvent
from billing_integration.webhooks.processing import process_event

from .conftest import (
    T0,
    as_meta,
    invoice_data,
    payment_data,
    post_signed,
    refund_data,
    sign,
    subscription_data,
    ts,
)

pytestmark = pytest.mark.django_db

OLD = datetime(2020, 1, 1, tzinfo=UTC)
URL = "/billing/webhooks/"


@pytest.fixture
def deliver(client, webhook_settings, django_capture_on_commit_callbacks):
    """POST a signed delivery (processed inline after the commit); the stored event."""

    def send(
        payload: Any = None,
        *,
        body: bytes | None = None,
        timestamp: int | None = None,
        status: int = 200,
    ) -> WebhookEvent:
        with django_capture_on_commit_callbacks(execute=True):
            response = post_signed(client, payload, body=body, timestamp=timestamp)
        assert response.status_code == status, response.content
        return WebhookEvent.objects.order_by("-pk").first()

    return send


def bare(event_type: str, data: dict[str, Any]) -> dict[str, Any]:
    """An envelope without ``created_at``."""
    return {"id": str(uuid.uuid4()), "type": event_type, "data": data}


def refs(mirror) -> dict[str, Any]:
    return {"customer": mirror.customer.remote_id, "product": mirror.product.remote_id}


def state(obj) -> dict[str, Any]:
    obj.refresh_from_db()
    return {
        f.attname: getattr(obj, f.attname)
        for f in obj._meta.concrete_fields
        if f.attname not in ("updated_at", "last_synced_at")
    }


# --- versions ----------------------------------------------------------------------------------
def test_an_event_without_any_date_takes_the_signed_timestamp_and_older_ones_are_stale(
    mirror, deliver
):
    sub = mirror.subscription
    stamp = int(time.time())
    canceled = deliver(bare("subscription.canceled", {"id": str(sub.remote_id)}), timestamp=stamp)
    assert canceled.outcome == "applied"
    sub.refresh_from_db()
    assert sub.status == "canceled"
    assert sub.remote_updated == datetime.fromtimestamp(stamp, tz=UTC)  # never null
    renewal = deliver(
        bare(
            "subscription.renewal",
            subscription_data(sub.remote_id, **refs(mirror), status="published", updated=OLD),
        )
    )
    assert renewal.state == EventState.PROCESSED and renewal.outcome == "stale"
    sub.refresh_from_db()
    assert sub.status == "canceled" and not sub.is_active
    assert sub.remote_updated == datetime.fromtimestamp(stamp, tz=UTC)


@pytest.mark.parametrize(
    "model,newer,older",
    [
        (Invoice, ("invoice.deleted", {}), ("invoice.paid", invoice_data)),
        (Payment, ("payment.failed", {}), ("payment.completed", payment_data)),
        (Refund, ("refund.rejected", {}), ("refund.approved", refund_data)),
    ],
)
def test_records_never_go_back_to_an_older_state(mirror, deliver, model, newer, older):
    rid = uuid.uuid4()
    ids = {"subscription": mirror.subscription.remote_id, "customer": mirror.customer.remote_id}
    stamp = int(time.time())
    first = deliver(
        bare(newer[0], {"id": str(rid), **{k: str(v) for k, v in ids.items()}}), timestamp=stamp
    )
    assert first.outcome == "applied"
    record = model.objects.get(remote_id=rid)
    status = record.status
    assert record.remote_updated == datetime.fromtimestamp(stamp, tz=UTC)
    kwargs: dict[str, Any] = {"status": older[0].split(".")[1], "updated": OLD, **ids}
    if model is Refund:
        kwargs["payment"] = uuid.uuid4()
    else:
        kwargs["product"] = mirror.product.remote_id
    stale = deliver(bare(older[0], older[1](rid, **kwargs)))
    assert stale.outcome == "stale"
    record.refresh_from_db()
    assert record.status == status
    assert record.remote_updated == datetime.fromtimestamp(stamp, tz=UTC)


def test_unsigned_delivery_without_dates_takes_the_receive_time(
    client, settings, mirror, django_capture_on_commit_callbacks, eager
):
    import base64

    settings.BILLING = {
        **settings.BILLING,
        "WEBHOOK_SECRET": None,
        "WEBHOOK_BASIC_AUTH": "hook:pw",
    }
    sub = mirror.subscription
    body = json.dumps(bare("subscription.paused", {"id": str(sub.remote_id)})).encode()
    auth = "Basic " + base64.b64encode(b"hook:pw").decode()
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            "/billing/webhooks/",
            data=body,
            content_type="application/json",
            HTTP_AUTHORIZATION=auth,
        )
    assert response.status_code == 200
    event = WebhookEvent.objects.get()
    assert event.outcome == "applied" and event.verified_by == "basic"
    sub.refresh_from_db()
    assert sub.status == "paused" and sub.remote_updated == event.received_at


# --- dates that cannot be read -----------------------------------------------------------------
JUNK_DATES = [
    "31/12/2026",
    20261231,
    "2026-12-31T00:00:00+25:00",
    "9999-12-31T23:59:59-05:00",
    "tomorrow",
    True,
]


@pytest.mark.parametrize("value", JUNK_DATES, ids=repr)
@pytest.mark.parametrize("field", ["cycle_end_date", "trial_end_date", "date_updated"])
def test_a_date_that_does_not_parse_fails_the_event_and_changes_nothing(
    mirror, deliver, field, value
):
    sub = mirror.subscription
    before = state(sub)
    data = subscription_data(
        sub.remote_id,
        **refs(mirror),
        updated=T0 + timedelta(days=30),
        start=T0 + timedelta(days=30),
    )
    data[field] = value
    event = deliver(bare("subscription.renewal", data))
    assert event.state == EventState.FAILED and event.attempts == 1
    assert field in event.error and "not a timestamp" in event.error
    assert (repr(value) if not isinstance(value, str) else value) in event.error
    assert state(sub) == before  # not nulled, not moved


@pytest.mark.parametrize("value", [None, "", "missing"])
def test_null_or_missing_dates_remain_no_date(mirror, deliver, value):
    sub = mirror.subscription
    data = subscription_data(sub.remote_id, **refs(mirror), updated=T0 + timedelta(days=30))
    if value == "missing":
        del data["trial_end_date"]
    else:
        data["trial_end_date"] = value
    data["cycle_end_date"] = None
    event = deliver(bare("subscription.renewal", data))
    assert event.outcome == "applied", event.error
    sub.refresh_from_db()
    assert sub.cycle_end_date is None and sub.trial_end_date is None


def test_an_envelope_time_that_does_not_parse_fails_the_event(mirror, deliver):
    sub = mirror.subscription
    before = state(sub)
    payload = {
        **bare("subscription.canceled", {"id": str(sub.remote_id)}),
        "created_at": "9999-12-31T23:59:59-05:00",
    }
    event = deliver(payload)
    assert event.state == EventState.FAILED
    assert "created_at" in event.error and "9999-12-31T23:59:59-05:00" in event.error
    assert state(sub) == before


def test_a_long_junk_value_is_cut_in_the_error(mirror, deliver):
    data = subscription_data(mirror.subscription.remote_id, **refs(mirror))
    data["cycle_end_date"] = "x" * 5000
    event = deliver(bare("subscription.renewal", data))
    assert event.state == EventState.FAILED
    assert "cycle_end_date" in event.error and len(event.error) < 300


# --- values that do not fit ----------------------------------------------------------------
def test_a_status_longer_than_its_column_fails_the_event(mirror, deliver):
    """SQLite would store it; PostgreSQL would raise DataError. Run with DATABASE_URL too."""
    sub = mirror.subscription
    before = state(sub)
    data = subscription_data(
        sub.remote_id,
        **refs(mirror),
        updated=T0 + timedelta(days=30),
        status="published" + "x" * 4991,
    )
    event = deliver(bare("subscription.renewal", data))
    assert event.state == EventState.FAILED
    assert event.error.startswith("RemoteDataError: status: longer than 32 characters (5000)")
    assert len(event.error) < 300
    assert state(sub) == before
    # the same for a cycle code and a currency
    for field, value in (
        ("selected_billing_cycle", "months-" + "1" * 40),
        ("selected_currency", "X" * 9),
        ("status", "publ\x00ished"),  # PostgreSQL refuses NUL in text
    ):
        data = subscription_data(sub.remote_id, **refs(mirror), updated=T0 + timedelta(days=31))
        data[field] = value
        event = deliver(bare("subscription.renewal", data))
        assert event.state == EventState.FAILED and field in event.error
        assert state(sub) == before


def test_an_unknown_currency_id_is_kept_as_received_and_a_cancel_still_cancels(mirror, deliver):
    sub = mirror.subscription
    data = subscription_data(sub.remote_id, **refs(mirror), updated=T0 + timedelta(days=30))
    data["selected_currency"] = 99
    renewal = deliver(bare("subscription.renewal", data))
    assert renewal.outcome == "applied", renewal.error
    sub.refresh_from_db()
    assert sub.selected_currency == "99"
    data = dict(data, date_updated=ts(T0 + timedelta(days=31)), selected_currency="77")
    canceled = deliver(bare("subscription.canceled", data))
    assert canceled.outcome == "applied", canceled.error
    sub.refresh_from_db()
    assert sub.status == "canceled" and sub.selected_currency == "77"


def test_a_currency_id_written_with_a_zero_fraction_is_that_id(mirror, deliver):
    """1.0 is the JSON number 1 as some writers put it: a payment in it failed ("currency: not
    in BILLING['CURRENCIES']: '1.0'") and a subscription stored "1.0", a currency nobody knows."""
    sub, rid = mirror.subscription, uuid.uuid4()
    data = payment_data(rid, status="completed", subscription=sub.remote_id, **refs(mirror))
    payment = deliver(bare("payment.completed", dict(data, currency=1.0)))
    assert payment.outcome == "applied", payment.error
    assert Payment.objects.get(remote_id=rid).currency == "XOF"
    data = subscription_data(sub.remote_id, **refs(mirror), updated=T0 + timedelta(days=30))
    renewal = deliver(bare("subscription.renewal", dict(data, selected_currency=1.0)))
    assert renewal.outcome == "applied", renewal.error
    sub.refresh_from_db()
    assert sub.selected_currency == "XOF"


# --- bodies that are not JSON --------------------------------------------------------------
@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_nan_and_infinity_are_stored_and_the_event_failed(mirror, deliver, constant):
    rid = str(uuid.uuid4())
    text = json.dumps(
        {
            "id": str(uuid.uuid4()),
            "type": "payment.completed",
            "data": {"id": rid, "status": "completed", "amount": "AMOUNT", "currency": "XOF"},
        }
    )
    text = text.replace('"AMOUNT"', constant)
    # Signed and stored (200: the service need not resend it), then failed by processing.
    event = deliver(body=text.encode())
    assert event.body == text and event.type == "payment.completed"
    assert event.state == EventState.FAILED, event.error
    assert "The body is not strict JSON" in event.error
    assert not Payment.objects.filter(remote_id=rid).exists()
    # A replay fails it again, never applies it.
    result = process_event(event.pk, force=True)
    assert result.state == EventState.FAILED
    assert not Payment.objects.filter(remote_id=rid).exists()


def test_a_stored_body_nested_deeper_than_processing_reads_fails_as_unreadable(mirror):
    """The endpoint reads a body higher in the stack than processing does: one nested some
    900 levels deep was stored (200), then failed by processing with a bare ``RecursionError``
    and its traceback. It now fails as a body processing cannot read, as NaN does."""
    rid = str(uuid.uuid4())
    text = json.dumps(bare("payment.completed", {"id": rid, "amount": 1, "x": "NESTED"}))
    text = text.replace('"NESTED"', "[" * 100_000 + "]" * 100_000)  # deeper than any stack
    event = WebhookEvent.objects.create(
        event_id="deep", type="payment.completed", raw_type="payment.completed", body=text
    )
    for force in (False, True):  # a replay fails it again
        assert process_event(event.pk, force=force).state == EventState.FAILED
        event.refresh_from_db()
        assert (event.state, event.outcome) == (EventState.FAILED, "")
        assert event.error.startswith("EventDataError: The body is nested too deep to be read")
    assert not Payment.objects.filter(remote_id=rid).exists()


def test_a_nul_or_a_lone_surrogate_in_a_field_no_column_holds_never_fails_the_event(
    mirror, deliver
):
    """PostgreSQL's ``jsonb`` refuses both: the event failed there (a cancel not applied, a
    payment not recorded); ``remote_data`` keeps U+FFFD, the texts cut to their column too."""
    sub = mirror.subscription
    data = subscription_data(sub.remote_id, **refs(mirror), updated=T0 + timedelta(days=30))
    data.update(note="a\x00b", meta={"k\x00": ["\ud800"]})
    canceled = deliver(bare("subscription.canceled", data))
    assert (canceled.state, canceled.outcome) == (EventState.PROCESSED, "applied"), canceled.error
    sub.refresh_from_db()
    assert sub.status == "canceled"
    assert sub.remote_data["note"] == "a\ufffdb" and sub.remote_data["meta"] == {
        "k\ufffd": ["\ufffd"]
    }
    rid = uuid.uuid4()
    data = payment_data(
        rid,
        status="failed",
        subscription=sub.remote_id,
        failure_reason="no\x00 funds\ud800",
        **refs(mirror),
    )
    data["note"] = "\x00"
    failed = deliver(bare("payment.failed", data))
    assert failed.outcome == "applied", failed.error
    payment = Payment.objects.get(remote_id=rid)
    assert payment.status == "failed" and payment.remote_data["note"] == "\ufffd"
    assert payment.failure_reason == "no\ufffd funds\ufffd"


def test_a_record_currency_with_a_nul_or_a_lone_surrogate_is_stored_cleaned(mirror, deliver):
    """An invoice's currency is kept as received when unknown: with a NUL (PostgreSQL) or a
    lone surrogate (every database) the event failed, the invoice never recorded."""
    rid = uuid.uuid4()
    data = invoice_data(
        rid, status="paid", subscription=mirror.subscription.remote_id, **refs(mirror)
    )
    data["currency"] = "X\x00\ud800"
    event = deliver(bare("invoice.paid", data))
    assert event.outcome == "applied", event.error
    assert Invoice.objects.get(remote_id=rid).currency == "X\ufffd\ufffd"


# --- values of the wrong type ------------------------------------------------------------------
def _record(event_type: str, rid: uuid.UUID, mirror) -> dict[str, Any]:
    sub, customer = mirror.subscription.remote_id, mirror.customer.remote_id
    if event_type.startswith("payment."):
        return payment_data(rid, status="failed", subscription=sub, **refs(mirror))
    if event_type.startswith("refund."):
        pay = uuid.uuid4()
        return refund_data(
            rid, status="initiated", payment=pay, subscription=sub, customer=customer
        )
    return invoice_data(rid, status="paid", subscription=sub, **refs(mirror))


@pytest.mark.parametrize("value", [{"code": "x"}, ["x"], True], ids=repr)
@pytest.mark.parametrize(
    ("event_type", "field"),
    [
        ("payment.failed", "failure_reason"),
        ("refund.initiated", "reason"),
        ("invoice.paid", "currency"),
    ],
)
def test_a_record_text_that_is_no_text_fails_the_event_naming_it(
    mirror, deliver, event_type, field, value
):
    """It was stored as Python's text of it (``"{'code': 'x'}"``, ``"True"``)."""
    rid = uuid.uuid4()
    data = _record(event_type, rid, mirror)
    data[field] = value
    event = deliver(bare(event_type, data))
    assert event.state == EventState.FAILED
    assert event.error.startswith(f"RemoteDataError: {field}: not a string"), event.error
    assert not any(m.objects.filter(remote_id=rid).exists() for m in (Payment, Refund, Invoice))


@pytest.mark.parametrize("value", ["cust-1", 12, {"id": "x"}], ids=repr)
@pytest.mark.parametrize("field", ["customer", "product"])
def test_a_subscription_reference_that_is_no_uuid_fails_the_event_and_keeps_the_link(
    mirror, deliver, field, value
):
    """It was read as "no customer" (or product): the subscription lost its link, and with it
    its subscriber's access, silently."""
    sub = mirror.subscription
    before = state(sub)
    data = subscription_data(sub.remote_id, **refs(mirror), updated=T0 + timedelta(days=30))
    data[field] = value
    event = deliver(bare("subscription.canceled", data))
    assert event.state == EventState.FAILED
    assert event.error.startswith(f"RemoteDataError: {field}: not a UUID"), event.error
    assert state(sub) == before


@pytest.mark.parametrize("field", ["customer", "product"])
def test_a_reference_given_as_the_whole_object_is_read_as_its_id(mirror, deliver, field):
    """A service may expand a reference into the object it names: its ``id`` is the link."""
    sub = mirror.subscription
    linked = {"customer": mirror.customer, "product": sub.product}[field]
    data = subscription_data(sub.remote_id, **refs(mirror), updated=T0 + timedelta(days=30))
    data[field] = {"id": str(linked.remote_id).upper(), "status": "published"}
    event = deliver(bare("subscription.canceled", data))
    assert event.outcome == "applied", event.error
    sub.refresh_from_db()
    assert sub.status == "canceled"
    assert getattr(sub, f"{field}_id") == linked.pk


def test_a_payment_naming_its_subscription_as_the_whole_object_shows_on_it(mirror, deliver):
    """The subscription is read from ``{"id": ...}`` for the link and for its last payment."""
    rid, sub = uuid.uuid4(), mirror.subscription
    data = _record("payment.failed", rid, mirror)
    data["subscription"] = {"id": str(sub.remote_id), "status": "active"}
    event = deliver(bare("payment.failed", data))
    assert event.outcome == "applied", event.error
    assert Payment.objects.get(remote_id=rid).subscription_id == sub.pk
    sub.refresh_from_db()
    assert sub.last_payment_status == "failed"


@pytest.mark.parametrize("field", ["customer", "subscription", "product", "invoice"])
def test_a_record_reference_that_is_no_uuid_fails_the_event(mirror, deliver, field):
    rid = uuid.uuid4()
    data = _record("payment.completed", rid, mirror)
    original = data[field] or str(uuid.uuid4())  # payment_data has no invoice
    data[field] = "sub-1"
    event = deliver(bare("payment.completed", data))
    assert event.state == EventState.FAILED
    assert event.error.startswith(f"RemoteDataError: {field}: not a UUID"), event.error
    assert not Payment.objects.filter(remote_id=rid).exists()
    # Spelled otherwise (capitals, braces), a UUID is one.
    data[field] = "{" + original.upper() + "}"
    event = deliver(bare("payment.completed", data))
    assert event.outcome == "applied", event.error
    assert Payment.objects.get(remote_id=rid).customer_id == mirror.customer.pk


# --- the data's wrapping -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "wrap",
    [
        lambda d: {"data": d},  # an API answer's wrapping, kept in the event
        lambda d: [d],  # a list of one, as an API answer may be
        lambda d: {"data": [d]},
        lambda d: {"object": d},
    ],
    ids=["data.data", "list", "data.data-list", "data.object"],
)
def test_the_resource_wrapped_once_more_or_in_a_list_of_one_is_applied(mirror, deliver, wrap):
    """It was ``unrecognised`` (the data has no id): a cancel never applied."""
    sub = mirror.subscription
    data = subscription_data(sub.remote_id, **refs(mirror), updated=T0 + timedelta(days=30))
    event = deliver(bare("subscription.canceled", wrap(data)))
    assert (event.state, event.outcome) == (EventState.PROCESSED, "applied"), event.error
    assert event.object_id == str(sub.remote_id)
    sub.refresh_from_db()
    assert sub.status == "canceled"


def test_a_body_starting_with_a_byte_order_mark_is_read(mirror, deliver):
    """Some JSON writers start UTF-8 with one: the delivery was rejected (400, "Malformed
    JSON"), and a rejected delivery is never processed nor replayed: the cancel was lost."""
    sub = mirror.subscription
    data = subscription_data(sub.remote_id, **refs(mirror), updated=T0 + timedelta(days=30))
    body = "\ufeff".encode() + json.dumps(bare("subscription.canceled", data)).encode()
    event = deliver(body=body)
    assert (event.state, event.outcome) == (EventState.PROCESSED, "applied"), event.error
    sub.refresh_from_db()
    assert sub.status == "canceled"


@pytest.mark.parametrize(
    ("encoding", "content_type"),
    [
        ("latin-1", "application/json; charset=ISO-8859-1"),
        ("cp1252", "application/json; charset=windows-1252"),
        ("utf-16", "application/json; charset=utf-16"),
        ("utf-16-le", "application/json; charset=utf-16le"),  # no byte order mark
    ],
)
def test_a_body_in_the_charset_its_content_type_names_is_read(
    mirror, client, webhook_settings, django_capture_on_commit_callbacks, encoding, content_type
):
    """A verified delivery whose text is not UTF-8 was rejected (400, "The body is not UTF-8")
    though its Content-Type named its charset, and a rejected delivery is never processed nor
    replayed: the failed payment was lost."""
    rid = uuid.uuid4()
    data = payment_data(
        rid,
        status="failed",
        subscription=mirror.subscription.remote_id,
        failure_reason="Crédit insuffisant",
        **refs(mirror),
    )
    body = json.dumps(bare("payment.failed", data), ensure_ascii=False).encode(encoding)
    headers = as_meta(sign(body))
    with django_capture_on_commit_callbacks(execute=True):
        # generic(): the test client's post() would encode the body again in the charset
        response = client.generic("POST", URL, body, content_type=content_type, **headers)
    assert response.status_code == 200, response.content
    event = WebhookEvent.objects.get(event_id=response.json()["id"])
    assert (event.state, event.outcome) == (EventState.PROCESSED, "applied"), event.error
    assert Payment.objects.get(remote_id=rid).failure_reason == "Crédit insuffisant"


def test_a_body_neither_utf_8_nor_in_the_charset_named_is_rejected_naming_both(
    client, webhook_settings
):
    body = '{"type": "payment.failed", "data": {"id": "é"}}'.encode("latin-1")
    headers = as_meta(sign(body))
    response = client.generic("POST", URL, body, content_type="application/json", **headers)
    assert response.status_code == 400
    assert response.json() == {"error": "The body is not UTF-8."}
    body = b'{"data": {"id": "\x81"}}'  # 0x81 has no character in windows-1252
    headers = as_meta(sign(body))
    content_type = "application/json; charset=windows-1252"
    response = client.generic("POST", URL, body, content_type=content_type, **headers)
    assert response.status_code == 400
    assert response.json() == {"error": "The body is neither UTF-8 nor windows-1252."}
    # a codec Python knows that is no text encoding (hex, zlib), or fails otherwise (idna)
    for charset in ("hex", "zlib", "idna"):
        content_type = f"application/json; charset={charset}"
        body = '{"data": {"id": "é"}}'.encode("latin-1")
        headers = as_meta(sign(body))
        response = client.generic("POST", URL, body, content_type=content_type, **headers)
        assert response.status_code == 400, charset
        assert response.json() == {"error": f"The body is neither UTF-8 nor {charset}."}


# --- data that carries only some fields --------------------------------------------------------
@pytest.mark.parametrize(
    ("first", "then"),
    [
        ("payment.failed", "payment.completed"),
        ("refund.initiated", "refund.approved"),
        ("invoice.paid", "invoice.voided"),
    ],
)
def test_a_record_event_with_only_some_fields_keeps_the_others(mirror, deliver, first, then):
    """A later event whose data is only ``id``, ``status`` and ``date_updated`` nulled the
    amount, the currency, the links to subscription, customer, payment, the dates and texts."""
    rid = uuid.uuid4()
    data = _record(first, rid, mirror)
    if first.startswith("payment."):
        data["failure_reason"] = "insufficient_funds"
    model = {"payment": Payment, "refund": Refund, "invoice": Invoice}[first.split(".")[0]]
    assert deliver(bare(first, data)).outcome == "applied"
    before = state(model.objects.get(remote_id=rid))
    partial = {"id": str(rid), "status": then.split(".")[1], "date_updated": ts(T0 + timedelta(1))}
    event = deliver(bare(then, partial))
    assert event.outcome == "applied", event.error
    after = state(model.objects.get(remote_id=rid))
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {"status", "remote_updated", "remote_data"}
    assert after["remote_data"] == partial  # the data as received
    if model is Payment:  # its subscription follows it, named by the stored payment
        mirror.subscription.refresh_from_db()
        assert mirror.subscription.last_payment_status == "completed"


@pytest.mark.parametrize(("value", "renews"), [("0", False), (" 1 ", True), ("false", False)])
def test_auto_renew_as_the_text_of_0_or_1_is_read_as_the_boolean_it_says(
    mirror, deliver, value, renews
):
    """0 and 1 were read, their text was not: the cancel failed ("not a boolean")."""
    sub = mirror.subscription
    data = subscription_data(sub.remote_id, **refs(mirror), updated=T0 + timedelta(days=30))
    data["auto_renew"] = value
    event = deliver(bare("subscription.canceled", data))
    assert event.outcome == "applied", event.error
    sub.refresh_from_db()
    assert (sub.status, sub.auto_renew) == ("canceled", renews)


def test_a_timestamp_with_a_lower_case_z_is_read(mirror, deliver):
    """RFC 3339 allows ``t`` and ``z`` in lower case: the event failed ("not a timestamp")."""
    sub = mirror.subscription
    data = subscription_data(sub.remote_id, **refs(mirror))
    data.update(date_updated="2026-02-01t10:00:00.000z", cycle_end_date="2026-03-01t00:00:00z")
    event = deliver(bare("subscription.renewal", data))
    assert event.outcome == "applied", event.error
    sub.refresh_from_db()
    assert sub.remote_updated == datetime(2026, 2, 1, 10, tzinfo=UTC)
    assert sub.cycle_end_date == datetime(2026, 3, 1, tzinfo=UTC)


def test_a_status_the_type_overrides_is_not_read(mirror, deliver):
    """The type decides a payment's status: its data's status, even an object, is not read."""
    rid = uuid.uuid4()
    data = _record("payment.completed", rid, mirror)
    data["status"] = {"code": "succeeded"}
    event = deliver(bare("payment.completed", data))
    assert event.outcome == "applied", event.error
    assert Payment.objects.get(remote_id=rid).status == "completed"


# --- null references and statuses ----------------------------------------------------------------
@pytest.mark.parametrize("nulled", ["status", "customer", "product"])
def test_a_null_status_customer_or_product_in_a_subscription_event_keeps_the_stored_one(
    mirror, deliver, nulled
):
    """The interface never says a subscription loses its customer, product or status; a null
    one in an event is read as "not sent", as an absent one is. The other fields apply."""
    sub = mirror.subscription
    sub.refresh_from_db()
    before = {"status": sub.status, "customer": sub.customer_id, "product": sub.product_id}
    later = datetime.now(tz=UTC).replace(microsecond=0)
    data = subscription_data(sub.remote_id, **refs(mirror), start=later, updated=later)
    data[nulled] = None
    event = deliver(bare("subscription.renewal", data))
    assert event.state == EventState.PROCESSED and event.outcome == "applied", event.error
    sub.refresh_from_db()
    assert {"status": sub.status, "customer": sub.customer_id, "product": sub.product_id} == before
    assert sub.customer_remote_id == mirror.customer.remote_id
    assert sub.product_remote_id == mirror.product.remote_id
    assert sub.cycle_start_date == later  # the rest of the event applied


@pytest.mark.parametrize("empty", [None, ""])
@pytest.mark.parametrize("nulled", ["selected_billing_cycle", "selected_currency"])
def test_a_null_cycle_or_currency_in_a_subscription_event_keeps_the_stored_one(
    mirror, deliver, nulled, empty
):
    """A subscription always has a cycle and a currency (the interface types both as strings,
    never null): a null or empty one is "not sent". It cleared the stored one, so the
    subscriber's plan showed no price and the checkout button no longer knew the plan held."""
    from billing_integration.models import Subscription
    from billing_integration.outbox import from_remote

    sub = mirror.subscription
    before = ("months-1", "XOF")
    with from_remote():
        Subscription.objects.filter(pk=sub.pk).update(
            selected_billing_cycle=before[0], selected_currency=before[1]
        )
    later = datetime.now(tz=UTC).replace(microsecond=0)
    data = subscription_data(sub.remote_id, **refs(mirror), start=later, updated=later)
    data[nulled] = empty
    event = deliver(bare("subscription.renewal", data))
    assert event.outcome == "applied", event.error
    sub.refresh_from_db()
    assert (sub.selected_billing_cycle, sub.selected_currency) == before
    assert sub.cycle_start_date == later  # the rest of the event applied


@pytest.mark.parametrize("stored", [True, False])
def test_a_null_auto_renew_in_a_subscription_event_keeps_the_stored_one(mirror, deliver, stored):
    """``auto_renew: null`` is "not sent", as an absent one is: renewal neither stops (the
    subscriber would be offered the plan again while it renews) nor restarts."""
    from billing_integration.models import Subscription
    from billing_integration.outbox import from_remote

    with from_remote():
        Subscription.objects.filter(pk=mirror.subscription.pk).update(auto_renew=stored)
    sub = mirror.subscription
    later = datetime.now(tz=UTC).replace(microsecond=0)
    data = subscription_data(sub.remote_id, **refs(mirror), start=later, updated=later)
    data["auto_renew"] = None
    event = deliver(bare("subscription.renewal", data))
    assert event.outcome == "applied", event.error
    sub.refresh_from_db()
    assert sub.auto_renew is stored
    assert sub.cycle_start_date == later  # the rest of the event applied


@pytest.mark.parametrize("stored", [True, False, None], ids=["stored-on", "stored-off", "new"])
def test_an_empty_auto_renew_in_a_subscription_event_is_read_as_null(mirror, deliver, stored):
    """``auto_renew: ""`` is null: a stored subscription keeps its flag, a new one renews (the
    interface's default). The event failed ("auto_renew: not a boolean: ''")."""
    from billing_integration.models import Subscription
    from billing_integration.outbox import from_remote

    remote_id = mirror.subscription.remote_id if stored is not None else uuid.uuid4()
    with from_remote():
        Subscription.objects.filter(remote_id=remote_id).update(auto_renew=bool(stored))
    later = datetime.now(tz=UTC).replace(microsecond=0)
    data = subscription_data(remote_id, **refs(mirror), start=later, updated=later)
    data["auto_renew"] = ""
    event = deliver(bare("subscription.renewal", data))
    assert (event.state, event.outcome) == (EventState.PROCESSED, "applied"), event.error
    sub = Subscription.objects.get(remote_id=remote_id)
    assert sub.auto_renew is (True if stored is None else stored)
    assert sub.cycle_start_date == later  # the rest of the event applied


#: A record's model, the type of a first event of it and of a later one.
RECORD_EVENTS = [
    (Payment, "payment.failed", "payment.completed"),
    (Refund, "refund.initiated", "refund.approved"),
    (Invoice, "invoice.paid", "invoice.voided"),
]


@pytest.mark.parametrize("model, first_type, later_type", RECORD_EVENTS)
@pytest.mark.parametrize("empty", [None, ""])
def test_a_null_amount_or_currency_in_a_later_event_keeps_the_stored_one(
    mirror, deliver, model, first_type, later_type, empty
):
    """A payment, refund or invoice never loses its amount or currency on the service; a later
    event sending them null (a currency empty) is read as "not sent", as one leaving them out
    is: revenue and refunds stay counted in their currency. The other fields apply."""
    rid = uuid.uuid4()
    links = {"subscription": mirror.subscription.remote_id, "customer": mirror.customer.remote_id}
    make = {Payment: payment_data, Refund: refund_data, Invoice: invoice_data}[model]
    if model is Refund:
        links["payment"] = uuid.uuid4()
    else:
        links["product"] = mirror.product.remote_id
    first = make(rid, status="x", **links, updated=T0)
    assert deliver(bare(first_type, first)).outcome == "applied"
    later = make(rid, status="x", **links, updated=T0 + timedelta(hours=1))
    later["amount"] = None
    later["currency"] = empty
    event = deliver(bare(later_type, later))
    assert event.outcome == "applied", event.error
    record = model.objects.get(remote_id=rid)
    assert (record.amount, record.currency) == (5000, "XOF")
    assert record.remote_updated == T0 + timedelta(hours=1)  # the rest of the event applied


@pytest.mark.parametrize("model, first_type, later_type", RECORD_EVENTS)
def test_an_empty_amount_in_a_later_event_keeps_the_stored_one(
    mirror, deliver, model, first_type, later_type
):
    """``"amount": ""`` is read as null, "not sent": the stored amount stays and the rest of
    the event applies. The event failed ("amount: not an amount: ''")."""
    rid = uuid.uuid4()
    first = _record(first_type, rid, mirror)
    assert deliver(bare(first_type, first)).outcome == "applied"
    later = dict(first, amount="", date_updated=ts(T0 + timedelta(hours=1)))
    event = deliver(bare(later_type, later))
    assert (event.state, event.outcome) == (EventState.PROCESSED, "applied"), event.error
    record = model.objects.get(remote_id=rid)
    assert record.amount == 5000
    assert record.remote_updated == T0 + timedelta(hours=1)  # the rest of the event applied


@pytest.mark.parametrize("empty", [None, ""])
def test_a_null_subscription_in_a_payment_event_still_shows_on_the_stored_one(
    mirror, deliver, empty
):
    """A null or empty ``subscription`` keeps the payment's stored link, as an absent one does;
    that subscription's ``last_payment_status`` stayed the earlier status: only an absent key
    looked the stored payment's subscription up."""
    rid, sub = uuid.uuid4(), mirror.subscription
    first = payment_data(rid, status="completed", subscription=sub.remote_id, **refs(mirror))
    assert deliver(bare("payment.completed", first)).outcome == "applied"
    sub.refresh_from_db()
    assert sub.last_payment_status == "completed"
    later = dict(first, subscription=empty, date_updated=ts(T0 + timedelta(hours=1)))
    event = deliver(bare("payment.failed", later))
    assert (event.state, event.outcome) == (EventState.PROCESSED, "applied"), event.error
    payment = Payment.objects.get(remote_id=rid)
    assert (payment.status, payment.subscription_id) == ("failed", sub.pk)  # the link kept
    sub.refresh_from_db()
    assert sub.last_payment_status == "failed"  # its newest payment's
