"""The hand-off of stored events to Celery: a coalesced kick of the
``process_received_events`` drain (``billing_integration.wakeup``), one message per burst."""

from __future__ import annotations

import json
import queue
import random
import threading
import time
import uuid
from unittest import mock

import pytest
from django.db import connection

from billing_integration import wakeup
from billing_integration.models import EventState, WebhookEvent
from billing_integration.webhooks import processing
from billing_integration.webhooks.ingest import enqueue, store_delivery
from billing_integration.webhooks.tasks import (
    WAKEUP_NAME,
    kick_window,
    process_received_events,
    process_webhook_event,
)
from billing_integration.webhooks.verification import Verification

from .conftest import SECRET, envelope, post_signed

pytestmark = pytest.mark.django_db


@pytest.fixture
def kicked(settings):
    """The hand-off of run 0 (one partition: ``test_partitions.py`` covers several); the
    drain's messages are recorded, not sent."""
    settings.BILLING = {**settings.BILLING, "WEBHOOK_SECRET": SECRET, "WEBHOOK_PROCESS_RUNS": 1}
    wakeup.clear(WAKEUP_NAME)
    with mock.patch.object(process_received_events, "apply_async") as apply_async:
        yield apply_async
    wakeup.clear(WAKEUP_NAME)


def deliver(client, n: int, capture) -> list[str]:
    ids = []
    for _ in range(n):
        payload = envelope("thing.happened", {"id": str(uuid.uuid4())})  # no handler: ignored
        with capture(execute=True):
            assert post_signed(client, payload).status_code == 200
        ids.append(payload["id"])
    return ids


def test_a_burst_of_deliveries_sends_one_message_and_the_drain_takes_all_in_order(
    client, kicked, django_capture_on_commit_callbacks
):
    deliver(client, 30, django_capture_on_commit_callbacks)
    assert kicked.call_count == 1
    order: list[int] = []
    real = processing.process_event

    def spy(pk: int, **kw):
        order.append(pk)
        return real(pk, **kw)

    with mock.patch.object(processing, "process_event", side_effect=spy):
        assert process_received_events() == 30
    expected = list(WebhookEvent.objects.order_by("received_at", "pk").values_list("pk", flat=True))
    assert order == expected
    assert not WebhookEvent.objects.filter(state=EventState.RECEIVED).exists()
    deliver(client, 1, django_capture_on_commit_callbacks)  # flag cleared by the drain
    assert kicked.call_count == 2


def test_an_event_stored_while_the_flag_is_set_is_seen_by_the_pending_drain(
    client, kicked, django_capture_on_commit_callbacks
):
    deliver(client, 1, django_capture_on_commit_callbacks)
    deliver(client, 1, django_capture_on_commit_callbacks)  # kick suppressed
    assert kicked.call_count == 1
    assert process_received_events() == 2


def test_a_transient_failure_goes_to_the_per_event_task_as_its_first_retry(
    client, kicked, django_capture_on_commit_callbacks
):
    deliver(client, 2, django_capture_on_commit_callbacks)
    first = WebhookEvent.objects.order_by("pk").first()
    real = processing.process_event

    def flaky(pk: int, **kw):
        if pk == first.pk:
            return processing.ProcessResult(pk, EventState.FAILED, retryable=True, error="x")
        return real(pk, **kw)

    with (
        mock.patch.object(processing, "process_event", side_effect=flaky),
        mock.patch.object(process_webhook_event, "apply_async") as retry,
    ):
        assert process_received_events() == 2
    retry.assert_called_once_with((first.pk,), countdown=1, retries=1)


def test_inline_mode_is_unchanged(client, kicked, settings, django_capture_on_commit_callbacks):
    settings.BILLING = {**settings.BILLING, "WEBHOOK_PROCESS_INLINE": True}
    deliver(client, 2, django_capture_on_commit_callbacks)
    kicked.assert_not_called()
    assert not WebhookEvent.objects.filter(state=EventState.RECEIVED).exists()


