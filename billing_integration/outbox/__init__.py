"""The transactional outbox: local changes -> Celery -> the billing service.

``signals`` writes an ``OutboxEntry`` in the change's transaction and enqueues its push on
commit; ``push.push_entry`` pushes one entry; ``tasks`` holds the push task and the sweep;
``retry`` re-queues failed entries. Saves inside ``from_remote()`` are never pushed.
"""

from __future__ import annotations

from ..context import from_remote, is_from_remote

__all__ = ["from_remote", "is_from_remote"]
