"""Receivers of the app's signals: record the notice ``queued`` and queue its task on commit
(a task that cannot be queued is left to the sweep). One notice per change of state: an event
(or a pull) that restates a status its object already had, with no date of the service's for
the change, is no change."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db import transaction

from ..models import Notice, NoticeState
from ..models.subscriptions import CANCELED_STATUSES
from ..sync.signals import subscription_status_pulled
from ..webhooks import signals
from .tasks import KINDS, enabled, send_notice, send_pulled_notice

#: Notice kind -> the statuses of the state it tells of (one state: "canceled", "cancelled").
NOTICED_STATUSES: dict[str, tuple[str, ...]] = {
    "payment_failed": ("failed",),
    "subscription_canceled": CANCELED_STATUSES,
    "subscription_paused": ("paused",),
    "refund_approved": ("approved",),
}
#: The notice kinds a pull can find: the subscription's status (payments and refunds are
#: known from events only).
PULLED_KINDS = ("subscription_canceled", "subscription_paused")


def change_key(remote_id: Any, date_updated: datetime | None) -> str:
    """``<remote id>@<date_updated>``: the service's own name of one change of an object; ""
    without a date (an event or a row without ``date_updated``)."""
    if remote_id is None or not isinstance(date_updated, datetime):
        return ""
    return f"{remote_id}@{date_updated.astimezone(UTC).isoformat()}"


def change_of(record: Any, data: Any = None) -> str:
    """The change an event applied: ``change_key`` of its record at the version it stored,
    when the data carries ``date_updated`` (else "": the event's version, a ``date_created``
    or an envelope time, does not tell two changes of one state apart)."""
    if isinstance(data, dict) and data.get("date_updated") in (None, ""):
        return ""
    return change_key(getattr(record, "remote_id", None), getattr(record, "remote_updated", None))


def entered(kind: str, previous_status: str | None) -> bool:
    """The object moved into the state the ``kind`` tells of (from another, or new here)."""
    return not previous_status or previous_status not in NOTICED_STATUSES.get(kind, ())


def queue_notice(kind: str, event_pk: int, change: str = "", *, moved: bool = True) -> None:
    """Record the notice ``queued`` unless the event, or its ``change`` under another event id
    or found by a pull, has a row; without a ``change``, only when the event ``moved`` its
    object into the state. Queue ``send_notice`` on commit for the event that has it."""
    if not enabled(kind):
        return
    notice = Notice.objects.filter(kind=kind, event_id=event_pk).first()
    if notice is None:
        if not change and not moved:
            return  # the state the object was already in, said again: no change
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
            moved = entered(_kind, kwargs.get("previous_status"))
            queue_notice(_kind, event.pk, change_of(record, kwargs.get("data")), moved=moved)

    getattr(signals, _kind).connect(_receiver, weak=False, dispatch_uid=f"billing_notice_{_kind}")


def kind_of_status(status: str) -> str | None:
    """The notice a subscription moved into ``status`` by a pull or a ``subscription.renewal``
    gets, if any."""
    return next((k for k in PULLED_KINDS if status in NOTICED_STATUSES[k]), None)


def _renewal(sender: Any, event: Any = None, subscription: Any = None, **kwargs: Any) -> None:
    """A ``subscription.renewal`` whose data moved the subscription into ``canceled`` or
    ``paused``: the notice its own event type would have sent (only on the move: a renewal of a
    subscription already canceled tells nothing new)."""
    kind = kind_of_status(getattr(subscription, "status", ""))
    if not kind or event is None or event.pk is None:
        return
    if entered(kind, kwargs.get("previous_status")):
        queue_notice(kind, event.pk, change_of(subscription, kwargs.get("data")))


signals.subscription_renewal.connect(_renewal, weak=False, dispatch_uid="billing_notice_renewal")


def _pulled(
    sender: Any,
    subscription: Any,
    previous_status: str = "",
    date_updated: datetime | None = None,
    **kwargs: Any,
) -> None:
    """A pull moved a subscription into a state a notice tells of: record the notice the event
    would have (none if the event's is recorded: the same ``change``), in the pull's
    transaction, and queue ``send_pulled_notice`` on commit."""
    kind = kind_of_status(subscription.status)
    if kind is None or not entered(kind, previous_status) or not enabled(kind):
        return
    change = change_key(subscription.remote_id, date_updated)
    defaults = {"subscription": subscription, "state": NoticeState.QUEUED}
    if change:
        notice, created = Notice.objects.get_or_create(kind=kind, change=change, defaults=defaults)
    else:
        notice, created = Notice.objects.create(kind=kind, **defaults), True
    if created:
        pk = notice.pk
        transaction.on_commit(lambda: send_pulled_notice.apply_async((pk,)), robust=True)


subscription_status_pulled.connect(_pulled, weak=False, dispatch_uid="billing_notice_pulled")
