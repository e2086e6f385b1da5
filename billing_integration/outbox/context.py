"""``from_remote()`` under the outbox's name; defined in ``billing_integration.context``."""

from ..context import from_remote, is_from_remote

__all__ = ["from_remote", "is_from_remote"]
