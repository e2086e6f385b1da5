"""``from_remote()`` as the outbox's name for it; it lives in ``billing_integration.context``,
below the models, whose ``save()`` reads it."""

from __future__ import annotations

from ..context import from_remote, is_from_remote

__all__ = ["from_remote", "is_from_remote"]
