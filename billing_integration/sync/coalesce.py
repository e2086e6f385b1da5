"""Bounding the pulls that requests and events ask for, through the shared cache
(``conf.shared_cache()``).

- ``once_per_window(key, seconds)``: True for the first caller in a window (a cache ``add``);
  ``note_window`` / ``window_note`` keep a word about that pull for the rest of the window.
- ``coalesced_pull(resource, pull, present)``: one pull of a list at a time; a caller that
  waited goes on without pulling once its object is known (``present()``) or a pull that
  started after it asked has finished.

A cache outage never stops a pull: the counters then live in this process.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..conf import shared_cache

logger = logging.getLogger("billing_integration.sync")

__all__ = ["coalesced_pull", "note_window", "once_per_window", "shared_cache", "window_note"]

#: Seconds a pull's lock lasts (a killed process frees it after this); a caller waits as long.
PULL_LOCK_TTL = 300.0
#: Seconds between two looks at a lock another process holds.
POLL_INTERVAL = 0.1

_local: dict[str, Any] = {}  # the counters while the shared cache is down
_locks: dict[str, threading.Lock] = {}


def _cache_call(method: str, key: str, *args: Any, **kwargs: Any) -> Any:
    try:
        return getattr(shared_cache(), method)(key, *args, **kwargs)
    except Exception as exc:
        logger.warning("pull %s: cache unavailable (%s)", key, type(exc).__name__)
        raise


def once_per_window(key: str, seconds: float) -> bool:
    """True for the first call with ``key`` in ``seconds`` across processes (and when the
    cache fails: the caller's one pull rather than none)."""
    try:
        return bool(_cache_call("add", key, 1, timeout=max(1, round(seconds))))
    except Exception:
        return True


def note_window(key: str, note: str, seconds: float) -> None:
    """Replace the window's marker by ``note``."""
    try:
        _cache_call("set", key, note, timeout=max(1, round(seconds)))
    except Exception:
        return


def window_note(key: str) -> Any:
    """The note of the window ``key`` (None when absent or the cache fails)."""
    try:
        return shared_cache().get(key)
    except Exception:
        return None


def _get(key: str) -> int:
    try:
        return int(_cache_call("get", key) or 0)
    except Exception:
        return int(_local.get(key, 0))


def _next(key: str) -> int:
    try:
        _cache_call("add", key, 0, timeout=None)
        return int(_cache_call("incr", key))
    except Exception:
        _local[key] = int(_local.get(key, 0)) + 1
        return int(_local[key])


def _set(key: str, value: int) -> None:
    _local[key] = value
    try:
        _cache_call("set", key, value, timeout=None)
    except Exception:
        return


def coalesced_pull(
    resource: str, pull: Callable[[], Any], present: Callable[[], bool] = lambda: False
) -> bool:
    """Run ``pull`` unless ``present()`` or a pull started after this call has finished;
    True if this call pulled. An error of ``pull`` is raised (it serves no one)."""
    prefix = f"billing:pull:{resource}"
    asked = _get(f"{prefix}:started")
    give_up = time.monotonic() + PULL_LOCK_TTL
    with _locks.setdefault(resource, threading.Lock()):  # this process's callers in turn
        while True:
            if present() or _get(f"{prefix}:finished") > asked:
                return False
            try:
                if _cache_call("add", f"{prefix}:lock", 1, timeout=PULL_LOCK_TTL):
                    break
            except Exception:
                break  # no cross-process lock: this process's turn is enough
            if time.monotonic() > give_up:
                logger.warning("pull of %s: another process held it too long", resource)
                return False
            time.sleep(POLL_INTERVAL)
        try:
            generation = _next(f"{prefix}:started")
            pull()
            _set(f"{prefix}:finished", generation)
        finally:
            with contextlib.suppress(Exception):  # else it expires after PULL_LOCK_TTL
                _cache_call("delete", f"{prefix}:lock")
        return True
