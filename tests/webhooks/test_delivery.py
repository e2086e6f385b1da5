"""The guarantees of the background path: no event lost when its message is lost (the sweep),
each object's events applied in order of reception even when workers race, an event applied
twice counts once."""

from __future__ import annotations

import itertools
import json
import random
import threading
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from unittest import mock

import pytest
from django.db import connection

from billing_integration.models import EventState, Invoice, Payment, WebhookEvent
from billing_integration.schedule import BEAT_SCHEDULE
from billing_integration.webhooks import processing, signals
from billing_integration.webhooks.handlers import get_handler
from billing_integration.webhooks.ingest import enqueue, store_delivery
from billing_integration.webhooks.tasks import (
    process_pending_webhook_events,
    process_webhook_event,
)
from billing_integration.webhooks.verification import Verification

from .conftest import T0, envelope, invoice_data, payment_data, subscription_data
from .test_ordering import actual_state, deliveries, expected_state, make_events, make_world


def store(payload: dict) -> int:
    result = store_delivery(json.dumps(payload).encode(), {}, Verification("signature"))
    assert result.created
    return result.pk


def refs(m) -> dict:
    return {
        "subscription": m.subscription.remote_id,
        "customer": m.customer.remote_id,
        "product": m.product.remote_id,
    }


def reception_order() -> dict[str, list[int]]:
    """Object id -> its events' primary keys in order of reception."""
    order: dict[str, list[int]] = defaultdict(list)
    rows = WebhookEvent.objects.order_by("received_at", "pk").values_list("pk", "object_id")
    for pk, object_id in rows:
        order[object_id].append(pk)
    return order


class Applied:
    """The events actually applied (a spy on ``processing.get_handler``, called once per event
    processed under its row lock), in order, with the thread that applied each."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.local = threading.local()
        self.done: list[tuple[int, int]] = []
        self.pause: dict[int, tuple[threading.Event, threading.Event]] = {}
        self._process = processing.process_event
        self._handler = processing.get_handler

    def process_event(self, pk: int, **kwargs):
        self.local.pk = pk
        return self._process(pk, **kwargs)

    def get_handler(self, event_type: str):
        pk = self.local.pk
        with self.lock:
            self.done.append((pk, threading.get_ident()))
        if pk in self.pause:  # hold the event's row lock until the test says so
            inside, go_on = self.pause[pk]
            inside.set()
            assert go_on.wait(timeout=30)
        return self._handler(event_type)

    def pks(self) -> list[int]:
        return [pk for pk, _ in self.done]


@pytest.fixture
def applied():
    spy = Applied()
    with (
        mock.patch.object(processing, "process_event", side_effect=spy.process_event),
        mock.patch.object(processing, "get_handler", side_effect=spy.get_handler),
    ):
        yield spy


def assert_in_order_once(spy: Applied) -> None:
    pks = spy.pks()
    assert sorted(pks) == sorted(WebhookEvent.objects.values_list("pk", flat=True))
    assert len(pks) == len(set(pks))  # none twice
    position = {pk: i for i, pk in enumerate(pks)}
    for object_id, received in reception_order().items():
        assert sorted(received, key=position.__getitem__) == received, object_id


# --- no loss ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_event_whose_message_was_lost_is_processed_by_the_sweep(
    mirror, django_capture_on_commit_callbacks
):
    """The broker refuses the message (or loses it): the event stays ``received``, and the
    periodic sweep (in the beat schedule) sends it again."""
    inv = uuid.uuid4()
    pk = store(envelope("invoice.paid", invoice_data(inv, status="paid", **refs(mirror))))
    with (
        mock.patch.object(process_webhook_event, "apply_async", side_effect=OSError("down")) as m,
        django_capture_on_commit_callbacks(execute=True),
    ):
        enqueue(pk)  # on commit: the message is refused (logged, not raised)
    assert m.call_count == 1
    assert WebhookEvent.objects.get(pk=pk).state == EventState.RECEIVED
    with mock.patch.object(process_webhook_event, "apply_async") as sent:
        assert process_pending_webhook_events(older_than=0) == 1
    assert sent.call_args.args[0] == (pk,)
    assert process_webhook_event.apply(args=[pk]).get() == EventState.PROCESSED
    assert Invoice.objects.get(remote_id=inv).status == "paid"
    assert process_pending_webhook_events(older_than=0) == 0  # nothing left
    assert any(
        e["task"] == "billing_integration.process_pending_webhook_events"
        for e in BEAT_SCHEDULE.values()
    )


@pytest.mark.django_db
def test_the_sweep_leaves_recent_events_to_their_own_message(mirror):
    store(envelope("invoice.paid", invoice_data(uuid.uuid4(), status="paid", **refs(mirror))))
    with mock.patch.object(process_webhook_event, "apply_async") as sent:
        assert process_pending_webhook_events(older_than=60) == 0
    sent.assert_not_called()


# --- order per object ------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_task_applies_its_objects_older_events_first(mirror, applied):
    """The message of the newest event arrives first: its task applies the object's events
    oldest first, and the older events' own messages then find nothing to do."""
    inv = uuid.uuid4()
    pks = [
        store(envelope(kind, invoice_data(inv, status=status, updated=T0, **refs(mirror))))
        for kind, status in (
            ("invoice.paid", "paid"),
            ("invoice.voided", "void"),
            ("invoice.deleted", "deleted"),
        )
    ]
    other = store(
        envelope("invoice.paid", invoice_data(uuid.uuid4(), status="paid", **refs(mirror)))
    )
    assert process_webhook_event.apply(args=[pks[-1]]).get() == EventState.PROCESSED
    assert applied.pks() == pks  # the other object's event is left to its own message
    for pk in [*pks[:-1], other]:
        process_webhook_event.apply(args=[pk]).get()
    assert applied.pks() == [*pks, other]  # each applied once
    assert set(WebhookEvent.objects.values_list("attempts", flat=True)) == {1}


