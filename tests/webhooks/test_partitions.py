"""The event drain in partitions (``WEBHOOK_PROCESS_RUNS``): a burst spread over several runs,
each object's events processed in order of reception by one of them, none twice, none lost
(``billing_integration.webhooks.drain``; the hand-off's proof is in ``webhooks.tasks``)."""

from __future__ import annotations

import itertools
import json
import queue
import random
import re
import threading
import time
import uuid
import zlib
from collections import defaultdict
from unittest import mock

import pytest
from django.db import connection

from billing_integration import wakeup
from billing_integration.models import EventState, WebhookEvent
from billing_integration.webhooks import drain, processing
from billing_integration.webhooks.drain import partition_of
from billing_integration.webhooks.ingest import enqueue, store_delivery
from billing_integration.webhooks.signals import billing_event_received
from billing_integration.webhooks.tasks import (
    EVENTS,
    WAKEUP_NAME,
    partition_wakeup,
    process_received_events,
    wakeup_names,
)
from billing_integration.webhooks.verification import Verification

from .conftest import envelope
from .test_handoff import _PerThread
from .test_ordering import actual_state, deliveries, expected_state, make_events, make_world

RUNS = 4


def store(payload: dict) -> int:
    result = store_delivery(json.dumps(payload).encode(), {}, Verification("signature"))
    assert result.created
    return result.pk


def object_in(partition: int, runs: int = RUNS) -> str:
    """A fresh object id of ``partition``."""
    while True:
        candidate = str(uuid.uuid4())
        if partition_of(candidate, runs) == partition:
            return candidate


def every_partition() -> None:
    """An event (without handler: ``ignored``) on an object of each partition, so that every
    partition has work whatever ids the world got."""
    for partition in range(RUNS):
        store(envelope("thing.happened", {"id": object_in(partition)}))


def reception_order() -> dict[str, list[int]]:
    """Object id -> its events' primary keys in order of reception."""
    order: dict[str, list[int]] = defaultdict(list)
    for pk, object_id in WebhookEvent.objects.order_by("received_at", "pk").values_list(
        "pk", "object_id"
    ):
        order[object_id].append(pk)
    return order


@pytest.fixture
def partitions(settings):
    settings.BILLING = {
        **settings.BILLING,
        "WEBHOOK_PROCESS_RUNS": RUNS,
        "WEBHOOK_KICK_WINDOW": 0,
    }
    for name in wakeup_names():
        wakeup.clear(name)
    yield
    for name in wakeup_names():
        wakeup.clear(name)


