"""The app's Celery beat schedule, for the host's ``CELERY_BEAT_SCHEDULE``. Imports nothing (no
models, no settings), so a settings module may import it::

    from billing_integration.schedule import BEAT_SCHEDULE as BILLING_BEAT_SCHEDULE
    CELERY_BEAT_SCHEDULE = {**BILLING_BEAT_SCHEDULE}
"""

from __future__ import annotations

from typing import Any

#: How old a finished event delivery gets before the daily prune deletes it (the default of the
#: ``older_than`` keyword of ``billing_integration.prune_events`` and ``billing_prune_events``).
PRUNE_OLDER_THAN = "90d"
#: The closed months the hourly reconciliation of the reporting rollups recomputes.
RECONCILED_MONTHS = 2


def beat_schedule(
    drain_every: float = 60.0,
    sync_every: float = 3600.0,
    events_every: float = 60.0,
    prune_every: float = 86400.0,
    notices_every: float = 300.0,
    trials_every: float = 3600.0,
    prune_older_than: str | int = PRUNE_OLDER_THAN,
    reports_every: float = 60.0,
    plans_every: float = 3600.0,
    reconcile_every: float = 3600.0,
) -> dict[str, Any]:
    """The beat entries, each task run (and its message expiring) every ``*_every`` seconds.
    The prune deletes finished deliveries older than ``prune_older_than`` (``"90d"``, ``"12h"``,
    ``"30m"`` or seconds); the reconciliation recomputes the last ``RECONCILED_MONTHS`` closed
    months whether a change marked them or not."""
    entries = {
        "billing-drain-outbox": ("drain_outbox", drain_every),
        "billing-sync-all": ("sync_all", sync_every),
        "billing-process-pending-events": ("process_pending_webhook_events", events_every),
        "billing-prune-events": ("prune_events", prune_every),
        "billing-sweep-notices": ("sweep_notices", notices_every),
        "billing-trial-notices": ("notify_trials_ending", trials_every),
        "billing-refresh-report-rollups": ("refresh_report_rollups", reports_every),
        "billing-reconcile-report-rollups": ("refresh_report_rollups", reconcile_every),
        "billing-doubled-plans": ("alert_doubled_plans", plans_every),
    }
    schedule: dict[str, Any] = {
        key: {
            "task": f"billing_integration.{task}",
            "schedule": every,
            "options": {"expires": every},
        }
        for key, (task, every) in entries.items()
    }
    schedule["billing-prune-events"]["kwargs"] = {"older_than": prune_older_than}
    schedule["billing-reconcile-report-rollups"]["kwargs"] = {"recent_months": RECONCILED_MONTHS}
    return schedule


#: The schedule at the default intervals.
BEAT_SCHEDULE: dict[str, Any] = beat_schedule()
