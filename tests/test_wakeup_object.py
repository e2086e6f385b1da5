"""``billing_integration.wakeup.Wakeup``: producers and the drain share one name, task and
window, and the drain run does clear, linger and re-kick in the protocol's order. A fake
clock: no test waits."""

from __future__ import annotations

from unittest import mock

import pytest

from billing_integration import wakeup
from billing_integration.wakeup import LINGER_MARGIN, Wakeup

pytestmark = pytest.mark.django_db  # the kick flags live in the (database) cache


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_700_000_000.0 + self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock():
    fake = FakeClock()
    with mock.patch.object(wakeup, "time", fake):
        yield fake


@pytest.fixture
def task():
    return mock.Mock(name="drain")


@pytest.fixture
def wake(task):
    w = Wakeup("test:object", task, window=lambda: 0.5)
    wakeup.clear(w.name)
    yield w
    wakeup.clear(w.name)


def test_kick_on_commit_asks_the_cache_once_per_transaction(
    task, django_capture_on_commit_callbacks
):
    wake = Wakeup("test:once", task)  # no local window: every kick would ask the cache
    wakeup.clear(wake.name)
    with mock.patch.object(wakeup, "kick", wraps=wakeup.kick) as kicks:
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            for _ in range(3):
                wake.kick_on_commit()
        # Each call registers its own callback (a savepoint rollback drops its own); the
        # first to run kicks for all.
        assert len(callbacks) == 3
        assert kicks.call_count == 1
        assert task.apply_async.call_count == 1
        wakeup.clear(wake.name)
        with django_capture_on_commit_callbacks(execute=True):  # the next transaction
            wake.kick_on_commit()
        assert kicks.call_count == 2
        assert task.apply_async.call_count == 2
    wakeup.clear(wake.name)


def test_a_burst_of_kicks_sends_one_message_and_the_window_spares_the_cache(clock, task, wake):
    assert wake.kick() is True
    with mock.patch.object(wakeup, "_cache", side_effect=AssertionError("cache asked")):
        assert [wake.kick() for _ in range(5)] == [False] * 5  # inside the window
    assert task.apply_async.call_count == 1
    clock.now += 1.0  # the window ran out: the cache (flag still set) suppresses it
    assert wake.kick() is False
    assert task.apply_async.call_count == 1


def test_the_drain_clears_first_and_lingers_past_the_window_before_ending(clock, task, wake):
    wake.kick()
    looks: list[float] = []

    def fetch() -> list[int]:
        looks.append(clock.now)
        return [1] if len(looks) == 1 else []

    with wake.draining(seconds=20) as run:
        assert wake.kick() is True  # the flag is cleared: a new commit kicks again
        found = list(run.looks(fetch))
    assert found == [[1]]
    # The empty look came too soon after the clear: one sleep to window + margin, one more look.
    assert clock.sleeps == [pytest.approx(0.5 + LINGER_MARGIN)]
    assert len(looks) == 3
    assert task.apply_async.call_count == 2  # no re-kick: the run ended on nothing


def test_a_run_stopped_on_its_budget_re_kicks_through_the_cache_despite_the_window(
    clock, task, wake
):
    wake.kick()
    with wake.draining(seconds=5) as run:
        wakeup._pending_until[wake.name] = clock.now + 60  # a window open in this process
        clock.now += 6
        assert run.time_left() is False
        assert list(run.looks(lambda: [1])) == []  # a stopped run looks no more
    assert task.apply_async.call_count == 2  # the kick, then the re-kick
    assert task.apply_async.call_args.kwargs["countdown"] is None


def test_a_run_with_items_due_later_sets_a_timer(clock, task):
    wake = Wakeup("test:timer", task, options=lambda: {"queue": "q"})
    wakeup.clear(wake.name)
    with wake.draining(seconds=5) as run:
        assert list(run.looks(lambda: [])) == []  # no window: no linger
        run.retry_in(9.0)
        run.retry_in(4.0)
    assert clock.sleeps == []
    [call] = task.apply_async.call_args_list
    assert call.kwargs["countdown"] == 4.0 and call.kwargs["queue"] == "q"
