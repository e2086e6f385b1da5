"""The periodic check for a customer paying for two plans of a group:
``billing_integration.alert_doubled_plans``."""

from __future__ import annotations

from celery import shared_task


# celery ships no type hints (no stub): its decorator is untyped.
@shared_task(name="billing_integration.alert_doubled_plans", ignore_result=True)  # type: ignore[untyped-decorator]
def alert_doubled_plans() -> int:
    """Email staff about every customer with two plans of a group renewing (docs/changes.md)."""
    from .changes import alert_doubled_plans as alert

    return alert()
