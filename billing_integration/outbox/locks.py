"""The one row-lock helper of the outbox: rows another transaction holds are skipped."""

from __future__ import annotations

from django.db import connections, models

__all__ = ["skip_locked"]


def skip_locked(qs: models.QuerySet, using: str) -> models.QuerySet:
    """``qs`` locking the rows it returns (``FOR UPDATE SKIP LOCKED`` where the database has
    it: a row another worker holds is left out; a plain ``FOR UPDATE`` where it only has
    that; unchanged on a database without row locks, e.g. SQLite, which locks the file)."""
    features = connections[using].features
    if features.has_select_for_update_skip_locked:
        return qs.select_for_update(skip_locked=True)
    if features.has_select_for_update:
        return qs.select_for_update()
    return qs
