"""The transactional outbox: ``signals`` write entries, ``push`` pushes one, ``tasks`` holds the
push task and the sweep, ``retry`` re-queues failed ones; ``from_remote()`` saves are not pushed."""

from ..context import from_remote, is_from_remote

__all__ = ["from_remote", "is_from_remote"]
