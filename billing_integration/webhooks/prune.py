"""Deleting old, finished deliveries (``prune_events``), never ``received`` ones: batches,
each its own transaction, claimed ``FOR UPDATE SKIP LOCKED`` (a row in use waits a run)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery import shared_task
from django.db import connections, router, transaction
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.translation import gettext as _

from ..models import EventState, WebhookEvent
from ..schedule import PRUNE_OLDER_THAN

logger = logging.getLogger("billing_integration.webhooks")

#: The states a delivery may be pruned in: every finished one.
PRUNABLE_STATES = tuple(state.value for state in EventState if state != EventState.RECEIVED)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")


def parse_duration(value: Any) -> timedelta:
    """``"90d"``, ``"12h"``, ``"30m"``, ``"45s"``, seconds or a ``timedelta`` -> a ``timedelta``."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int) and not isinstance(value, bool):
        seconds = value
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = int(match.group(1)) * _UNITS[match.group(2) or "s"]
    else:
        raise ValueError(
            _("%(value)r is not a duration: use e.g. 90d, 12h, 30m or a number of seconds.")
            % {"value": value}
        )
    if seconds <= 0:
        raise ValueError(_("%(value)r is not a positive duration.") % {"value": value})
    try:  # the cutoff (now less the duration) must be a date
        delta = timedelta(seconds=seconds)
        timezone.now() - delta
    except OverflowError:
        raise ValueError(_("%(value)r is too long a duration.") % {"value": value}) from None
    return delta


@dataclass
class PruneResult:
    """Rows ``deleted``, in ``batches`` DELETE statements."""

    deleted: int = 0
    batches: int = 0


def _prunable(cutoff: datetime, using: str) -> QuerySet[WebhookEvent]:
    events = WebhookEvent.objects.using(using)
    return events.filter(state__in=PRUNABLE_STATES, received_at__lt=cutoff)


def count_prunable(older_than: timedelta, *, now: datetime | None = None) -> int:
    """How many deliveries ``prune_events(older_than)`` would delete now (``--dry-run``)."""
    using = router.db_for_write(WebhookEvent)
    return _prunable((now or timezone.now()) - older_than, using).count()


def prune_events(
    older_than: timedelta,
    *,
    batch_size: int = 1000,
    pause: float = 0.0,
    max_busy: float = 1.0,
    now: datetime | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> PruneResult:
    """Delete the finished deliveries received more than ``older_than`` ago, resting between
    batches ``pause`` seconds and enough to keep them to ``max_busy`` of the time."""
    if batch_size < 1:
        raise ValueError(_("The batch size must be at least 1."))
    if not 0 < max_busy <= 1:
        raise ValueError(_("The busy share must be above 0 and at most 1."))
    using = router.db_for_write(WebhookEvent)
    skip_locked = connections[using].features.has_select_for_update_skip_locked
    cutoff = (now or timezone.now()) - older_than
    result = PruneResult()
    while True:
        started = clock()
        with transaction.atomic(using=using):
            rows = _prunable(cutoff, using).order_by()
            if skip_locked:
                rows = rows.select_for_update(skip_locked=True)
            ids = list(rows.values_list("pk", flat=True)[:batch_size])
            if not ids:
                break
            # The conditions again; only the ids loaded (SET_NULL: Django reads what it deletes).
            deleted, _by_model = _prunable(cutoff, using).filter(pk__in=ids).only("pk").delete()
        result.deleted += deleted
        result.batches += 1
        if len(ids) < batch_size:
            break
        if (rest := max(pause, (clock() - started) * (1 - max_busy) / max_busy)) > 0:
            sleep(rest)
    if result.deleted:
        logger.info("Pruned %s event deliveries received before %s", result.deleted, cutoff)
    return result


# Celery ships no type hints: its decorators are untyped.
@shared_task(name="billing_integration.prune_events", ignore_result=True)  # type: ignore[untyped-decorator]
def prune_events_task(
    older_than: str | int = PRUNE_OLDER_THAN,
    batch_size: int = 1000,
    pause: float = 0.0,
    max_busy: float = 0.25,
) -> int:
    """For Celery beat (daily): prune the deliveries older than ``older_than`` (``"90d"``,
    ``"12h"``, ``"30m"`` or seconds; 90 days by default)."""
    keep = parse_duration(older_than)
    return prune_events(keep, batch_size=batch_size, pause=pause, max_busy=max_busy).deleted
