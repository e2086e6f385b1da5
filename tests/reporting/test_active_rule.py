"""The reporting figures use the access checks' allow-list: a subscription whose status is
not in ``BILLING['ACTIVE_STATUSES']`` (unknown ones included) is not active and has ended."""

from __future__ import annotations

import pytest

from billing_integration.models import Subscription
from billing_integration.reporting import metrics
from billing_integration.reporting.report import Period

from .conftest import NOW, dt, make_subscription

pytestmark = pytest.mark.django_db


def test_statuses_outside_the_allow_list_are_neither_active_nor_counted(world):
    before = sum(r["active"] for r in metrics.current_subscriptions(Period(now=NOW)))
    assert before == 5
    for status in ("pending", "past_due", "", "unpaid"):
        make_subscription(
            world.p1,
            world.customers["c1"],
            dt(2025, 1, 10),
            remote_updated=dt(2025, 5, 20),
            status=status,
            cycle_end_date=dt(2025, 7, 10),
        )
    current = sum(r["active"] for r in metrics.current_subscriptions(Period(now=NOW)))
    assert current == Subscription.objects.active(NOW).count() == 5
    history = {
        (r["month"], r["currency"]): r
        for r in metrics.subscription_history(Period(now=NOW, product=world.p1.pk))
    }
    # active from their start in January until they were last changed (2025-05-20)
    assert history[("2025-06", "XOF")]["active_start"] == 2
    assert history[("2025-05", "XOF")]["active_start"] == 2 + 4
    assert history[("2025-05", "XOF")]["cancellations"] == 4
    assert sum(r["active_end"] for r in history.values() if r["month"] == "2025-06") == 3


def test_a_configured_allow_list_is_what_reporting_counts(world, settings):
    settings.BILLING = {**settings.BILLING, "ACTIVE_STATUSES": ["published", "trialing"]}
    make_subscription(
        world.p1,
        world.customers["c1"],
        dt(2025, 1, 10),
        status="trialing",
        cycle_end_date=dt(2025, 7, 10),
    )
    current = sum(r["active"] for r in metrics.current_subscriptions(Period(now=NOW)))
    history = metrics.subscription_history(Period(now=NOW))
    assert current == 6
    assert sum(r["active_end"] for r in history if r["month"] == "2025-06") == 6
