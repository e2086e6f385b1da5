"""The periodic refresh of the reporting rollups: ``billing_integration.refresh_report_rollups``."""

from __future__ import annotations

from typing import Any

from celery import shared_task


# celery ships no type hints (no stub): its decorator is untyped.
@shared_task(name="billing_integration.refresh_report_rollups", ignore_result=True)  # type: ignore[untyped-decorator]
def refresh_report_rollups(recent_months: int = 0) -> dict[str, Any] | None:
    """Recompute the months that changes touched and the months closed since the last run;
    with ``recent_months``, the last closed months too, touched or not (the beat schedule's
    reconciliation: a change that marked nothing, a queryset ``update()`` say, is corrected)."""
    from .rollups import refresh

    done = refresh(recent_months=recent_months)
    if done is None:  # another refresh holds the rollups
        return None
    first = done.first.isoformat() if done.first else None
    return {"months": done.months, "first": first, "basis": done.basis.isoformat()}