@pytest.mark.django_db
def test_an_objects_events_are_in_order_whatever_the_spelling_of_its_id(mirror, applied):
    """The payment's id in capitals, then in braces: three objects for the ordering, so the
    task of the newest event applied it alone, and the older ones, of the same version (no
    date_updated) after it: the payment ended failed."""
    pay = uuid.uuid4()
    pks = []
    for kind, spelling in (
        ("payment.failed", str(pay)),
        ("payment.failed", str(pay).upper()),
        ("payment.completed", f"{{{pay}}}"),
    ):
        data = payment_data(pay, status=kind.split(".")[1], **refs(mirror))
        data.update(id=spelling, date_updated=None)
        pks.append(store(envelope(kind, data)))
    assert process_webhook_event.apply(args=[pks[-1]]).get() == EventState.PROCESSED
    assert applied.pks() == pks
    for pk in pks[:-1]:
        process_webhook_event.apply(args=[pk]).get()
    assert applied.pks() == pks  # each applied once
    assert Payment.objects.get(remote_id=pay).status == "completed"
    assert set(WebhookEvent.objects.values_list("object_id", flat=True)) == {str(pay)}


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_worker_leaves_an_object_whose_older_event_another_worker_holds(mirror, applied):
    """Worker A is applying event 1 of an invoice (its row locked) when worker B takes the
    message of event 2: B does not apply event 2 before event 1, and leaves; A applies event 2
    after event 1. The race is proven: B ran while A held event 1."""
    inv = uuid.uuid4()
    first = store(envelope("invoice.paid", invoice_data(inv, status="paid", **refs(mirror))))
    second = store(envelope("invoice.voided", invoice_data(inv, status="void", **refs(mirror))))
    inside, go_on = threading.Event(), threading.Event()
    applied.pause[first] = (inside, go_on)

    def worker(pk: int) -> str:
        try:
            return process_webhook_event.apply(args=[pk]).get()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as pool:
        a = pool.submit(worker, first)
        assert inside.wait(timeout=30)  # A holds event 1
        b = pool.submit(worker, second).result(timeout=30)  # B, meanwhile
        assert not a.done()  # the race: B ran while A held event 1
        assert b == EventState.RECEIVED and applied.pks() == [first]  # B left both
        go_on.set()
        assert a.result(timeout=30) == EventState.PROCESSED
    assert applied.pks() == [first, second]
    assert {a_thread for _, a_thread in applied.done} == {applied.done[0][1]}  # all by A
    assert Invoice.objects.get(remote_id=inv).status == "void"


