"""Re-queue failed outbox entries (the admin action and ``billing_sync --retry-failed``)."""

from __future__ import annotations

from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db.models import QuerySet

from ..models.outbox import OutboxEntry, OutboxQuerySet
from . import tasks


def retry_failed(entries: OutboxQuerySet | None = None) -> int:
    """Re-queue the failed entries among ``entries`` (default: all) and enqueue their pushes on
    commit (``OutboxQuerySet.reset_failed``: a refused create that a later entry creates is
    closed instead); returns how many were re-queued."""
    ids = (entries if entries is not None else OutboxEntry.objects.all()).reset_failed()
    for pk in ids:
        tasks.enqueue_on_commit(pk)
    return len(ids)


def retry_failed_pushes(queryset: QuerySet[Any]) -> int:
    """Re-queue the failed outbox entries of the objects of ``queryset``."""
    ct = ContentType.objects.get_for_model(queryset.model, for_concrete_model=True)
    pks = list(queryset.values_list("pk", flat=True))
    return retry_failed(OutboxEntry.objects.filter(content_type=ct, object_id__in=pks))
