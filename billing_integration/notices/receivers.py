"""Receivers of the app's signals: record the notice ``queued`` and queue its task on commit
(a task that cannot be queued is left to the sweep)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from ..models import Notice, NoticeState
from ..webhooks import signals
from .tasks import KINDS, enabled, send_notice


def queue_notice(kind: str, event_pk: int) -> None:
    """Record the notice ``queued`` (unless it has a row) and queue ``send_notice`` on commit."""
    if enabled(kind):
        Notice.objects.get_or_create(
            event_id=event_pk, kind=kind, defaults={"state": NoticeState.QUEUED}
        )
        transaction.on_commit(
            lambda: send_notice.apply_async((event_pk, kind)),
            robust=True,
        )


for _kind in KINDS:  # each kind is named after the signal that queues it

    def _receiver(sender: Any, event: Any = None, _kind: str = _kind, **kwargs: Any) -> None:
        if event is not None and event.pk is not None:
            queue_notice(_kind, event.pk)

    getattr(signals, _kind).connect(_receiver, weak=False, dispatch_uid=f"billing_notice_{_kind}")