# --- the local suppression window (WEBHOOK_KICK_WINDOW) ----------------------------------


@pytest.fixture
def cache_adds():
    """Spy on the wake-up flag's ``cache.add`` (the round trip the window saves)."""
    cache = wakeup._cache()
    with mock.patch.object(cache, "add", wraps=cache.add) as add:
        yield add


def test_within_the_window_a_kick_skips_the_cache(
    client, kicked, cache_adds, settings, django_capture_on_commit_callbacks
):
    settings.BILLING = {**settings.BILLING, "WEBHOOK_KICK_WINDOW": 60.0}
    deliver(client, 1, django_capture_on_commit_callbacks)  # add succeeds, sends, opens
    deliver(client, 5, django_capture_on_commit_callbacks)  # no cache round trip at all
    assert cache_adds.call_count == 1 and kicked.call_count == 1
    wakeup._pending_until[WAKEUP_NAME] = 0.0  # the window ran out
    deliver(client, 1, django_capture_on_commit_callbacks)  # looks again: F still set
    assert cache_adds.call_count == 2 and kicked.call_count == 1
    settings.BILLING = {**settings.BILLING, "WEBHOOK_KICK_WINDOW": 0.01}  # a short linger
    assert process_received_events() == 7


def test_without_a_window_every_kick_asks_the_cache(
    client, kicked, cache_adds, settings, django_capture_on_commit_callbacks
):
    settings.BILLING = {**settings.BILLING, "WEBHOOK_KICK_WINDOW": 0}
    deliver(client, 3, django_capture_on_commit_callbacks)
    assert cache_adds.call_count == 3 and kicked.call_count == 1
    assert WAKEUP_NAME not in wakeup._pending_until


def test_a_wakeup_suppressed_locally_while_the_drain_ends_is_still_processed(
    client, kicked, settings, django_capture_on_commit_callbacks
):
    """The race the linger closes. Web process P stores A (its kick sends and opens P's
    window), the drain clears the flag, processes A and finds nothing more; then P stores B:
    inside its window, P neither touches the cache nor sends. The drain may not return yet: it
    looks again ``WEBHOOK_KICK_WINDOW`` (+ margin) after its clear, and processes B."""
    settings.BILLING = {**settings.BILLING, "WEBHOOK_KICK_WINDOW": 0.2}
    (first,) = deliver(client, 1, django_capture_on_commit_callbacks)
    p_window = wakeup._pending_until[WAKEUP_NAME]  # P's own window (P is another process)
    late: list[str] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:  # the drain lingers: P stores B meanwhile
        assert 0 < seconds <= 0.2 + wakeup.LINGER_MARGIN
        if not late:
            wakeup._pending_until[WAKEUP_NAME] = p_window  # what P still knows
            late.extend(deliver(client, 1, django_capture_on_commit_callbacks))
            assert kicked.call_count == 1  # B's kick was suppressed locally: no message
        real_sleep(seconds)

    with mock.patch.object(time, "sleep", side_effect=sleep) as slept:
        assert process_received_events() == 2
    assert slept.call_count == 1 and late
    states = dict(WebhookEvent.objects.values_list("event_id", "state"))
    assert states == {first: EventState.IGNORED, late[0]: EventState.IGNORED}


def test_the_drain_does_not_linger_without_a_window(
    client, kicked, settings, django_capture_on_commit_callbacks
):
    settings.BILLING = {**settings.BILLING, "WEBHOOK_KICK_WINDOW": 0}
    deliver(client, 1, django_capture_on_commit_callbacks)
    with mock.patch.object(time, "sleep") as slept:
        assert process_received_events() == 1
    slept.assert_not_called()


def test_linger_is_measured_from_the_clear():
    window, margin = 0.25, wakeup.LINGER_MARGIN
    assert wakeup.linger(100.0, window, 100.05) == pytest.approx(window + margin - 0.05)
    assert wakeup.linger(100.0, window, 100.0 + window + margin) == 0.0
    assert wakeup.linger(100.0, 0.0, 100.0) == 0.0


