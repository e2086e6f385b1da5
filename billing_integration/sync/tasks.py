"""The periodic pull (``billing_integration.sync_all``) and ``refresh_in_background()``."""

from __future__ import annotations

import logging

from celery import shared_task

from ..exceptions import BillingError
from ..health import record_run
from .coalesce import once_per_window

logger = logging.getLogger("billing_integration.sync")

#: Pages that could not refresh ask a worker for one pull per this many seconds.
BACKGROUND_PULL_INTERVAL = 60.0
BACKGROUND_PULL_KEY = "billing:background-pull"


# celery ships no type hints (no stub): its decorator is untyped.
@shared_task(name="billing_integration.sync_all", ignore_result=True)  # type: ignore[untyped-decorator]
def sync_all() -> dict[str, dict[str, int]]:
    """Pull products, customers and subscriptions, each on its own; raises the first failure."""
    from .pull import pull_each

    record_run("sync_all")  # billing_doctor: beat ran
    results: dict[str, dict[str, int]] = {}
    failures = []
    for resource, counts in pull_each():
        if isinstance(counts, BillingError):
            failures.append(counts)
        else:
            results[resource] = counts.as_dict()
    if failures:
        raise failures[0]
    return results


def refresh_in_background() -> bool:
    """Send ``sync_all`` at most once per ``BACKGROUND_PULL_INTERVAL`` (never eagerly, never
    raising); True when a message was sent."""
    if sync_all.app.conf.task_always_eager:
        return False
    if not once_per_window(BACKGROUND_PULL_KEY, BACKGROUND_PULL_INTERVAL):
        return False
    try:
        sync_all.apply_async()
    except Exception as exc:  # the broker is down: the periodic pull refreshes
        logger.warning("background pull not sent (%s); the periodic pull will refresh", exc)
        return False
    return True