@pytest.mark.django_db
def test_an_older_event_stored_after_a_worker_listed_its_object_is_applied_first(mirror, applied):
    """Worker B lists an invoice's received events (only event 2) just before event 1, received
    earlier, commits (two deliveries stored at once): B leaves event 2; event 1's worker
    applies both, event 1 first. The race is proven: B had chosen event 2 when event 1 came."""
    inv = uuid.uuid4()
    second = store(envelope("invoice.voided", invoice_data(inv, status="void", **refs(mirror))))
    received = WebhookEvent.objects.get(pk=second).received_at
    chosen: list[int] = []
    first: list[int] = []

    def event_one_commits_now(pk: int, **kwargs):
        if not chosen:
            chosen.append(pk)
            paid = envelope("invoice.paid", invoice_data(inv, status="paid", **refs(mirror)))
            first.append(store(paid))
            earlier = received - timedelta(seconds=1)
            WebhookEvent.objects.filter(pk=first[0]).update(received_at=earlier)
        return applied.process_event(pk, **kwargs)

    with mock.patch.object(processing, "process_event", side_effect=event_one_commits_now):
        assert processing.process_in_order(second).state == EventState.RECEIVED
    assert chosen == [second] and applied.pks() == []  # the race: B left event 2
    assert processing.process_in_order(first[0]).state == EventState.PROCESSED
    assert applied.pks() == [first[0], second]
    assert Invoice.objects.get(remote_id=inv).status == "void"


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_newer_event_processed_while_an_older_one_is_being_applied_is_not_taken_back(mirror):
    """Two events of one subscription taken by two workers at once (their own rows, no
    order between them): the older one's handler holds the subscription's row from its version
    check to its save, so the newer one waits, then applies over it; otherwise the older one
    saved over the newer. The race is proven: the newer began while the older held the row."""
    sub = mirror.subscription
    ids = {"customer": mirror.customer.remote_id, "product": mirror.product.remote_id}
    hour = timedelta(hours=1)
    paused = subscription_data(sub.remote_id, **ids, updated=T0 + hour)
    canceled = subscription_data(sub.remote_id, **ids, updated=T0 + 2 * hour)
    older = store(envelope("subscription.paused", paused))
    newer = store(envelope("subscription.canceled", canceled))
    handler_class = type(get_handler("subscription.paused"))
    real_save = handler_class.save
    other: dict[str, object] = {}

    def process_newer() -> None:
        try:
            other["state"] = processing.process_event(newer).state
        finally:
            connection.close()

    def save(self, record) -> None:
        if "thread" not in other:  # the older event's handler checked the version: now save
            other["thread"] = thread = threading.Thread(target=process_newer)
            thread.start()
            thread.join(timeout=5)
            other["done_while_held"] = "state" in other
        real_save(self, record)

    with mock.patch.object(handler_class, "save", save):
        assert processing.process_event(older).state == EventState.PROCESSED
    other["thread"].join(timeout=30)  # type: ignore[attr-defined]
    assert other["done_while_held"] is False  # the race: the newer waited on the row
    assert other["state"] == EventState.PROCESSED
    sub.refresh_from_db()
    assert (sub.status, sub.remote_updated) == ("canceled", T0 + 2 * hour)


@pytest.mark.slow
@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_burst_taken_by_racing_workers_is_applied_in_order_per_object(applied):
    """600 events (30 % delivered twice) about a few objects, each delivery's message taken
    by one of 4 worker threads in random order: every event applied once, each object's in
    order of reception, the final state the in-order one; the workers did race."""
    rng = random.Random(7)
    product, subs = make_world(n_subs=3)
    events = make_events(600, product, subs, rng)
    pks = [
        store_delivery(json.dumps(p).encode(), {}, Verification("signature")).pk
        for p in deliveries(events, rng)
    ]
    rng.shuffle(pks)

    def worker(pk: int) -> str:
        try:
            return process_webhook_event.apply(args=[pk]).get()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(worker, pks))
    assert set(WebhookEvent.objects.values_list("state", flat=True)) == {EventState.PROCESSED}
    assert_in_order_once(applied)
    assert actual_state() == expected_state(events)
    threads = [thread for _, thread in applied.done]
    assert len(set(threads)) > 1  # the work was shared
    switches = sum(1 for x, y in itertools.pairwise(threads) if x != y)
    assert switches > 10  # interleaved, not one worker after the other


# --- no duplicate --------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_event_applied_twice_counts_once(mirror, applied, django_capture_on_commit_callbacks):
    """The same event's message taken twice (a redelivered task, the sweep's copy) and a
    replay: applied once, signalled once, one payment."""
    received = []
    signals.payment_failed.connect(
        lambda **kw: received.append(kw["event"].pk), weak=False, dispatch_uid="twice"
    )
    try:
        data = payment_data(uuid.uuid4(), status="failed", **refs(mirror))
        pk = store(envelope("payment.failed", data))
        with django_capture_on_commit_callbacks(execute=True):
            for _ in range(3):
                assert process_webhook_event.apply(args=[pk]).get() == EventState.PROCESSED
            processing.replay_events(WebhookEvent.objects.filter(pk=pk))
    finally:
        signals.payment_failed.disconnect(dispatch_uid="twice")
    assert applied.pks() == [pk] and received == [pk]
    assert WebhookEvent.objects.get(pk=pk).attempts == 1
    assert Payment.objects.count() == 1
