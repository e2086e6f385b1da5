"""Re-queue failed outbox entries (the admin action and ``billing_sync --retry-failed``)."""

from __future__ import annotations

from django.contrib.contenttypes.models import ContentType
from django.db import models

from ..models.outbox import OutboxEntry
from . import tasks

__all__ = ["retry_failed", "retry_failed_pushes"]


def retry_failed(entries: models.QuerySet[OutboxEntry] | None = None) -> int:
    """Put the failed entries among ``entries`` (default: all) back in the queue (same key
    when the outcome is unknown; a refused body is rebuilt) and enqueue their pushes after
    commit. Returns the number of entries re-queued."""
    ids = (entries if entries is not None else OutboxEntry.objects.all()).reset_failed()
    for pk in ids:
        tasks.enqueue_on_commit(pk)
    return len(ids)


def retry_failed_pushes(queryset: models.QuerySet) -> int:
    """Re-queue the failed outbox entries of the objects of ``queryset``."""
    ct = ContentType.objects.get_for_model(queryset.model, for_concrete_model=True)
    pks = list(queryset.values_list("pk", flat=True))
    return retry_failed(OutboxEntry.objects.filter(content_type=ct, object_id__in=pks))
