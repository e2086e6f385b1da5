"""Issue 13: one push path (a push of one entry is a batch of one), one definition of "due",
push outcomes as an enum, one setting per job, and the Celery task names kept."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing_integration.checks import check_billing_settings
from billing_integration.conf import billing_settings
from billing_integration.models import Customer, OutboxEntry
from billing_integration.models.outbox import OutboxState
from billing_integration.outbox.push import PushOutcome, push_entries, push_entry
from billing_integration.outbox.tasks import push_due_entries, sweep_outbox

pytestmark = pytest.mark.django_db


def customer(i: int) -> Customer:
    return Customer.objects.create(
        identifier=f"one-{i}", first_name="O", last_name=str(i), email=f"one{i}@example.com"
    )


def test_push_outcomes_are_their_own_enum_not_entry_states(billing_sandbox):
    customer(1)
    result = push_entry(OutboxEntry.objects.get().pk)
    assert result.status is PushOutcome.DONE
    assert not isinstance(result.status, OutboxState)
    assert {o.value for o in PushOutcome} == {
        "done",
        "skipped",
        "busy",
        "retry",
        "failed",
        "refused",
    }


def test_an_entry_that_is_gone_is_skipped_by_a_batch_as_by_a_push_of_one(billing_sandbox):
    customer(1)
    pk = OutboxEntry.objects.get().pk
    OutboxEntry.objects.filter(pk=pk).delete()
    assert push_entry(pk).status == PushOutcome.SKIPPED
    [result] = push_entries([pk])
    assert result.status == PushOutcome.SKIPPED and not result.held
    assert billing_sandbox.requests(operation="create_customer") == []


def test_due_is_one_definition_with_the_sweeps_staleness_as_a_parameter():
    customer(1)
    entry = OutboxEntry.objects.get()
    lease, stale = 300.0, 60.0
    assert list(OutboxEntry.objects.due(lease=lease)) == [entry]  # a push run takes it now
    assert list(OutboxEntry.objects.due(lease=lease, stale_after=stale)) == []  # not stale
    old = timezone.now() - timedelta(seconds=120)
    OutboxEntry.objects.filter(pk=entry.pk).update(updated_at=old)
    assert list(OutboxEntry.objects.due(lease=lease, stale_after=stale)) == [entry]
    OutboxEntry.objects.filter(pk=entry.pk).update(next_attempt_at=timezone.now() + timedelta(1))
    assert not OutboxEntry.objects.due(lease=lease).exists()  # its retry time has not come
    OutboxEntry.objects.filter(pk=entry.pk).update(state="in_progress", started_at=old)
    assert OutboxEntry.objects.due(lease=60.0).exists()  # the lease expired
    assert OutboxEntry.objects.due(lease=60.0, stale_after=stale).exists()
    assert not OutboxEntry.objects.due(lease=lease).exists()  # the worker still holds it


def test_the_stale_sweep_has_its_own_batch_size(settings, recorded_enqueues):
    settings.BILLING = {
        **settings.BILLING,
        "OUTBOX_REQUEUE_BATCH": 2,
        "OUTBOX_PUSH_MAX_ENTRIES": 1000,
    }
    for i in range(3):
        customer(i)
    recorded_enqueues.clear()
    old = timezone.now() - timedelta(seconds=3600)
    OutboxEntry.objects.update(updated_at=old)
    assert sweep_outbox() == 2
    assert len(recorded_enqueues) == 2


def test_the_deprecated_drain_batch_sets_both_counts_unless_they_are_set(settings):
    settings.BILLING = {**settings.BILLING, "OUTBOX_DRAIN_BATCH": 7}
    assert billing_settings.OUTBOX_PUSH_MAX_ENTRIES == 7
    assert billing_settings.OUTBOX_REQUEUE_BATCH == 7
    settings.BILLING = {**settings.BILLING, "OUTBOX_DRAIN_BATCH": 7, "OUTBOX_REQUEUE_BATCH": 3}
    assert billing_settings.OUTBOX_PUSH_MAX_ENTRIES == 7
    assert billing_settings.OUTBOX_REQUEUE_BATCH == 3


@pytest.mark.parametrize("key", ["OUTBOX_PUSH_MAX_ENTRIES", "OUTBOX_REQUEUE_BATCH"])
def test_the_counts_are_checked(settings, key):
    settings.BILLING = {**settings.BILLING, key: -1}
    assert "billing_integration.E007" in [e.id for e in check_billing_settings()]


def test_the_task_names_of_deployments_beat_schedules_are_kept_and_push_entry_is_gone():
    tasks = push_due_entries.app.tasks
    assert push_due_entries.name == "billing_integration.push_pending"
    assert sweep_outbox.name == "billing_integration.drain_outbox"
    assert {"billing_integration.push_pending", "billing_integration.drain_outbox"} <= set(tasks)
    assert "billing_integration.push_entry" not in tasks
