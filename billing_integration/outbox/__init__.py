"""The transactional outbox: local changes -> Celery -> the billing service.

- ``signals``: ``post_save`` receivers write an ``OutboxEntry`` in the change's transaction
  and kick the push run on commit.
- ``push``: the one push path (claim, build, call, record), for one entry or a batch.
- ``drain``: one push run over the due entries.
- ``tasks``: the Celery tasks ``push_due_entries`` (the push run a commit kicks),
  ``requeue_stale_entries`` (periodic safety net) and ``sync_all`` (periodic pull).
- ``from_remote()``: a context manager; saves inside it are never pushed.

This package's ``__init__`` imports neither models nor settings, so a settings module may
import ``BEAT_SCHEDULE`` from it.
"""

from __future__ import annotations

from typing import Any

from .context import from_remote, is_from_remote

__all__ = ["BEAT_SCHEDULE", "beat_schedule", "from_remote", "is_from_remote"]


def beat_schedule(
    drain_every: float = 60.0, sync_every: float = 3600.0, events_every: float = 60.0
) -> dict[str, Any]:
    """A Celery beat schedule to merge into ``CELERY_BEAT_SCHEDULE``: the outbox drain, the
    periodic pull, and the sweep of received events whose processing message was lost."""
    return {
        "billing-drain-outbox": {
            "task": "billing_integration.drain_outbox",
            "schedule": drain_every,
            "options": {"expires": drain_every},
        },
        "billing-sync-all": {
            "task": "billing_integration.sync_all",
            "schedule": sync_every,
            "options": {"expires": sync_every},
        },
        "billing-process-pending-events": {
            "task": "billing_integration.process_pending_webhook_events",
            "schedule": events_every,
            "options": {"expires": events_every},
        },
    }


#: The default schedule: drain lost outbox messages and sweep stuck events every minute,
#: reconcile every hour.
BEAT_SCHEDULE: dict[str, Any] = beat_schedule()
