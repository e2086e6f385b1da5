"""Bounding the pulls that requests and events ask for.

- ``once_per_window(key, seconds)``: True for the first caller in a window (a cache ``add``),
  so a page reloaded in a row pulls once. A cache outage answers True: the caller then makes
  the one pull its own request needs, never more. ``note_window`` / ``window_note`` keep a
  word about that pull (e.g. that it failed) for the rest of the window.
- ``coalesced_pull(resource, pull, present)``: at most one pull of a list runs at a time
  across processes (a cache lock) and, within a process, across threads (a lock). A caller
  that asked while a pull was running waits for it; if the object it needs is then known
  locally (``present()``), or a pull that *started after it asked* has finished, it goes on
  without pulling; else it makes the next single pull, which serves every caller waiting
  behind it. A cache outage leaves the process-local coalescing.

Pulls are counted by generation numbers, not clocks: the number of pulls started, read when a
caller asks, and the number of the last one that finished (per process and in the cache).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.core.cache import caches

from ..conf import billing_settings

logger = logging.getLogger("billing_integration.sync")

__all__ = ["coalesced_pull", "note_window", "once_per_window", "shared_cache", "window_note"]

#: Seconds one process may hold a pull's lock (a killed process frees it after this); waiting
#: callers give up after as long and go on without the pull.
PULL_LOCK_TTL = 300.0
#: Seconds between two looks at a lock another process holds.
POLL_INTERVAL = 0.1
_PREFIX = "billing:pull"


def shared_cache() -> Any:
    """The cache all processes share (``BILLING['TOKEN_CACHE']``)."""
    return caches[billing_settings.TOKEN_CACHE]


def once_per_window(key: str, seconds: float) -> bool:
    """True for the first call with ``key`` in ``seconds`` (across processes); True as well
    when the cache fails (the caller's one pull, rather than none)."""
    try:
        return bool(shared_cache().add(key, 1, timeout=max(1, round(seconds))))
    except Exception as exc:
        logger.warning("pull window %s: cache unavailable (%s); pulling", key, type(exc).__name__)
        return True


def note_window(key: str, note: str, seconds: float) -> None:
    """Replace the window's marker by ``note`` (the window keeps its length, about)."""
    try:
        shared_cache().set(key, note, timeout=max(1, round(seconds)))
    except Exception as exc:
        logger.warning("pull window %s: note not stored (%s)", key, type(exc).__name__)


def window_note(key: str) -> Any:
    """The note of the window ``key`` (``None`` when absent or the cache fails)."""
    try:
        return shared_cache().get(key)
    except Exception:
        return None


@dataclass
class _Local:
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: int = 0  # pulls this process started
    finished: int = 0  # the generation of the last one that finished


_locals: dict[str, _Local] = {}
_locals_lock = threading.Lock()


def _local(resource: str) -> _Local:
    with _locals_lock:
        return _locals.setdefault(resource, _Local())


def coalesced_pull(
    resource: str, pull: Callable[[], Any], present: Callable[[], bool] = lambda: False
) -> bool:
    """Run ``pull`` (of the list ``resource``) unless a pull that started after this call has
    finished, or ``present()`` says the object is known by now. Returns True if this call
    pulled. Errors of ``pull`` are raised (a failed pull serves no one)."""
    local = _local(resource)
    asked_local = local.started
    cache = shared_cache()
    asked_shared = _read_int(cache, f"{_PREFIX}:{resource}:started")
    with local.lock:  # threads of this process queue here
        if local.finished > asked_local or present():
            return False
        owner = _acquire(cache, resource, asked_shared, present)
        if owner is None:
            return False
        local.started += 1
        generation = local.started
        shared = _start(cache, resource) if owner else None
        try:
            pull()
        finally:
            if owner:
                _release(cache, resource, owner)
        local.finished = generation
        if shared is not None:
            _write(cache, f"{_PREFIX}:{resource}:finished", shared)
        return True


def _acquire(
    cache: Any, resource: str, asked: int | None, present: Callable[[], bool]
) -> str | None:
    """The lock's owner token (``""`` when the cache failed: no cross-process lock), or
    ``None`` when no pull is needed any more (served while waiting, or waited too long)."""
    owner = uuid.uuid4().hex
    lock_key = f"{_PREFIX}:{resource}:lock"
    give_up = time.monotonic() + PULL_LOCK_TTL
    while True:
        try:
            finished = _read_int(cache, f"{_PREFIX}:{resource}:finished", strict=True)
            if asked is not None and finished is not None and finished > asked:
                return None
            locked = cache.add(lock_key, owner, timeout=PULL_LOCK_TTL)
        except Exception as exc:
            logger.warning("pull of %s: cache unavailable (%s)", resource, type(exc).__name__)
            return ""
        if locked:
            if present():  # brought by the pull that held the lock
                _release(cache, resource, owner)
                return None
            return owner
        if present():
            return None
        if time.monotonic() > give_up:
            logger.warning("pull of %s: another process held it too long; going on", resource)
            return None
        time.sleep(POLL_INTERVAL)


def _read_int(cache: Any, key: str, *, strict: bool = False) -> int | None:
    """An integer from the cache (0 when absent); ``None`` if the cache fails (raised with
    ``strict``)."""
    try:
        return int(cache.get(key) or 0)
    except Exception:
        if strict:
            raise
        return None


def _write(cache: Any, key: str, value: int) -> None:
    try:
        cache.set(key, value, timeout=None)
    except Exception as exc:
        logger.warning("pull generation %s not stored (%s)", key, type(exc).__name__)


def _start(cache: Any, resource: str) -> int | None:
    """Count a pull as started (across processes); its generation number."""
    key = f"{_PREFIX}:{resource}:started"
    try:
        cache.add(key, 0, timeout=None)
        return int(cache.incr(key))
    except Exception as exc:
        logger.warning("pull of %s: not counted (%s)", resource, type(exc).__name__)
        return None


def _release(cache: Any, resource: str, owner: str) -> None:
    lock_key = f"{_PREFIX}:{resource}:lock"
    try:
        if cache.get(lock_key) == owner:
            cache.delete(lock_key)
    except Exception as exc:  # the lock then expires after PULL_LOCK_TTL
        logger.warning("pull of %s: lock not released (%s)", resource, type(exc).__name__)
