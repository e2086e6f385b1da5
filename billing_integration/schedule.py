"""The app's Celery beat schedule (``BEAT_SCHEDULE``, ``beat_schedule()``), for the host's
``CELERY_BEAT_SCHEDULE``: the outbox drain, the periodic pull, the sweep of stuck events, the
event log's pruning and the sweep of notices never queued.

Imports nothing (no models, no settings), so a settings module may import it::

    from billing_integration.schedule import BEAT_SCHEDULE as BILLING_BEAT_SCHEDULE
    CELERY_BEAT_SCHEDULE = {**BILLING_BEAT_SCHEDULE}
"""

from __future__ import annotations

from typing import Any

__all__ = ["BEAT_SCHEDULE", "beat_schedule"]


def beat_schedule(
    drain_every: float = 60.0,
    sync_every: float = 3600.0,
    events_every: float = 60.0,
    prune_every: float = 86400.0,
    notices_every: float = 300.0,
) -> dict[str, Any]:
    """A Celery beat schedule to merge into ``CELERY_BEAT_SCHEDULE``: the outbox drain, the
    periodic pull, the sweep of received events whose processing message was lost, the
    pruning of the event log (``BILLING['EVENT_RETENTION']``) and the sweep of notices whose
    task was lost or never queued."""
    return {
        "billing-drain-outbox": {
            "task": "billing_integration.drain_outbox",
            "schedule": drain_every,
            "options": {"expires": drain_every},
        },
        "billing-sync-all": {
            "task": "billing_integration.sync_all",
            "schedule": sync_every,
            "options": {"expires": sync_every},
        },
        "billing-process-pending-events": {
            "task": "billing_integration.process_pending_webhook_events",
            "schedule": events_every,
            "options": {"expires": events_every},
        },
        "billing-prune-events": {
            "task": "billing_integration.prune_events",
            "schedule": prune_every,
            "options": {"expires": prune_every},
        },
        "billing-sweep-notices": {
            "task": "billing_integration.sweep_notices",
            "schedule": notices_every,
            "options": {"expires": notices_every},
        },
    }


#: The default schedule: drain lost outbox messages and sweep stuck events every minute,
#: reconcile every hour, prune the event log every day, sweep unsent notices every 5 minutes.
BEAT_SCHEDULE: dict[str, Any] = beat_schedule()
