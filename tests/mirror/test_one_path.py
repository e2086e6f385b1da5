"""One push function, one definition of "due", push outcomes as an enum, the sweep's batch,
and the Celery task names."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing_integration.models import Customer, OutboxEntry
from billing_integration.models.outbox import LEASE, OutboxState
from billing_integration.outbox import tasks
from billing_integration.outbox.push import PushOutcome, push_entry
from billing_integration.outbox.tasks import push_outbox_entry, sweep_outbox

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


def test_an_entry_that_is_gone_is_skipped(billing_sandbox):
    customer(1)
    pk = OutboxEntry.objects.get().pk
    OutboxEntry.objects.filter(pk=pk).delete()
    assert push_entry(pk).status == PushOutcome.SKIPPED
    assert billing_sandbox.requests(operation="create_customer") == []


def test_due_is_one_definition_with_the_sweeps_staleness_as_a_parameter():
    customer(1)
    entry = OutboxEntry.objects.get()
    stale = 60.0
    assert list(OutboxEntry.objects.due()) == [entry]  # a push may take it now
    assert list(OutboxEntry.objects.due(stale_after=stale)) == []  # not stale
    old = timezone.now() - timedelta(seconds=120)
    OutboxEntry.objects.filter(pk=entry.pk).update(updated_at=old)
    assert list(OutboxEntry.objects.due(stale_after=stale)) == [entry]
    OutboxEntry.objects.filter(pk=entry.pk).update(next_attempt_at=timezone.now() + timedelta(1))
    assert not OutboxEntry.objects.due().exists()  # its retry time has not come
    OutboxEntry.objects.filter(pk=entry.pk).update(state="in_progress", started_at=old)
    assert not OutboxEntry.objects.due().exists()  # the worker still holds it
    expired = timezone.now() - timedelta(seconds=LEASE + 1)
    OutboxEntry.objects.filter(pk=entry.pk).update(started_at=expired)
    assert OutboxEntry.objects.due(stale_after=stale).exists()  # the lease expired


def test_the_sweep_re_enqueues_at_most_its_batch(monkeypatch, recorded_enqueues):
    monkeypatch.setattr(tasks, "SWEEP_BATCH", 2)
    for i in range(3):
        customer(i)
    recorded_enqueues.clear()
    old = timezone.now() - timedelta(seconds=3600)
    OutboxEntry.objects.update(updated_at=old)
    assert sweep_outbox() == 2
    assert len(recorded_enqueues) == 2


def test_the_task_names_of_deployments_beat_schedules():
    registered = push_outbox_entry.app.tasks
    assert push_outbox_entry.name == "billing_integration.push_entry"
    assert sweep_outbox.name == "billing_integration.drain_outbox"
    assert {"billing_integration.push_entry", "billing_integration.drain_outbox"} <= set(registered)


def test_an_entry_whose_pushes_never_finish_fails_in_doubt_not_forever(
    billing_sandbox, monkeypatch
):
    """A push that raises other than a billing error (or whose worker dies) leaves its entry in
    progress for the sweep; after MAX_ATTEMPTS expired leases it fails, in doubt, shown on its
    object, and a retry by staff sends it with the same key."""
    from billing_integration.outbox import push
    from billing_integration.outbox.retry import retry_failed

    bob = customer(1)
    entry = OutboxEntry.objects.get()

    def crash(*args, **kwargs):
        raise RuntimeError("a bug, not the service")

    monkeypatch.setattr(push, "_call", crash)
    expired = timezone.now() - timedelta(seconds=LEASE + 1)
    for _ in range(push.MAX_ATTEMPTS):
        with pytest.raises(RuntimeError):
            push_entry(entry.pk)
        entry.refresh_from_db()
        assert entry.state == OutboxState.IN_PROGRESS
        OutboxEntry.objects.filter(pk=entry.pk).update(started_at=expired)  # the lease expires

    assert push_entry(entry.pk).status == PushOutcome.FAILED
    entry.refresh_from_db()
    bob.refresh_from_db()
    assert entry.state == OutboxState.FAILED and entry.in_doubt
    assert "never finished in 8 attempts" in entry.last_error
    assert bob.sync_state == "failed" and "never finished" in bob.sync_error
    assert billing_sandbox.requests(operation="create_customer") == []

    monkeypatch.undo()
    key = entry.idempotency_key
    assert retry_failed() == 1
    assert push_entry(entry.pk).status == PushOutcome.DONE
    [sent] = billing_sandbox.requests(operation="create_customer")
    assert sent["headers"]["x-idempotency-id"] == str(key)
