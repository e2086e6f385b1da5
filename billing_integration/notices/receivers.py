"""Receivers of the app's signals that record a notice ``queued`` and queue its task on commit
(a task that cannot be queued is left to the sweep)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction

from ..conf import billing_settings
from ..models import Notice, NoticeState
from ..webhooks import signals
from .sending import enabled
from .tasks import send_notice

__all__ = ["queue_notice"]


def queue_notice(kind: str, event_pk: int) -> None:
    """Record the notice ``queued`` (unless it has a row already) and queue ``send_notice``
    for it once the current transaction (if any) commits. A failure to queue is logged, not
    raised: the sweep queues the notice again."""
    if enabled(kind):
        Notice.objects.get_or_create(
            event_id=event_pk, kind=kind, defaults={"state": NoticeState.QUEUED}
        )
        transaction.on_commit(
            lambda: send_notice.apply_async((event_pk, kind), queue=billing_settings.QUEUE),
            robust=True,
        )


def _receiver(kind: str) -> Callable[..., None]:
    def receiver(sender: Any, event: Any = None, **kwargs: Any) -> None:
        if event is not None and event.pk is not None:
            queue_notice(kind, event.pk)

    receiver.__name__ = f"queue_{kind}_notice"
    return receiver


for _signal, _kind in (
    (signals.payment_failed, "payment_failed"),
    (signals.subscription_canceled, "subscription_canceled"),
    (signals.subscription_paused, "subscription_paused"),
    (signals.refund_approved, "refund_approved"),
):
    _signal.connect(_receiver(_kind), weak=False, dispatch_uid=f"billing_notice_{_kind}")