class Recorder:
    """What each run processed, in order (a spy on ``processing.get_handler``, which
    ``process_event`` calls once per event it actually processes, under the event's row lock;
    the run is named by the worker thread), and the ``billing_event_received`` signals."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.local = threading.local()
        #: In order of processing: (partition, kicked by a lingering look of run 0, pk, thread,
        #: when the message that started the run was sent)
        self.done: list[tuple[int, bool, int, int, float]] = []
        self.signals: list[int] = []
        self._process = processing.process_event
        self._handler = processing.get_handler

    def run_as(self, partition: int, from_linger: bool = False, sent_at: float = 0.0) -> None:
        self.local.run = (partition, from_linger, sent_at)

    def process_event(self, pk: int, **kwargs):
        self.local.pk = pk
        return self._process(pk, **kwargs)

    def get_handler(self, event_type: str):
        partition, from_linger, sent_at = getattr(self.local, "run", (-1, False, 0.0))
        with self.lock:
            self.done.append(
                (partition, from_linger, self.local.pk, threading.get_ident(), sent_at)
            )
        return self._handler(event_type)

    def signal(self, sender, event, **kwargs) -> None:
        with self.lock:
            self.signals.append(event.pk)

    def by_partition(self) -> dict[int, list[int]]:
        runs: dict[int, list[int]] = defaultdict(list)
        for partition, _, pk, *_ in self.done:
            runs[partition].append(pk)
        return runs

    def thread_switches(self) -> int:
        """Consecutive events processed by different threads."""
        threads = [thread for _, _, _, thread, _ in self.done]
        return sum(1 for a, b in itertools.pairwise(threads) if a != b)


@pytest.fixture
def recorder():
    rec = Recorder()
    billing_event_received.connect(rec.signal, weak=False)
    with (
        mock.patch.object(processing, "process_event", side_effect=rec.process_event),
        mock.patch.object(processing, "get_handler", side_effect=rec.get_handler),
    ):
        yield rec
    billing_event_received.disconnect(rec.signal)


def assert_in_order_once(rec: Recorder) -> None:
    """Every event processed exactly once, all the events of an object in one partition and
    in order of reception; the applied ones signalled once."""
    pks = [pk for _, _, pk, *_ in rec.done]
    assert sorted(pks) == sorted(WebhookEvent.objects.values_list("pk", flat=True))
    assert len(pks) == len(set(pks))  # none twice
    assert set(WebhookEvent.objects.values_list("attempts", flat=True)) == {1}
    partition_of_pk = {pk: partition for partition, _, pk, *_ in rec.done}
    position = {pk: i for i, pk in enumerate(pks)}
    for object_id, received in reception_order().items():
        assert sorted(received, key=position.__getitem__) == received, object_id  # in order
        assert len({partition_of_pk[pk] for pk in received}) == 1, object_id  # one partition
    applied = set(WebhookEvent.objects.filter(outcome="applied").values_list("pk", flat=True))
    assert sorted(rec.signals) == sorted(applied)  # each applied event signalled once


# --- the partition function -------------------------------------------------------------


def test_the_partition_is_a_stable_hash_of_the_object_id():
    object_id = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
    # CRC-32 3552693912: the same in every process (Python's hash() of a str is not).
    assert zlib.crc32(object_id.encode()) == 3552693912
    assert partition_of(object_id, 4) == 0 and partition_of(object_id, 7) == 5
    assert partition_of("", 4) == 0  # no object: partition 0
    assert partition_of(object_id, 1) == 0
    counts = defaultdict(int)
    for _ in range(2000):
        counts[partition_of(str(uuid.uuid4()), 4)] += 1
    assert sorted(counts) == [0, 1, 2, 3] and min(counts.values()) > 400


# --- one process: run 0 hands out, each run takes its own ------------------------------


@pytest.mark.django_db
def test_run_0_kicks_the_partitions_with_events_and_each_run_takes_its_own_in_order(
    partitions, recorder, django_capture_on_commit_callbacks
):
    product, subs = make_world(n_subs=6)
    events = make_events(150, product, subs, random.Random(7))
    for payload in deliveries(events, random.Random(8)):  # 30% duplicates: stored once
        store_delivery(json.dumps(payload).encode(), {}, Verification("signature"))
    every_partition()
    partition = {
        pk: partition_of(object_id, RUNS)
        for pk, object_id in WebhookEvent.objects.values_list("pk", "object_id")
    }
    assert set(partition.values()) == set(range(RUNS))  # every partition has events

    with (
        mock.patch.object(process_received_events, "apply_async") as sent,
        django_capture_on_commit_callbacks(execute=True),  # the signals
    ):
        recorder.run_as(0)
        process_received_events()  # a message without arguments: run 0
        kicked = [c.kwargs["args"] for c in sent.call_args_list]
        assert sorted(kicked) == [(k, RUNS) for k in range(1, RUNS)]  # each once
        for args in kicked:
            recorder.run_as(args[0])
            process_received_events(*args)

    runs = recorder.by_partition()
    assert sorted(runs) == list(range(RUNS))
    for run, pks in runs.items():
        assert {partition[pk] for pk in pks} == {run}  # each run took its own partition
    assert_in_order_once(recorder)
    assert actual_state() == expected_state(events)


@pytest.mark.django_db
def test_with_one_run_run_0_takes_every_event_and_kicks_nothing(partitions, settings, recorder):
    settings.BILLING = {**settings.BILLING, "WEBHOOK_PROCESS_RUNS": 1}
    for k in range(RUNS):
        store(envelope("thing.happened", {"id": object_in(k)}))
    with mock.patch.object(process_received_events, "apply_async") as sent:
        recorder.run_as(0)
        assert process_received_events() == RUNS
    sent.assert_not_called()
    assert_in_order_once(recorder)


@pytest.mark.django_db
def test_a_run_leaves_an_event_another_run_took_since_its_look(partitions):
    """Two runs of one partition (a second run 0 woken while the first works) may both have
    an event in their look: the one that gets its lock second leaves it, whatever state the
    first left it in (here ``ignored``, which a replay would process again)."""
    pk = store(envelope("thing.happened", {"id": object_in(0)}))
    assert processing.process_event(pk, received_only=True).state == EventState.IGNORED
    again = processing.process_event(pk, received_only=True)
    assert again.state == EventState.IGNORED and not again.retryable
    assert WebhookEvent.objects.get().attempts == 1


@pytest.mark.django_db
def test_a_partition_run_re_kicks_itself_with_its_arguments(partitions, settings):
    settings.BILLING = {**settings.BILLING, "WEBHOOK_DRAIN_SECONDS": 0}
    store(envelope("thing.happened", {"id": object_in(2)}))
    with mock.patch.object(process_received_events, "apply_async") as sent:
        assert process_received_events(2, RUNS) == 0  # out of budget at once
    [call] = sent.call_args_list
    assert call.kwargs["args"] == (2, RUNS)
    assert partition_wakeup(2, RUNS).name == "webhooks:2/4"
    assert WebhookEvent.objects.get().state == EventState.RECEIVED  # for the next run


@pytest.mark.django_db
def test_a_run_takes_its_events_in_several_looks_past_the_other_partitions(partitions, recorder):
    """More than a look's batch of partition 1 behind more than a chunk of events of other
    partitions: run 1 finds all of its events, in order, in several looks, and leaves the
    others."""
    mine = [object_in(1) for _ in range(3)]
    for i in range(drain._CHUNK + 10):
        store(envelope("thing.happened", {"id": object_in(2 * (i % 2))}))  # partitions 0, 2
    for i in range(drain.LOOK_BATCH + 30):
        store(envelope("thing.happened", {"id": mine[i % 3]}))
    looks: list[int] = []
    real = drain.received_events

    def counting(*args, **kwargs):
        found = real(*args, **kwargs)
        looks.append(len(found[0]))
        return found

    with mock.patch.object(drain, "received_events", side_effect=counting):
        recorder.run_as(1)
        assert process_received_events(1, RUNS) == drain.LOOK_BATCH + 30
    assert looks == [drain.LOOK_BATCH, 30, 0]
    received = reception_order()
    expected = sorted(pk for object_id in mine for pk in received[object_id])
    assert [pk for _, _, pk, *_ in recorder.done] == expected
    assert WebhookEvent.objects.filter(state=EventState.RECEIVED).count() == drain._CHUNK + 10


@pytest.mark.django_db
def test_a_partition_stored_while_run_0_lingers_is_kicked_by_its_lingering_look(
    partitions, settings, recorder
):
    """The race the kick on every look closes. Web process P stores A (partition 0; its kick
    sends and opens P's window); run 0 processes A, finds nothing more and lingers; P stores B
    (partition 1) inside its window: no cache, no message, and no run of partition 1 is
    pending. Only run 0's lingering look can wake partition 1: it does, and run 1 takes B."""
    settings.BILLING = {**settings.BILLING, "WEBHOOK_KICK_WINDOW": 0.2}
    with mock.patch.object(process_received_events, "apply_async") as sent:
        a = store(envelope("thing.happened", {"id": object_in(0)}))
        EVENTS.kick()  # what the view does once A is committed
        assert [c.kwargs["args"] for c in sent.call_args_list] == [()]  # run 0's message
        p_window = wakeup._pending_until[WAKEUP_NAME]  # P's own window
        late: list[int] = []
        real_sleep = time.sleep

        def sleep(seconds: float) -> None:  # run 0 lingers: P stores B meanwhile
            if not late:
                wakeup._pending_until[WAKEUP_NAME] = p_window  # what P still knows
                late.append(store(envelope("thing.happened", {"id": object_in(1)})))
                assert EVENTS.kick() is False and sent.call_count == 1  # suppressed locally
            real_sleep(seconds)

        with mock.patch.object(time, "sleep", side_effect=sleep):
            recorder.run_as(0)
            assert process_received_events() == 1  # A only
        assert late
        assert [c.kwargs["args"] for c in sent.call_args_list] == [(), (1, RUNS)]
    recorder.run_as(1)
    assert process_received_events(1, RUNS) == 1
    assert [(run, pk) for run, _, pk, *_ in recorder.done] == [(0, a), (1, late[0])]
    assert not WebhookEvent.objects.filter(state=EventState.RECEIVED).exists()


# --- concurrent runs (PostgreSQL) ---------------------------------------------------------


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_handler_does_not_wait_on_a_foreign_key_check_of_another_run(mirror):
    """Another run's commit holds ``KEY SHARE`` on the subscription its new refund points to
    (PostgreSQL's deferred foreign-key check) while it waits for a row this run holds: the
    handlers' row locks (``FOR NO KEY UPDATE``) must not wait on that lock, or the two runs
    deadlock. Here the ``KEY SHARE`` is held by another connection; a payment event of that
    subscription (which locks and updates it) is processed without waiting."""
    from .conftest import payment_data

    sub = mirror.subscription
    holding, release = threading.Event(), threading.Event()

    def key_share() -> None:
        from django.db import transaction

        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT 1 FROM {sub._meta.db_table} WHERE id = %s FOR KEY SHARE", [sub.pk]
                )
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
        data = payment_data(
            uuid.uuid4(),
            status="failed",
            subscription=sub.remote_id,
            customer=mirror.customer.remote_id,
            product=mirror.product.remote_id,
        )
        pk = store(envelope("payment.failed", data))
        result = processing.process_event(pk)
        assert (result.state, result.error) == (EventState.PROCESSED, "")
        sub.refresh_from_db()
        assert sub.last_payment_status == "failed"
    finally:
        release.set()
        other.join(timeout=30)
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")


