"""Keeping the event log bounded (issue 15): ``prune_events``, ``billing_prune_events``, the
daily beat task and its ``older_than`` keyword (system check E024)."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.apps import apps
from django.core.checks import run_checks
from django.core.management import CommandError, call_command
from django.db import connection, connections, models, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing_integration import schedule
from billing_integration.models import EventState, Invoice, Payment, WebhookEvent
from billing_integration.webhooks.ingest import store_delivery
from billing_integration.webhooks.prune import (
    parse_duration,
    prune_events,
    prune_events_task,
)
from billing_integration.webhooks.verification import Verification

pytestmark = pytest.mark.django_db

AGES = (timedelta(hours=1), timedelta(days=30), timedelta(days=91), timedelta(days=400))
OLD = timedelta(days=90)


def make_event(state: str, age: timedelta, now=None) -> WebhookEvent:
    now = now or timezone.now()
    return WebhookEvent.objects.create(
        event_id=str(uuid.uuid4()), type="invoice.paid", state=state, received_at=now - age
    )


def delete_count(queries: CaptureQueriesContext) -> int:
    return sum(
        1 for q in queries.captured_queries if q["sql"].lstrip().upper().startswith("DELETE")
    )


def test_exactly_the_old_finished_deliveries_go_received_ones_and_records_stay():
    now = timezone.now()
    rows = {
        (state, age): make_event(state, age, now) for state in EventState.values for age in AGES
    }
    invoice = Invoice.objects.create(remote_id=uuid.uuid4(), status="paid", amount=Decimal(5))
    payment = Payment.objects.create(remote_id=uuid.uuid4(), status="completed", amount=Decimal(5))

    result = prune_events(OLD, batch_size=4, now=now)

    gone = {key for key in rows if key[0] != EventState.RECEIVED and key[1] > OLD}
    assert len(gone) == 8 and result.deleted == 8
    left = set(WebhookEvent.objects.values_list("pk", flat=True))
    assert left == {row.pk for key, row in rows.items() if key not in gone}
    # received ones stay however old they are
    assert WebhookEvent.objects.filter(state=EventState.RECEIVED).count() == len(AGES)
    assert list(Invoice.objects.values_list("pk", flat=True)) == [invoice.pk]
    assert list(Payment.objects.values_list("pk", flat=True)) == [payment.pk]


def test_deletes_run_in_batches_of_the_given_size():
    for _ in range(10):
        make_event(EventState.PROCESSED, timedelta(days=100))
    make_event(EventState.PROCESSED, timedelta(days=1))
    pauses: list[float] = []
    with CaptureQueriesContext(connection) as queries:
        result = prune_events(OLD, batch_size=3, pause=0.5, sleep=pauses.append)
    assert (result.deleted, result.batches) == (10, 4)
    assert delete_count(queries) == 4
    assert pauses == [0.5, 0.5, 0.5]  # between batches, not after the last one
    assert WebhookEvent.objects.count() == 1


class Ticks:
    """A clock that moves 0.1 s each time it is read: every batch "takes" 0.1 s."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.1
        return self.now


@pytest.mark.parametrize(
    ("max_busy", "pause", "rests"),
    [(0.25, 0.0, [0.3, 0.3]), (0.5, 0.0, [0.1, 0.1]), (0.25, 0.5, [0.5, 0.5]), (1.0, 0.0, [])],
)
def test_the_batches_keep_to_their_share_of_the_time(max_busy, pause, rests):
    """After a batch that took 0.1 s, a prune busy a quarter of the time at most rests 0.3 s
    (the longer of that and ``pause``); 1.0 never rests."""
    for _ in range(5):
        make_event(EventState.PROCESSED, timedelta(days=100))
    slept: list[float] = []
    result = prune_events(
        OLD, batch_size=2, pause=pause, max_busy=max_busy, sleep=slept.append, clock=Ticks()
    )
    assert (result.deleted, result.batches) == (5, 3)
    assert slept == pytest.approx(rests)


