"""Receivers of the app's signals: record the notice ``queued`` and queue its task on commit
(a task that cannot be queued is left to the sweep)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from ..models import Notice, NoticeState
from ..webhooks import signals
from .tasks import KINDS, enabled, send_notice


def change_of(record: Any) -> str:
    """``<remote id>@<version>`` of the record an event changed: two events of one change (the
    same object at the same version) give the same; "" without a version."""
    version = getattr(record, "remote_updated", None)
    remote_id = getattr(record, "remote_id", None)
    return f"{remote_id}@{version.isoformat()}" if version and remote_id else ""


def queue_notice(kind: str, event_pk: int, change: str = "") -> None:
    """Record the notice ``queued`` unless the event, or its ``change`` under another event id,
    has a row; queue ``send_notice`` on commit for the event that has it."""
    if enabled(kind):
        notice = Notice.objects.filter(kind=kind, event_id=event_pk).first()
        if notice is None:
            lookup = {"change": change} if change else {"event_id": event_pk}
            notice, _ = Notice.objects.get_or_create(
                kind=kind, **lookup, defaults={"event_id": event_pk, "state": NoticeState.QUEUED}
            )
        if notice.event_id is not None:
            owner = notice.event_id
            transaction.on_commit(lambda: send_notice.apply_async((owner, kind)), robust=True)


for _kind in KINDS:  # each kind is named after the signal that queues it

    def _receiver(sender: Any, event: Any = None, _kind: str = _kind, **kwargs: Any) -> None:
        if event is not None and event.pk is not None:
            record = kwargs.get(KINDS[_kind]._meta.model_name or "")
            queue_notice(_kind, event.pk, change_of(record))

    getattr(signals, _kind).connect(_receiver, weak=False, dispatch_uid=f"billing_notice_{_kind}")
