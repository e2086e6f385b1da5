"""Bounding the pulls that requests and events ask for, through ``conf.shared_cache()``:
``once_per_window`` and ``coalesced_pull`` (one pull of a list at a time). A cache outage
never stops a pull: the counters then live in this process."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..conf import shared_cache

logger = logging.getLogger("billing_integration.sync")


#: Seconds a pull's lock lasts (a killed process frees it after this); a caller waits as long.
PULL_LOCK_TTL = 300.0
#: Seconds between two looks at a lock another process holds.
POLL_INTERVAL = 0.1

_local: dict[str, int] = {}  # the counters while the shared cache is down
_locks: dict[str, threading.Lock] = {}
_DOWN = object()


def _cache(method: str, key: str, *args: Any, **kwargs: Any) -> Any:
    """``shared_cache().<method>(key, ...)``, or ``_DOWN`` when the cache fails (logged)."""
    try:
        return getattr(shared_cache(), method)(key, *args, **kwargs)
    except Exception as exc:
        logger.warning("pull %s: cache unavailable (%s)", key, type(exc).__name__)
        return _DOWN


def once_per_window(key: str, seconds: float) -> bool:
    """True for the first call with ``key`` in ``seconds`` across processes (and when the
    cache fails)."""
    return bool(_cache("add", key, 1, timeout=max(1, round(seconds))))


def note_window(key: str, note: str, seconds: float) -> None:
    _cache("set", key, note, timeout=max(1, round(seconds)))


def window_note(key: str) -> Any:
    """The note of the window ``key`` (None when absent or the cache fails)."""
    note = _cache("get", key)
    return None if note is _DOWN else note


def _count(key: str) -> int:
    """The count ``key`` (this process's while the cache is down)."""
    value = _cache("get", key)
    return int((_local.get(key, 0) if value is _DOWN else value) or 0)


def _set_count(key: str, value: int) -> None:
    """With no timeout (``incr`` would give it the cache's default on the database cache)."""
    if _cache("set", key, value, timeout=None) is _DOWN:
        _local[key] = value


def coalesced_pull(
    resource: str, pull: Callable[[], Any], present: Callable[[], bool] = lambda: False
) -> bool:
    """Run ``pull`` unless ``present()`` or a pull started after this call has finished;
    True if this call pulled."""
    started, finished, lock = (
        f"billing:pull:{resource}:{k}" for k in ("started", "finished", "lock")
    )
    # Never below the finished count: a cache may drop the started one (eviction, culling).
    asked = max(_count(started), _count(finished))
    give_up = time.monotonic() + PULL_LOCK_TTL
    with _locks.setdefault(resource, threading.Lock()):  # this process's callers in turn
        while True:
            if present() or _count(finished) > asked:
                return False
            if _cache("add", lock, 1, timeout=PULL_LOCK_TTL):  # or the cache is down
                break
            if time.monotonic() > give_up:
                logger.warning("pull of %s: another process held it too long", resource)
                return False
            time.sleep(POLL_INTERVAL)
        try:
            generation = max(_count(started), _count(finished)) + 1
            _set_count(started, generation)
            pull()
            _set_count(finished, generation)
        finally:
            _cache("delete", lock)  # else it expires after PULL_LOCK_TTL
        return True