@pytest.mark.parametrize("max_busy", [0, -0.5, 1.5])
def test_a_busy_share_out_of_range_is_refused_and_nothing_deleted(max_busy):
    make_event(EventState.PROCESSED, timedelta(days=100))
    with pytest.raises(ValueError, match="busy share"):
        prune_events(OLD, max_busy=max_busy)
    with pytest.raises(CommandError, match="--max-busy"):
        call_command("billing_prune_events", "--older-than", "90d", "--max-busy", str(max_busy))
    assert WebhookEvent.objects.count() == 1


def test_a_notice_outlives_its_pruned_event_and_no_body_is_read():
    """The record of a sent notice stays, its event link emptied; the prune reads the ids of
    the rows it deletes, never their bodies."""
    from billing_integration.models import Notice

    old = make_event(EventState.PROCESSED, timedelta(days=200))
    WebhookEvent.objects.filter(pk=old.pk).update(body='{"big": "' + "x" * 1000 + '"}')
    notice = Notice.objects.create(event=old, kind="payment_failed", state="sent")
    with CaptureQueriesContext(connection) as queries:
        assert prune_events(OLD).deleted == 1
    assert not WebhookEvent.objects.filter(pk=old.pk).exists()
    notice.refresh_from_db()
    assert (notice.event_id, notice.state) == (None, "sent")
    reads = [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().startswith("SELECT")]
    assert reads and not any('"body"' in sql for sql in reads)


def test_nothing_to_prune_sends_no_delete():
    make_event(EventState.PROCESSED, timedelta(days=1))
    make_event(EventState.RECEIVED, timedelta(days=1000))
    with CaptureQueriesContext(connection) as queries:
        result = prune_events(OLD, batch_size=3)
    assert (result.deleted, result.batches, delete_count(queries)) == (0, 0, 0)
    assert WebhookEvent.objects.count() == 2


def test_no_model_references_the_log_with_a_cascading_key():
    """A prune must not take other rows with it: any key to WebhookEvent must be SET_NULL
    (or the model must be added to what the prune skips)."""
    for model in apps.get_models():
        for field in model._meta.get_fields():
            if getattr(field, "related_model", None) is WebhookEvent and field.concrete:
                assert field.remote_field.on_delete in (models.SET_NULL, models.DO_NOTHING), (
                    f"{model.__name__}.{field.name}"
                )


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("90d", 90 * 86400),
        ("12h", 43200),
        ("30m", 1800),
        ("45s", 45),
        ("3600", 3600),
        (60, 60),
        (timedelta(days=2), 172800),
    ],
)
def test_durations(value, seconds):
    assert parse_duration(value) == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "value",
    [
        *("", "d", "90x", "1.5d", "-3d", "0", "0d", 0, -5, True, None, 1.5, "90 days", "12y"),
        *("99999999999999999999d", "1000000d", 10**20),  # before year 1, or past timedelta
    ],
)
def test_bad_durations_are_refused(value):
    with pytest.raises(ValueError):
        parse_duration(value)


def test_the_command_prunes_and_its_dry_run_only_counts():
    for _ in range(3):
        make_event(EventState.FAILED, timedelta(days=10))
    make_event(EventState.UNRECOGNISED, timedelta(hours=1))
    out = StringIO()
    call_command("billing_prune_events", "--older-than", "7d", "--dry-run", stdout=out)
    assert out.getvalue() == (
        "3 event delivery(ies) received more than 7d ago would be deleted.\n"
    )  # the age as given, not "7 days, 0:00:00"
    assert WebhookEvent.objects.count() == 4

    out = StringIO()
    call_command("billing_prune_events", "--older-than", "12h", "--batch-size", "2", stdout=out)
    assert "Deleted 3" in out.getvalue() and "2 batch" in out.getvalue()
    assert WebhookEvent.objects.count() == 1


@pytest.mark.parametrize(
    "args",
    [
        ["--older-than", "90 days"],
        ["--older-than", "0"],
        ["--older-than", "-1d"],
        ["--older-than", "12y"],
        ["--older-than", "99999999999999999999d"],
        ["--older-than", "1000000d"],
        ["--older-than", "7d", "--batch-size", "0"],
        ["--older-than", "7d", "--pause", "-1"],
    ],
)
def test_the_command_refuses_bad_input_and_deletes_nothing(args):
    make_event(EventState.PROCESSED, timedelta(days=400))
    with pytest.raises(CommandError):
        call_command("billing_prune_events", *args, stdout=StringIO())
    assert WebhookEvent.objects.count() == 1


