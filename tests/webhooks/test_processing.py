"""Processing stored events: effects, ordering, idempotence, failures, replay, extension."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import timedelta
from io import StringIO
from unittest import mock

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import TestCase
from django.test.utils import CaptureQueriesContext

from billing_integration.models import EventState, Invoice, Payment, Refund, WebhookEvent
from billing_integration.webhooks import signals
from billing_integration.webhooks.handlers import HANDLERS, InvoiceHandler, handler
from billing_integration.webhooks.ingest import store_delivery
from billing_integration.webhooks.processing import process_event, replay_events
from billing_integration.webhooks.types import CANONICAL_TYPES
from billing_integration.webhooks.verification import Verification

from .conftest import (
    T0,
    envelope,
    invoice_data,
    payment_data,
    refund_data,
    subscription_data,
    ts,
)

pytestmark = pytest.mark.django_db


def store(payload: dict) -> WebhookEvent:
    result = store_delivery(
        json.dumps(payload).encode(), {}, Verification("signature", payload.get("id"))
    )
    assert result.created
    return result.event


def run(payload: dict) -> WebhookEvent:
    event = store(payload)
    process_event(event.pk)
    event.refresh_from_db()
    return event


def refs(m) -> dict:
    return {
        "subscription": m.subscription.remote_id,
        "customer": m.customer.remote_id,
        "product": m.product.remote_id,
    }


def test_renewal_moves_cycle_dates(mirror):
    sub = mirror.subscription
    data = subscription_data(
        sub.remote_id,
        customer=mirror.customer.remote_id,
        product=mirror.product.remote_id,
        start=T0 + timedelta(days=30),
        updated=T0 + timedelta(days=30),
    )
    event = run(envelope("subscription.renewal", data))
    assert event.state == EventState.PROCESSED and event.outcome == "applied"
    assert event.attempts == 1 and event.processed_at is not None
    sub.refresh_from_db()
    assert sub.cycle_start_date == T0 + timedelta(days=30)
    assert sub.cycle_end_date == T0 + timedelta(days=60)
    assert sub.next_billing_date == T0 + timedelta(days=60)
    assert sub.customer == mirror.customer and sub.product == mirror.product
    from billing_integration.models import OutboxEntry

    assert OutboxEntry.objects.count() == 0  # from_remote(): never pushed back


def test_older_subscription_event_never_overwrites_newer(mirror):
    sub = mirror.subscription
    ids = {"customer": mirror.customer.remote_id, "product": mirror.product.remote_id}
    newer = run(
        envelope(
            "subscription.canceled",
            subscription_data(sub.remote_id, **ids, updated=T0 + timedelta(hours=2)),
        )
    )
    older = run(
        envelope(
            "subscription.paused",
            subscription_data(sub.remote_id, **ids, updated=T0 + timedelta(hours=1)),
        )
    )
    assert newer.outcome == "applied" and older.outcome == "stale"
    assert older.state == EventState.PROCESSED
    sub.refresh_from_db()
    assert sub.status == "canceled"
    assert sub.remote_updated == T0 + timedelta(hours=2)


def test_payment_order_and_last_payment_status(mirror):
    pay = uuid.uuid4()
    run(
        envelope(
            "payment.failed",
            payment_data(
                pay,
                status="failed",
                updated=T0 + timedelta(minutes=5),
                failure_reason="declined",
                **refs(mirror),
            ),
        )
    )
    stale = run(
        envelope("payment.completed", payment_data(pay, status="completed", **refs(mirror)))
    )
    assert stale.outcome == "stale"
    payment = Payment.objects.get(remote_id=pay)
    assert payment.status == "failed" and payment.failure_reason == "declined"
    mirror.subscription.refresh_from_db()
    assert mirror.subscription.last_payment_status == "failed"
    # A newer payment of the same subscription completes: the subscription shows it ...
    later = uuid.uuid4()
    run(
        envelope(
            "payment.completed",
            payment_data(later, status="completed", updated=T0 + timedelta(days=1), **refs(mirror)),
        )
    )
    mirror.subscription.refresh_from_db()
    assert mirror.subscription.last_payment_status == "completed"
    # ... and an old payment arriving late (first seen now) does not hide it.
    run(
        envelope(
            "payment.failed",
            payment_data(
                uuid.uuid4(), status="failed", updated=T0 - timedelta(days=3), **refs(mirror)
            ),
        )
    )
    mirror.subscription.refresh_from_db()
    assert mirror.subscription.last_payment_status == "completed"
    assert Payment.objects.count() == 3


def test_refund_moves_forward_only(mirror):
    pay, ref = uuid.uuid4(), uuid.uuid4()
    run(envelope("payment.completed", payment_data(pay, status="completed", **refs(mirror))))
    common = {
        "payment": pay,
        "subscription": mirror.subscription.remote_id,
        "customer": mirror.customer.remote_id,
    }
    run(
        envelope(
            "refund.approved",
            refund_data(ref, status="approved", updated=T0 + timedelta(hours=1), **common),
        )
    )
    late = run(envelope("refund.initiated", refund_data(ref, status="initiated", **common)))
    assert late.outcome == "stale"
    refund = Refund.objects.get(remote_id=ref)
    assert refund.status == "approved"
    assert refund.payment.remote_id == pay and refund.subscription == mirror.subscription
    # Same instant: a terminal state is not moved back.
    same = run(
        envelope(
            "refund.initiated",
            refund_data(ref, status="initiated", updated=T0 + timedelta(hours=1), **common),
        )
    )
    assert same.outcome == "stale"


@pytest.mark.parametrize(
    ("event_type", "status"),
    [
        ("invoice.paid", "paid"),
        ("invoice.voided", "void"),
        ("invoice.marked_uncollectable", "uncollectable"),
        ("invoice.deleted", "deleted"),
    ],
)
def test_invoice_status_per_type(mirror, event_type, status):
    inv = uuid.uuid4()
    run(envelope(event_type, invoice_data(inv, status="whatever", **refs(mirror))))
    invoice = Invoice.objects.get(remote_id=inv)
    assert invoice.status == status
    assert invoice.subscription == mirror.subscription and invoice.customer == mirror.customer
    assert invoice.product == mirror.product and invoice.amount == 5000


@pytest.mark.parametrize(
    "spelling",
    [
        "Invoice Marked as uncollectable",
        "INVOICE_MARKED_UNCOLLECTABLE",
        "InvoiceMarkedUncollectable",
        "invoice.marked-as-uncollectable",
        "invoices.uncollectible",
    ],
)
def test_spellings_are_normalised(mirror, spelling):
    inv = uuid.uuid4()
    event = run(envelope(spelling, invoice_data(inv, status="uncollectable", **refs(mirror))))
    assert event.type == "invoice.marked_uncollectable" and event.raw_type == spelling
    assert event.state == EventState.PROCESSED
    assert Invoice.objects.get(remote_id=inv).status == "uncollectable"


def test_unknown_type_unrecognised_then_replayed_with_an_alias(mirror, settings):
    inv = uuid.uuid4()
    event = run(envelope("bill.settled", invoice_data(inv, status="paid", **refs(mirror))))
    assert event.state == EventState.UNRECOGNISED and "bill.settled" in event.error
    assert not Invoice.objects.exists()
    settings.BILLING = {**settings.BILLING, "EVENT_TYPE_ALIASES": {"Bill Settled": "invoice.paid"}}
    out = StringIO()
    call_command("billing_replay_events", "--unrecognised", stdout=out)
    assert "Replayed 1 event(s) (processed: 1)" in out.getvalue()
    event.refresh_from_db()
    assert event.state == EventState.PROCESSED and event.type == "invoice.paid"
    assert event.attempts == 2
    assert Invoice.objects.get(remote_id=inv).status == "paid"


class Exploding(InvoiceHandler):
    def handle(self, ctx):
        raise RuntimeError("handler bug")


class Counting(InvoiceHandler):
    calls: list = []

    def handle(self, ctx):
        result = super().handle(ctx)
        Counting.calls.append(result.objects["invoice"].remote_id)
        return result


def test_failure_is_recorded_with_traceback_and_replayed(mirror):
    exploding = mock.patch.dict(HANDLERS, {"invoice.paid": Exploding})
    exploding.start()
    inv = uuid.uuid4()
    event = run(envelope("invoice.paid", invoice_data(inv, status="paid", **refs(mirror))))
    assert event.state == EventState.FAILED
    assert "RuntimeError: handler bug" in event.error and "Traceback" in event.traceback
    assert event.attempts == 1
    assert not Invoice.objects.exists()  # rolled back
    call_command("billing_replay_events", "--failed", stdout=StringIO())
    event.refresh_from_db()
    assert event.state == EventState.FAILED and event.attempts == 2
    exploding.stop()
    call_command(
        "billing_replay_events",
        "--failed",
        "--type",
        "invoice.paid",
        "--since",
        (T0 - timedelta(days=1)).date().isoformat(),
        stdout=StringIO(),
    )
    event.refresh_from_db()
    assert event.state == EventState.PROCESSED and event.error == "" and event.traceback == ""
    assert Invoice.objects.get(remote_id=inv).status == "paid"


def test_a_failure_is_not_written_over_the_event_another_worker_processed_meanwhile(mirror):
    """Worker A's attempt fails and rolls back; before A records the failure, worker B
    processes the event. A's record leaves it processed: the state is checked where the
    failure is written, not read before."""
    inv = uuid.uuid4()
    event = store(envelope("invoice.paid", invoice_data(inv, status="paid", **refs(mirror))))
    raced: list[str] = []

    class OtherWorkerFirst(RuntimeError):
        def __str__(self) -> str:  # A words its failure after its rollback: B runs then
            if not raced:
                raced.append("B")  # B's handler succeeds
                raced.append(process_event(event.pk).state)
            return "handler bug"

    class FailsUntilRaced(InvoiceHandler):
        def handle(self, ctx):
            if not raced:
                raise OtherWorkerFirst()
            return super().handle(ctx)

    with mock.patch.dict(HANDLERS, {"invoice.paid": FailsUntilRaced}):
        assert process_event(event.pk).state == EventState.FAILED  # what A saw
    assert raced == ["B", EventState.PROCESSED]  # B applied it after A's rollback
    event.refresh_from_db()
    assert (event.state, event.error, event.attempts) == (EventState.PROCESSED, "", 1)
    assert Invoice.objects.get(remote_id=inv).status == "paid"


def test_host_subclass_overrides_one_event(mirror):
    Counting.calls.clear()
    paid, void = uuid.uuid4(), uuid.uuid4()
    with mock.patch.dict(HANDLERS):
        assert handler("invoice.voided")(Counting) is Counting  # what @handler does
        run(envelope("invoice.paid", invoice_data(paid, status="paid", **refs(mirror))))
        run(envelope("invoice.voided", invoice_data(void, status="void", **refs(mirror))))
    assert HANDLERS["invoice.voided"] is InvoiceHandler  # the built-in one again
    assert Counting.calls == [void]
    assert Invoice.objects.get(remote_id=void).status == "void"


def test_new_type_with_own_handler_and_alias(mirror, settings):
    class Note(InvoiceHandler):
        STATUS_FOR_TYPE = {"invoice.noted": "noted"}

    with mock.patch.dict(HANDLERS, {"invoice.noted": Note}):
        settings.BILLING = {
            **settings.BILLING,
            "EVENT_TYPE_ALIASES": {"INVOICE_NOTED": "invoice.noted"},
        }
        inv = uuid.uuid4()
        event = run(envelope("INVOICE_NOTED", invoice_data(inv, status="x", **refs(mirror))))
    assert event.state == EventState.PROCESSED and event.type == "invoice.noted"
    assert Invoice.objects.get(remote_id=inv).status == "noted"


def test_processed_twice_applies_once(mirror, django_capture_on_commit_callbacks):
    got = []
    signals.invoice_paid.connect(got.append, weak=False)  # receiver(sender, **kw) -> positional
    try:
        inv = uuid.uuid4()
        event = store(envelope("invoice.paid", invoice_data(inv, status="paid", **refs(mirror))))
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            process_event(event.pk)
            process_event(event.pk)
        assert len(callbacks) == 1
    finally:
        signals.invoice_paid.disconnect(got.append)
    event.refresh_from_db()
    assert event.attempts == 1
    assert Invoice.objects.count() == 1


def test_signal_payload_and_failing_receiver(mirror, django_capture_on_commit_callbacks, caplog):
    seen = {}

    def boom(sender, **kwargs):
        raise ValueError("receiver bug")

    def record(sender, **kwargs):
        seen.update(kwargs, sender=sender)

    signals.payment_failed.connect(boom)
    signals.billing_event_received.connect(record)
    try:
        pay = uuid.uuid4()
        event = store(
            envelope("payment.failed", payment_data(pay, status="failed", **refs(mirror)))
        )
        with django_capture_on_commit_callbacks(execute=True):
            result = process_event(event.pk)
    finally:
        signals.payment_failed.disconnect(boom)
        signals.billing_event_received.disconnect(record)
    assert result.state == EventState.PROCESSED
    assert "receiver bug" in caplog.text
    assert seen["sender"] is WebhookEvent and seen["event"].pk == event.pk
    assert seen["event_type"] == "payment.failed"
    assert seen["payment"].remote_id == pay and seen["subscription"].pk == mirror.subscription.pk
    assert seen["objects"] == {"payment": seen["payment"], "subscription": seen["subscription"]}
    assert seen["data"]["id"] == str(pay)


def test_bad_data_fails_cleanly(mirror):
    event = run(envelope("invoice.paid", {"id": "not-a-uuid"}))
    assert event.state == EventState.FAILED and "not a UUID" in event.error
    # Data without the id the handler needs: kept unrecognised (not failed, not retried).
    event = run(envelope("subscription.renewal", {"status": "x"}))
    assert event.state == EventState.UNRECOGNISED and "data.id" in event.error


def test_unknown_subscription_on_payment_pulls_once(mirror):
    """Pull failures do not block the event: the raw ids are kept, the FK stays empty."""
    sub = uuid.uuid4()
    data = payment_data(
        uuid.uuid4(),
        status="completed",
        subscription=sub,
        customer=mirror.customer.remote_id,
        product=mirror.product.remote_id,
    )
    with mock.patch("billing_integration.webhooks.processing.pull_missing") as pull:
        event = run(envelope("payment.completed", data))
    assert event.state == EventState.PROCESSED
    pull.assert_called_once_with("subscription", sub, customer=mirror.customer.remote_id)
    payment = Payment.objects.get()
    assert payment.subscription is None and payment.subscription_remote_id == sub
    assert payment.customer == mirror.customer


def test_pull_missing_runs_once_per_object(mirror):
    from billing_integration.webhooks.processing import pull_missing

    rid = uuid.uuid4()
    with mock.patch("billing_integration.sync.pull.pull_customers") as pull:
        pull_missing("customer", rid)
        pull_missing("customer", rid)
        pull_missing("customer", uuid.uuid4())
    assert pull.call_count == 2


def test_replay_events_function_for_the_admin(mirror):
    inv = uuid.uuid4()
    event = store(envelope("invoice.paid", invoice_data(inv, status="paid", **refs(mirror))))
    assert replay_events(WebhookEvent.objects.filter(pk=event.pk)) == {"processed": 1}
    assert replay_events(WebhookEvent.objects.filter(pk=event.pk)) == {}
    assert replay_events(WebhookEvent.objects.filter(pk=event.pk), force=True) == {"processed": 1}
    with mock.patch("billing_integration.webhooks.tasks.send") as send:
        assert replay_events(WebhookEvent.objects.all(), inline=False, force=True) == {
            "enqueued": 1
        }
    send.assert_called_once_with(event.pk, force=True)


def test_celery_task_processes_the_event(mirror):
    from billing_integration.webhooks.tasks import process_webhook_event

    inv = uuid.uuid4()
    event = store(envelope("invoice.paid", invoice_data(inv, status="paid", **refs(mirror))))
    assert process_webhook_event.apply(args=[event.pk]).get() == "processed"
    assert Invoice.objects.get(remote_id=inv).status == "paid"


def _steady_state_payloads(m) -> dict[str, dict]:
    """One event per canonical type, on objects that already exist locally."""
    pay, ref, inv = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    later = T0 + timedelta(days=2)
    sub = subscription_data(
        m.subscription.remote_id,
        customer=m.customer.remote_id,
        product=m.product.remote_id,
        updated=later,
    )
    out = {}
    for t in CANONICAL_TYPES:
        group = t.split(".")[0]
        later += timedelta(minutes=1)
        if group == "subscription":
            out[t] = {**sub, "date_updated": ts(later)}
        elif group == "payment":
            out[t] = payment_data(pay, status=t.split(".")[1], updated=later, **refs(m))
        elif group == "refund":
            out[t] = refund_data(
                ref,
                status=t.split(".")[1],
                payment=pay,
                updated=later,
                subscription=m.subscription.remote_id,
                customer=m.customer.remote_id,
            )
        else:
            out[t] = invoice_data(inv, status="x", updated=later, **refs(m))
    return out


def _queries_per_event(m) -> dict[tuple[int, str], int]:
    """SQL statements (transaction control aside) to process one event of each canonical
    type on objects known locally: first sight of each record (an INSERT), then an update."""
    payloads = _steady_state_payloads(m)
    counts = {}
    for rounds in range(2):
        for event_type, data in payloads.items():
            if rounds:
                data = {**data, "date_updated": ts(T0 + timedelta(days=5 + rounds))}
            event = store(envelope(event_type, data))
            # what runs after the commit counts too (the linking: records.link_waiting)
            with (
                CaptureQueriesContext(connection) as ctx,
                TestCase.captureOnCommitCallbacks(execute=True),
            ):
                result = process_event(event.pk)
            assert result.state == EventState.PROCESSED, (event_type, result.error)
            # Inside the test transaction the event's atomic() adds SAVEPOINT/RELEASE.
            real = [q for q in ctx.captured_queries if "SAVEPOINT" not in q["sql"]]
            counts[(rounds, event_type)] = len(real)
    return counts


def test_processing_query_count_is_bounded_and_constant(mirror):
    _queries_per_event(mirror)  # warm-up: content types, savepoint machinery
    few = _queries_per_event(mirror)
    # Grow the event log and the mirrored records, then measure again: no count may change
    # (no scan of the log, nothing per related row).
    for _ in range(200):
        store(envelope("invoice.paid", {"id": str(uuid.uuid4())}))
    for _ in range(10):
        _queries_per_event(mirror)
    many = _queries_per_event(mirror)
    print("processing queries per event:", many)
    assert WebhookEvent.objects.count() > 200 and Invoice.objects.count() > 10
    assert many == few  # constant
    # bounded: 6, and 2 more for the reporting rollups' hook on a payment (the trial end of its
    # subscription, the dirty month's UPDATE: docs/reporting.md), and 1 more for a new payment
    # (after the commit, the UPDATE linking the refunds stored before it: records.link_waiting)
    assert max(many.values()) <= 9


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_handler_does_not_wait_on_a_foreign_key_check_of_another_transaction(mirror):
    """Another transaction inserting a row that points to the subscription holds ``KEY SHARE``
    on it (PostgreSQL's foreign-key check) while it may wait for a row this one holds: the
    handlers' row locks (``FOR NO KEY UPDATE``) must not wait on it, or the two deadlock. A
    payment event, which locks and updates the subscription, goes through without waiting."""
    sub = mirror.subscription
    holding, release = threading.Event(), threading.Event()

    def key_share() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                table = sub._meta.db_table
                cursor.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR KEY SHARE", [sub.pk])
                holding.set()
                release.wait(timeout=30)
        finally:
            connection.close()

    other = threading.Thread(target=key_share)
    other.start()
    try:
        assert holding.wait(timeout=10)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")  # a wait fails the event instead
        data = payment_data(uuid.uuid4(), status="failed", **refs(mirror))
        result = process_event(store(envelope("payment.failed", data)).pk)
        assert (result.state, result.error) == (EventState.PROCESSED, "")
        sub.refresh_from_db()
        assert sub.last_payment_status == "failed"
    finally:
        release.set()
        other.join(timeout=30)
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")


@pytest.mark.parametrize("since", ["2025-02-30", "2025-13-01", "2025-01-10T25:00"])
def test_replay_refuses_a_since_that_is_well_formed_but_no_date(db, since):
    """``parse_date`` and ``parse_datetime`` raise on a well-formed impossible date."""
    with pytest.raises(CommandError, match="--since"):
        call_command("billing_replay_events", "--since", since, stdout=StringIO())
