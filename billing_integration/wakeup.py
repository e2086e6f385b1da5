"""Coalesced wake-ups of drain tasks: one Celery message for a burst of work, not one per item.

Producers (the outbox after a change commits, the webhook view after an event is stored)
call :func:`kick`; consumers are *drain* tasks that process every due item they find.

Protocol, with ``F`` the cache flag ``billing_integration:kick:<name>``:

- ``kick(name, task)`` (after the item's transaction committed): ``cache.add(F)``; only the
  caller whose ``add`` succeeded sends ``task``. While ``F`` is set, further kicks send nothing.
- The drain task calls :func:`clear` (deletes ``F``) **first**, **then** loops claiming due
  items until none is left.

No lost wake-up: take an item committed at time ``c`` and kicked just after. If its ``add``
succeeds, a message is sent and the drain it starts deletes ``F`` and then queries, after ``c``:
it sees the item. If its ``add`` fails, ``F`` was present at that moment, so some kick set it
and sent a message whose drain has not yet deleted it (the delete is the drain's first step, so
a drain that deleted ``F`` before the failed ``add`` is not the one that set it). That drain's
delete - and its whole loop - comes after the failed ``add``, hence after ``c``: it sees the
item. A drain that stops early (its time or size budget) kicks again before returning.

Degraded cases, all covered by the periodic beat drains (the safety net): a message lost by the
broker leaves ``F`` set for at most ``KICK_TTL`` seconds (kicks are suppressed meanwhile); a
broker refusing the publish deletes ``F`` again so the next commit retries; a cache outage makes
every kick send (no coalescing, nothing lost). The cache must be shared by web and worker
processes (as for the API token): a per-process cache would suppress kicks for ``KICK_TTL``.

Timers (:func:`schedule`) are separate: a drain whose items are due later (retry backoff) sends
itself with a ``countdown``; timers for the same second are deduplicated.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from django.core.cache import caches
from django.db import transaction

from .conf import billing_settings

logger = logging.getLogger("billing_integration.wakeup")

__all__ = ["clear", "flag_key", "kick", "kick_on_commit", "schedule"]

#: Publishing must not hang a web request when the broker is down.
PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2,
                        "interval_max": 0.5}


def flag_key(name: str) -> str:
    return f"billing_integration:kick:{name}"


def _cache() -> Any:
    return caches[billing_settings.KICK_CACHE or billing_settings.TOKEN_CACHE]


def _send(task: Any, countdown: float | None, options: dict[str, Any]) -> None:
    task.apply_async(
        countdown=countdown, retry=True, retry_policy=PUBLISH_RETRY_POLICY, **options
    )


def kick(name: str, task: Any, **options: Any) -> bool:
    """Wake the drain ``task`` unless a wake-up is already pending; call after commit.

    Returns True if a message was sent. Never raises: a broker refusing the message is logged
    and the item waits for the periodic drain (or the next kick).
    """
    key = flag_key(name)
    try:
        first = _cache().add(key, 1, timeout=float(billing_settings.KICK_TTL))
    except Exception as exc:  # cache down: send anyway (no coalescing, nothing lost)
        logger.warning("wake-up %s: cache unavailable (%s), sending anyway", name, exc)
        first = True
    if not first:
        return False
    try:
        _send(task, None, options)
    except Exception as exc:
        with contextlib.suppress(Exception):  # let the next commit try again
            _cache().delete(key)
        logger.warning("wake-up %s not sent (%s); the periodic drain will pick it up", name, exc)
        return False
    return True


def kick_on_commit(name: str, task: Any, *, using: str | None = None, **options: Any) -> None:
    """:func:`kick` once the current transaction commits (at once in autocommit)."""
    transaction.on_commit(lambda: kick(name, task, **options), using=using, robust=True)


def clear(name: str) -> None:
    """The first step of a drain task: drop the flag, so any later commit kicks again."""
    try:
        _cache().delete(flag_key(name))
    except Exception as exc:  # cache down: kicks send anyway meanwhile
        logger.warning("wake-up %s: could not clear the flag (%s)", name, exc)


def schedule(name: str, task: Any, countdown: float, **options: Any) -> bool:
    """Send ``task`` in ``countdown`` seconds (a timer for work due later); one timer per
    second per name. Returns True if a message was sent."""
    countdown = max(0.0, float(countdown))
    due = int(time.time() + countdown)
    try:
        first = _cache().add(f"{flag_key(name)}:at:{due}", 1, timeout=countdown + 60)
    except Exception:
        first = True
    if not first:
        return False
    try:
        _send(task, countdown, options)
    except Exception as exc:
        logger.warning("timer %s not sent (%s); the periodic drain will pick it up", name, exc)
        return False
    return True

