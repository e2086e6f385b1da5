"""The transactional outbox: a change writes an ``OutboxEntry`` in its transaction and enqueues
its push on commit (``signals``); ``push.push_entry`` pushes one; ``tasks`` holds the push task
and the sweep; ``retry`` re-queues failed entries. Saves inside ``from_remote()`` are not pushed.
"""

from ..context import from_remote, is_from_remote

__all__ = ["from_remote", "is_from_remote"]