class Broker:
    """An in-memory broker carrying each message's arguments, whether run 0 sent it from a
    look after one that found nothing (a lingering look), and when it was sent, to worker
    threads."""

    def __init__(self, recorder: Recorder) -> None:
        self.queue: queue.Queue[tuple[tuple, bool, float]] = queue.Queue()
        self.recorder = recorder
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.sent: list[tuple] = []

    def publish(self, *args, **kwargs) -> None:
        task_args = tuple(kwargs.get("args") or ())
        self.sent.append(task_args)
        from_linger = getattr(self.recorder.local, "found_nothing", False)
        self.queue.put((task_args, from_linger, time.monotonic()))

    def worker(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    args, from_linger, sent_at = self.queue.get(timeout=0.02)
                except queue.Empty:
                    continue
                try:
                    self.recorder.run_as(args[0] if args else 0, from_linger, sent_at)
                    process_received_events(*args)
                except BaseException as exc:  # re-raised by the test
                    self.errors.append(exc)
                finally:
                    self.queue.task_done()
        finally:
            connection.close()

    def run(self, workers: int, body) -> list[threading.Thread]:
        """Start ``workers`` worker threads, call ``body()``, wait until every message
        (those sent meanwhile included) is handled, stop the threads; returns them."""
        threads = [threading.Thread(target=self.worker) for _ in range(workers)]
        for t in threads:
            t.start()
        try:
            body()
            with self.queue.all_tasks_done:
                self.queue.all_tasks_done.wait_for(
                    lambda: self.queue.unfinished_tasks == 0, timeout=120
                )
        finally:
            self.stop.set()
            for t in threads:
                t.join(timeout=30)
        return threads


@pytest.mark.slow
@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_burst_is_processed_by_concurrent_runs_in_order_per_object(partitions, recorder):
    """600 events about 23 objects stored, then one kick: 4 worker threads take the messages
    (run 0's, and the partitions' it sends). The partitions are processed at the same time
    (events of different threads interleave), each object's events in order of reception,
    each event once; the final state is the in-order one."""
    product, subs = make_world(n_subs=3)
    events = make_events(600, product, subs, random.Random(99))
    for payload in deliveries(events, random.Random(100)):
        store_delivery(json.dumps(payload).encode(), {}, Verification("signature"))
    every_partition()
    broker = Broker(recorder)
    with mock.patch.object(process_received_events, "apply_async", side_effect=broker.publish):
        threads = broker.run(RUNS, EVENTS.kick)
    assert [t for t in threads if t.is_alive()] == []
    if broker.errors:
        raise broker.errors[0]
    # Every event applied or stale (or ignored: no handler), none failed (no deadlock between
    # the runs either).
    assert set(WebhookEvent.objects.values_list("state", flat=True)) == {
        EventState.PROCESSED,
        EventState.IGNORED,
    }
    assert_in_order_once(recorder)
    assert actual_state() == expected_state(events)
    assert sorted(set(broker.sent)) == [(), *((k, RUNS) for k in range(1, RUNS))]
    assert sorted(recorder.by_partition()) == list(range(RUNS))
    # Runs one after the other would switch threads at most once per message.
    assert recorder.thread_switches() > len(broker.sent), recorder.thread_switches()


@pytest.mark.slow
@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_no_lost_wakeup_of_a_partition_with_concurrent_web_processes_and_runs(
    partitions, settings, recorder
):
    """4 "web processes" (threads, each with its own window and its own objects) store events
    on objects of every partition while 4 "workers" run the drains of an in-memory broker; no
    beat, so an event whose wake-up were lost would stay ``received``. Each round forces the
    race: every process lets its window run out, stores A on a partition-0 object (its kick
    asks the cache, opens its window), waits until a run 0 has found nothing of its own, then
    stores B on an object of partition 1, 2 or 3 inside its window (no cache, no message).
    Asserts that some of those suppressed events were processed by a run of their partition
    whose message was sent after they were committed: a message no kick of theirs sent, only
    run 0's look (the race happened; without that kick they stay ``received``); that none is
    left, each processed once, in order per object."""
    window, free_running, processes, rounds = 0.5, 15, 4, 3
    settings.BILLING = {**settings.BILLING, "WEBHOOK_KICK_WINDOW": window}
    broker = Broker(recorder)
    errors: list[BaseException] = []
    suppressed: set[int] = set()  # events whose kick skipped the cache (the local window)
    committed: dict[int, float] = {}  # event -> when its INSERT had committed
    empty_looks: list[float] = []  # when run 0's looks that found nothing of its own started
    looked = threading.Condition()
    barrier = threading.Barrier(processes)
    real_cache, real_clear, real_linger = wakeup._cache, wakeup.clear, wakeup.linger
    local = threading.local()

    def counting_cache():
        local.cache_calls = getattr(local, "cache_calls", 0) + 1
        return real_cache()

    def clear(name: str) -> float:  # a run starts
        recorder.local.found_nothing = False
        return real_clear(name)

    def linger(cleared_at: float, local_window: float, looked_at: float) -> float:
        if local_window > 0:  # run 0 (the partitions have no window)
            recorder.local.found_nothing = True
            with looked:
                empty_looks.append(looked_at)
                looked.notify_all()
        return real_linger(cleared_at, local_window, looked_at)

    def store_and_kick(object_id: str) -> None:
        pk = store(envelope("thing.happened", {"id": object_id}))
        committed[pk] = time.monotonic()
        asked = getattr(local, "cache_calls", 0)
        enqueue(pk)  # autocommit: kicks at once
        if getattr(local, "cache_calls", 0) == asked:
            suppressed.add(pk)

    def web_process(seed: int) -> None:
        rng = random.Random(seed)
        own = [object_in(k) for k in range(RUNS) for _ in range(2)]  # no object shared
        try:
            for _ in range(free_running):
                store_and_kick(rng.choice(own))
                time.sleep(rng.choice((0, 0, 0.001, 0.02, 0.05)))
            for _ in range(rounds):
                barrier.wait(timeout=60)
                wakeup._pending_until[WAKEUP_NAME] = 0.0  # this process's window ran out
                store_and_kick(object_in(0))  # A
                opened = time.monotonic()
                with looked:
                    looked.wait_for(
                        lambda: any(t > opened for t in empty_looks), timeout=window / 2
                    )
                store_and_kick(object_in(1 + seed % 3))  # B: suppressed locally
        except BaseException as exc:  # re-raised below
            errors.append(exc)
            barrier.abort()
        finally:
            connection.close()

    def web_processes() -> None:
        webs = [threading.Thread(target=web_process, args=(i,)) for i in range(processes)]
        for t in webs:
            t.start()
        for t in webs:
            t.join(timeout=120)
        assert [t for t in webs if t.is_alive()] == []

    with (
        mock.patch.object(wakeup, "_pending_until", _PerThread()),
        mock.patch.object(wakeup, "_cache", counting_cache),
        mock.patch.object(wakeup, "clear", clear),
        mock.patch.object(wakeup, "linger", linger),
        mock.patch.object(process_received_events, "apply_async", side_effect=broker.publish),
    ):
        threads = broker.run(RUNS, web_processes)
    assert [t for t in threads if t.is_alive()] == []
    if errors or broker.errors:
        raise (errors + broker.errors)[0]
    total = processes * (free_running + 2 * rounds)
    assert WebhookEvent.objects.count() == total
    assert not WebhookEvent.objects.filter(state=EventState.RECEIVED).exists()
    assert_in_order_once(recorder)
    rescued = [
        (pk, from_linger)
        for partition, from_linger, pk, _, sent_at in recorder.done
        if partition >= 1 and pk in suppressed and sent_at > committed[pk]
    ]
    print(
        f"suppressed kicks: {len(suppressed)}; of partitions >= 1, processed by a run whose "
        f"message run 0 sent after their commit: {len(rescued)} (from a lingering look: "
        f"{sum(1 for _, linger in rescued if linger)}); messages: {len(broker.sent)} for "
        f"{total} events"
    )
    assert rescued  # the race happened, and run 0's kick of the partition closed it
    assert len(broker.sent) < total


# --- a real Celery worker -----------------------------------------------------------------


@pytest.mark.worker
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_processes_a_burst_in_concurrent_runs_in_order_per_object(
    billing_sandbox, settings
):
    """A ``celery worker -c 4`` process (prefork: 4 child processes) with 4 partitions takes
    a burst of 300 events from one kick: every event processed once, each object's in order
    of reception (``processed_at``), the final state the in-order one, the events processed
    by runs in several child processes (the worker's log) and, on PostgreSQL, runs of
    different partitions at work at the same time (SQLite's one write lock lets one
    transaction run at a time)."""
    from example_project.celery import app

    from ..mirror.conftest import Worker, wait_for

    product, subs = make_world(n_subs=4)
    events = make_events(300, product, subs, random.Random(5))
    for payload in deliveries(events, random.Random(6)):
        store_delivery(json.dumps(payload).encode(), {}, Verification("signature"))
    every_partition()
    app.control.purge()  # the default queue (the drain's): nothing left by other tests
    worker = Worker(
        billing_sandbox,
        concurrency=RUNS,
        queues=("celery",),
        extra={"WEBHOOK_PROCESS_RUNS": RUNS, "WEBHOOK_KICK_WINDOW": 0.05},
    )
    worker.start()
    try:
        for name in wakeup_names():
            wakeup.clear(name)
        assert EVENTS.kick()
        wait_for(
            lambda: not WebhookEvent.objects.filter(state=EventState.RECEIVED).exists(),
            timeout=180,
        )
    finally:
        worker.stop()
        output = worker.output()
        worker.log.unlink(missing_ok=True)
    states = set(WebhookEvent.objects.values_list("state", flat=True))
    assert states == {EventState.PROCESSED, EventState.IGNORED}, output[-3000:]
    assert set(WebhookEvent.objects.values_list("attempts", flat=True)) == {1}
    assert actual_state() == expected_state(events)
    processed_at = dict(WebhookEvent.objects.values_list("pk", "processed_at"))
    for object_id, received in reception_order().items():
        assert sorted(received, key=processed_at.__getitem__) == received, object_id
    spans: dict[int, list] = {}
    for object_id, at in WebhookEvent.objects.values_list("object_id", "processed_at"):
        span = spans.setdefault(partition_of(object_id, RUNS), [at, at])
        span[0], span[1] = min(span[0], at), max(span[1], at)
    ordered = sorted(spans.values())
    assert len(ordered) == RUNS
    children = {
        child
        for child, handled in re.findall(
            r"ForkPoolWorker-(\d+)\] Task billing_integration\.process_received_events"
            r"\[[^\]]+\] succeeded in [\d.e-]+s: (\d+)",
            output,
        )
        if int(handled) > 0
    }
    assert len(children) >= 2, output[-3000:]
    if connection.vendor == "postgresql":
        assert any(b[0] < a[1] for a, b in itertools.pairwise(ordered)), ordered