def test_the_command_defaults_to_90_days():
    make_event(EventState.PROCESSED, timedelta(days=100))
    make_event(EventState.PROCESSED, timedelta(days=80))
    out = StringIO()
    call_command("billing_prune_events", stdout=out)
    assert "Deleted 1" in out.getvalue()
    assert WebhookEvent.objects.count() == 1
    call_command("billing_prune_events", "--older-than", "2d", stdout=StringIO())
    assert WebhookEvent.objects.count() == 0


def test_the_periodic_task_takes_its_age_as_a_keyword():
    make_event(EventState.PROCESSED, timedelta(days=100))
    make_event(EventState.PROCESSED, timedelta(days=10))
    make_event(EventState.RECEIVED, timedelta(days=100))
    assert prune_events_task() == 1  # the default: 90 days
    assert WebhookEvent.objects.count() == 2
    assert prune_events_task(older_than="30d") == 0
    assert prune_events_task(older_than=5 * 86400) == 1  # seconds
    assert list(WebhookEvent.objects.values_list("state", flat=True)) == [EventState.RECEIVED]
    with pytest.raises(ValueError):
        prune_events_task(older_than="90 days")
    assert WebhookEvent.objects.count() == 1


def test_the_periodic_task_runs_as_the_beat_entry_sends_it():
    """The entry's kwargs through Celery's own call (JSON-serialisable, the task's keyword)."""
    make_event(EventState.PROCESSED, timedelta(days=3))
    make_event(EventState.PROCESSED, timedelta(hours=1))
    entry = schedule.beat_schedule(prune_older_than="2d")["billing-prune-events"]
    assert json.loads(json.dumps(entry["kwargs"])) == {"older_than": "2d"}
    assert prune_events_task.apply(kwargs=entry["kwargs"]).get() == 1
    assert WebhookEvent.objects.count() == 1


def test_the_beat_schedule_runs_the_prune_daily():
    entry = schedule.BEAT_SCHEDULE["billing-prune-events"]
    assert entry["task"] == "billing_integration.prune_events"
    assert entry["schedule"] == 86400.0
    assert entry["kwargs"] == {"older_than": "90d"}
    assert schedule.beat_schedule(prune_every=3600)["billing-prune-events"]["schedule"] == 3600


@pytest.fixture
def beat_schedule():
    """Set the beat schedule of the Celery app the checks read, for this test only."""
    from celery import current_app

    previous = current_app.conf.beat_schedule
    try:
        yield lambda value: setattr(current_app.conf, "beat_schedule", value)
    finally:
        current_app.conf.beat_schedule = previous


def prune_entry(**fields) -> dict:
    return {"billing-prune-events": {**schedule.BEAT_SCHEDULE["billing-prune-events"], **fields}}


@pytest.mark.parametrize("value", ["90x", 0, "-1d", True, [], "90 days", None])
def test_a_bad_age_in_the_beat_entry_fails_the_system_check(beat_schedule, value):
    beat_schedule({**schedule.BEAT_SCHEDULE, **prune_entry(kwargs={"older_than": value})})
    errors = [m for m in run_checks() if m.id == "billing_integration.E024"]
    assert len(errors) == 1
    assert "'billing-prune-events'" in errors[0].msg and repr(value) in errors[0].msg


@pytest.mark.parametrize(
    "fields",
    # args=5 or a kwargs list crashed manage.py check; args="90d" was read as "9" (9 seconds),
    # and Celery would call the task with the arguments "9", "0", "d".
    [{"args": 5}, {"args": "90d"}, {"kwargs": ["older_than"]}, {"kwargs": 5}],
)
def test_beat_arguments_of_the_wrong_shape_fail_the_system_check(beat_schedule, fields):
    beat_schedule({**schedule.BEAT_SCHEDULE, **prune_entry(**fields)})
    errors = [m for m in run_checks() if m.id == "billing_integration.E024"]
    assert len(errors) == 1
    assert errors[0].msg.startswith(
        "The args of Celery beat's 'billing-prune-events' entry (billing_integration."
        "prune_events) must be a list or tuple and its kwargs a dict, not "
    )
    assert errors[0].hint == "For example 'kwargs': {'older_than': '90d'}."