def test_the_budget_re_kick_is_never_suppressed_locally(
    client, kicked, settings, django_capture_on_commit_callbacks
):
    settings.BILLING = {**settings.BILLING, "WEBHOOK_KICK_WINDOW": 60.0, "WEBHOOK_DRAIN_SECONDS": 0}
    deliver(client, 2, django_capture_on_commit_callbacks)
    assert kicked.call_count == 1
    real_clear = wakeup.clear

    def clear_in_a_process_with_an_open_window(name: str) -> float:
        cleared_at = real_clear(name)
        wakeup._pending_until[name] = time.monotonic() + 60.0
        return cleared_at

    with mock.patch.object(wakeup, "clear", side_effect=clear_in_a_process_with_an_open_window):
        assert process_received_events() == 0  # out of budget at once: kicks itself
    assert kicked.call_count == 2  # through the cache, despite the window


def test_a_refused_publish_or_a_cache_error_opens_no_window(
    client, kicked, settings, django_capture_on_commit_callbacks
):
    settings.BILLING = {**settings.BILLING, "WEBHOOK_KICK_WINDOW": 60.0}
    kicked.side_effect = ConnectionError("broker down")
    deliver(client, 1, django_capture_on_commit_callbacks)
    assert WAKEUP_NAME not in wakeup._pending_until
    kicked.side_effect = None
    with mock.patch.object(wakeup._cache(), "add", side_effect=ConnectionError("cache down")):
        deliver(client, 1, django_capture_on_commit_callbacks)  # sends anyway
    assert WAKEUP_NAME not in wakeup._pending_until
    assert kicked.call_count == 2


def test_no_window_when_tasks_run_eagerly(settings):
    settings.BILLING = {**settings.BILLING, "WEBHOOK_KICK_WINDOW": 1.0}
    assert kick_window() == 1.0
    conf = process_received_events.app.conf
    eager = conf.task_always_eager
    conf.task_always_eager = True
    try:
        assert kick_window() == 0.0
    finally:
        conf.task_always_eager = eager


