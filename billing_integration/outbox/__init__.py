"""The transactional outbox: local changes -> Celery -> the billing service.

- ``signals``: ``post_save`` receivers write an ``OutboxEntry`` in the change's transaction
  and kick the push run on commit.
- ``push``: the one push path (claim, build, call, record), for one entry or a batch.
- ``drain``: one push run over the due entries.
- ``tasks``: the Celery tasks ``push_due_entries`` (the push run a commit kicks) and
  ``requeue_stale_entries`` (periodic safety net).
- ``retry``: ``retry_failed()`` re-queues failed entries.
- ``from_remote()``: a context manager; saves inside it are never pushed
  (``billing_integration.context``).

This package's ``__init__`` imports neither models nor settings.
"""

from __future__ import annotations

# BEAT_SCHEDULE and beat_schedule: re-exported for settings modules written against 0.1
# (``from billing_integration.outbox import BEAT_SCHEDULE``); the schedule is
# ``billing_integration.schedule``. To be removed in the next release.
from ..schedule import BEAT_SCHEDULE, beat_schedule
from .context import from_remote, is_from_remote

__all__ = ["BEAT_SCHEDULE", "beat_schedule", "from_remote", "is_from_remote"]
