"""Celery task of the periodic pull: ``billing_integration.sync_all`` (the name deployed beat
schedules use)."""

from __future__ import annotations

from celery import shared_task

from ..health import record_run

__all__ = ["sync_all"]


@shared_task(name="billing_integration.sync_all", ignore_result=True)
def sync_all() -> dict[str, dict[str, int]]:
    """Reconcile: pull products, customers and subscriptions (see ``billing_sync``)."""
    from .pull import pull_customers, pull_products, pull_subscriptions

    record_run("sync_all")  # billing_doctor: beat ran
    return {
        "products": pull_products().as_dict(),
        "customers": pull_customers().as_dict(),
        "subscriptions": pull_subscriptions().as_dict(),
    }