class _PerThread:
    """``wakeup._pending_until`` kept per thread: each thread plays a separate web process."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _own(self) -> dict[str, float]:
        if not hasattr(self._local, "pending"):
            self._local.pending = {}
        return self._local.pending

    def get(self, name: str, default: float = 0.0) -> float:
        return self._own().get(name, default)

    def __setitem__(self, name: str, value: float) -> None:
        self._own()[name] = value

    def pop(self, name: str, default: float | None = None) -> float | None:
        return self._own().pop(name, default)


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_no_lost_wakeup_with_concurrent_web_processes_and_drains(settings):
    """4 "web processes" (threads, each with its own window) store events while 2 "workers"
    run the drain for each message of an in-memory broker; no beat, so an event whose wake-up
    were lost would stay ``received``. After a free-running phase, each round forces the race
    the linger closes: every process lets its window run out, stores an event A (its kick asks
    the cache and opens its window), waits until a drain's look has found nothing, then stores
    B inside its window (suppressed locally: no cache, no message). The test counts the
    suppressed events a drain found only on a look *after* one that found nothing (only the
    linger makes that look) and asserts there were some, that no event is left ``received``
    (without the linger the last round's B events are), and that far fewer messages than
    events were sent."""
    window, free_running, processes, rounds = 0.5, 15, 4, 3
    settings.BILLING = {
        **settings.BILLING,
        "WEBHOOK_KICK_WINDOW": window,
        "WEBHOOK_PROCESS_RUNS": 1,
    }
    wakeup.clear(WAKEUP_NAME)
    broker: queue.Queue[int] = queue.Queue()
    errors: list[BaseException] = []
    stop = threading.Event()
    local = threading.local()  # per thread: cache look-ups, the drain run's state
    suppressed: set[int] = set()  # events whose kick skipped the cache (the local window)
    processed: list[tuple[int, bool]] = []  # (pk, after a look of the same run found nothing)
    empty_looks: list[float] = []  # when drains' looks that found nothing started
    looked = threading.Condition()
    barrier = threading.Barrier(processes)
    real_cache, real_clear, real_linger = wakeup._cache, wakeup.clear, wakeup.linger
    real_process = processing.process_event

    def counting_cache():
        local.cache_calls = getattr(local, "cache_calls", 0) + 1
        return real_cache()

    def clear(name: str) -> float:  # a drain run starts
        local.found_nothing = False
        return real_clear(name)

    def linger(cleared_at: float, local_window: float, looked_at: float) -> float:
        local.found_nothing = True  # the drain calls this on each look that found nothing
        with looked:
            empty_looks.append(looked_at)
            looked.notify_all()
        return real_linger(cleared_at, local_window, looked_at)

    def process_event(pk: int, **kwargs):
        processed.append((pk, getattr(local, "found_nothing", False)))
        return real_process(pk, **kwargs)

    def publish(*args, **kwargs) -> None:
        broker.put(1)

    def worker() -> None:
        try:
            while not stop.is_set():
                try:
                    broker.get(timeout=0.02)
                except queue.Empty:
                    continue
                try:
                    process_received_events()
                except BaseException as exc:  # re-raised below
                    errors.append(exc)
                finally:
                    broker.task_done()
        finally:
            connection.close()

    def store_and_kick() -> None:
        body = json.dumps(envelope("thing.happened", {"id": str(uuid.uuid4())}))
        stored = store_delivery(body.encode(), {}, Verification("signature"))
        asked = getattr(local, "cache_calls", 0)
        enqueue(stored.event.pk)  # autocommit: kicks at once
        if getattr(local, "cache_calls", 0) == asked:
            suppressed.add(stored.event.pk)

    def web_process(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(free_running):
                store_and_kick()
                time.sleep(rng.choice((0, 0, 0.001, 0.02, 0.05)))
            for _ in range(rounds):
                barrier.wait(timeout=60)
                wakeup._pending_until[WAKEUP_NAME] = 0.0  # this process's window ran out
                store_and_kick()  # A: asks the cache, opens the window
                opened = time.monotonic()
                with looked:  # until a drain has run dry after A (bounded: B stays inside
                    looked.wait_for(  # the window either way)
                        lambda: any(t > opened for t in empty_looks), timeout=window / 2
                    )
                store_and_kick()  # B: suppressed locally
        except BaseException as exc:  # re-raised below
            errors.append(exc)
            barrier.abort()
        finally:
            connection.close()

    with (
        mock.patch.object(wakeup, "_pending_until", _PerThread()),
        mock.patch.object(wakeup, "_cache", counting_cache),
        mock.patch.object(wakeup, "clear", clear),
        mock.patch.object(wakeup, "linger", linger),
        mock.patch.object(processing, "process_event", process_event),
        mock.patch.object(process_received_events, "apply_async", side_effect=publish) as sent,
    ):
        workers = [threading.Thread(target=worker) for _ in range(2)]
        webs = [threading.Thread(target=web_process, args=(i,)) for i in range(processes)]
        for t in workers + webs:
            t.start()
        for t in webs:
            t.join(timeout=120)
        with broker.all_tasks_done:  # every message handled, re-kicks included
            broker.all_tasks_done.wait_for(lambda: broker.unfinished_tasks == 0, timeout=120)
        stop.set()
        for t in workers:
            t.join(timeout=30)
    assert [t.name for t in workers + webs if t.is_alive()] == []  # every thread finished
    if errors:
        raise errors[0]
    total = processes * (free_running + 2 * rounds)
    assert WebhookEvent.objects.count() == total
    assert not WebhookEvent.objects.filter(state=EventState.RECEIVED).exists()
    rescued = [pk for pk, after_nothing in processed if after_nothing and pk in suppressed]
    print(
        f"suppressed kicks: {len(suppressed)}, found only by a lingering drain: "
        f"{len(rescued)}, messages: {sent.call_count} for {total} events"
    )
    assert rescued  # the race happened, and the linger closed it
    assert 1 <= sent.call_count < total
