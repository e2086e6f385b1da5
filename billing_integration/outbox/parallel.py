"""Bounded calls in flight: a push run calls the service for several entries at once.

The calls of one claimed batch are for distinct objects (an entry behind an older one of its
object is never claimed beside it), so they may overlap; each thread only calls through the
client (no database work: claiming and recording stay in the run's own thread and
transaction). Threads are started per batch and close whatever database connection they
opened (a database cache) before they end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from django.db import connections

__all__ = ["Outcome", "call_all"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class Outcome(Generic[R]):
    """What became of one item: ``started`` False when the stop time came first; a started
    one has its ``value`` or its ``error``."""

    started: bool = False
    value: R | None = None
    error: BaseException | None = None


def call_all(
    items: Sequence[T], call: Callable[[T], R], *, width: int, stop_at: float
) -> list[Outcome[R]]:
    """``call`` each item, at most ``width`` at a time, taken in order of ``items``; none is
    started once ``time.monotonic()`` reaches ``stop_at`` (so at that moment an item may be
    left unstarted while a later one, taken just before by another thread, runs). One outcome
    per item, in the same order; exceptions are kept in their outcome, never raised here.
    ``width`` 1 calls in this thread."""
    outcomes: list[Outcome[R]] = [Outcome() for _ in items]
    width = max(1, min(int(width), len(items)))
    if width == 1:
        for index in range(len(items)):
            if not _run_one(items, index, call, outcomes, stop_at):
                break
        return outcomes

    lock = threading.Lock()
    state = {"next": 0, "stopped": False}

    def worker() -> None:
        try:
            while True:
                with lock:
                    index = state["next"]
                    if state["stopped"] or index >= len(items):
                        return
                    state["next"] = index + 1
                if not _run_one(items, index, call, outcomes, stop_at):
                    with lock:
                        state["stopped"] = True
                    return
        finally:
            connections.close_all()  # this thread's own connections only

    threads = [
        threading.Thread(target=worker, name=f"billing-push-{n}", daemon=True) for n in range(width)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def _run_one(
    items: Sequence[T],
    index: int,
    call: Callable[[T], R],
    outcomes: list[Outcome[R]],
    stop_at: float,
) -> bool:
    """Call item ``index`` unless the stop time has come (then False)."""
    if time.monotonic() >= stop_at:
        return False
    outcome = outcomes[index]
    outcome.started = True
    # A BaseException (KeyboardInterrupt, SystemExit) is left to propagate: in a thread, the
    # outcome keeps the error the caller re-raises as its own.
    outcome.error = _Unfinished()
    try:
        outcome.value = call(items[index])
        outcome.error = None
    except Exception as exc:
        outcome.error = exc
    return True


class _Unfinished(RuntimeError):
    def __init__(self) -> None:
        super().__init__("The call was interrupted before it returned.")