def test_a_beat_schedule_that_is_not_a_dict_is_not_a_traceback(beat_schedule):
    beat_schedule(["billing-prune-events"])
    ids = {message.id for message in run_checks()}
    assert "billing_integration.W021" in ids  # none of the app's tasks is scheduled
    refresh = {**schedule.BEAT_SCHEDULE["billing-refresh-report-rollups"], "kwargs": 5}
    beat_schedule({**schedule.BEAT_SCHEDULE, "billing-refresh-report-rollups": refresh})
    run_checks()  # kwargs=5 was .get() on an int


@pytest.mark.parametrize(
    "fields", [{}, {"kwargs": {}}, {"args": ["12h"]}, {"kwargs": {"older_than": 3600}}]
)
def test_a_good_beat_entry_passes_the_system_check(beat_schedule, fields):
    beat_schedule({**schedule.BEAT_SCHEDULE, **prune_entry(**fields)})
    ids = {message.id for message in run_checks()}
    assert "billing_integration.E024" not in ids


def test_no_prune_entry_keeps_every_delivery_without_a_warning(beat_schedule):
    """Removing the entry is how a host keeps the whole log: neither E024 nor W021."""
    rest = {k: v for k, v in schedule.BEAT_SCHEDULE.items() if k != "billing-prune-events"}
    beat_schedule(rest)
    ids = {message.id for message in run_checks()}
    assert ids.isdisjoint({"billing_integration.E024", "billing_integration.W021"})
    beat_schedule({k: v for k, v in rest.items() if k != "billing-sync-all"})
    assert "billing_integration.W021" in {message.id for message in run_checks()}


# --- PostgreSQL: a prune never blocks ingest, never waits on a locked row -------------------

GUARD = 30.0  # seconds before a stuck thread gives up, so a blocked test fails, never hangs


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_ingest_inserts_while_a_prune_batch_transaction_is_open():
    for _ in range(5):
        make_event(EventState.PROCESSED, timedelta(days=100))
    batch_open = threading.Event()
    inserted = threading.Event()
    held: list[bool] = []
    outcome: dict = {}

    def hold_after_delete(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.lstrip().upper().startswith("DELETE") and not batch_open.is_set():
            assert connections["default"].in_atomic_block  # the batch's transaction is open
            batch_open.set()
            held.append(inserted.wait(GUARD))
        return result

    def prune() -> None:
        try:
            with connections["default"].execute_wrapper(hold_after_delete):
                outcome["result"] = prune_events(OLD, batch_size=2)
        finally:
            connections["default"].close()

    thread = threading.Thread(target=prune)
    thread.start()
    assert batch_open.wait(GUARD)
    body = json.dumps(
        {"id": "evt_during_prune", "type": "invoice.paid", "data": {"id": str(uuid.uuid4())}}
    ).encode()
    stored = store_delivery(body, {}, Verification(method="signature", message_id="msg_1"))
    inserted.set()
    thread.join()
    assert stored.created and held == [True]  # the insert finished while the batch was open
    assert outcome["result"].deleted == 5
    assert list(WebhookEvent.objects.values_list("event_id", flat=True)) == ["evt_during_prune"]


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_row_locked_elsewhere_is_skipped_not_waited_on():
    locked = make_event(EventState.PROCESSED, timedelta(days=100))
    for _ in range(4):
        make_event(EventState.FAILED, timedelta(days=100))
    is_locked = threading.Event()
    release = threading.Event()

    def hold_lock() -> None:
        try:
            with transaction.atomic():
                WebhookEvent.objects.select_for_update().get(pk=locked.pk)
                is_locked.set()
                release.wait(GUARD)
        finally:
            connections["default"].close()

    thread = threading.Thread(target=hold_lock)
    thread.start()
    assert is_locked.wait(GUARD)
    try:
        result = prune_events(OLD, batch_size=2)
        finished_while_locked = not release.is_set()
    finally:
        release.set()
        thread.join()
    assert finished_while_locked
    assert result.deleted == 4
    assert list(WebhookEvent.objects.values_list("pk", flat=True)) == [locked.pk]
    assert prune_events(OLD, batch_size=2).deleted == 1  # the next run takes it
