"""Celery task of the periodic pull: ``billing_integration.sync_all`` (the name deployed beat
schedules use)."""

from __future__ import annotations

from celery import shared_task

from ..exceptions import BillingError
from ..health import record_run

__all__ = ["sync_all"]


@shared_task(name="billing_integration.sync_all", ignore_result=True)
def sync_all() -> dict[str, dict[str, int]]:
    """Reconcile: pull products, customers and subscriptions (see ``billing_sync``), each on
    its own; raises the first failure once all were tried."""
    from .pull import pull_each

    record_run("sync_all")  # billing_doctor: beat ran
    results: dict[str, dict[str, int]] = {}
    failures: list[BillingError] = []
    for resource, counts in pull_each():
        if isinstance(counts, BillingError):
            failures.append(counts)
        else:
            results[resource] = counts.as_dict()
    if failures:
        raise failures[0]
    return results
