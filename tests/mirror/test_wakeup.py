"""The coalesced wake-up (``billing_integration.wakeup``) of the ``push_due_entries`` drain:
one message per burst, and no lost wake-up (clear the flag first, then look)."""

from __future__ import annotations

from collections import Counter
from unittest import mock

import pytest
from django.db import transaction

from billing_integration import wakeup
from billing_integration.models import Customer, OutboxEntry
from billing_integration.outbox import drain, tasks
from billing_integration.outbox.tasks import enqueue as real_enqueue  # before conftest patches it
from billing_integration.outbox.tasks import push_due_entries

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> mock.Mock:
    """The real ``enqueue`` (kick), with the drain's ``apply_async`` spied (no broker)."""
    monkeypatch.setattr(tasks, "enqueue", real_enqueue)
    names = [tasks.push_run(slot).name for slot in range(4)]
    for name in names:
        wakeup.clear(name)
    with mock.patch.object(push_due_entries, "apply_async") as apply_async:
        yield apply_async
    for name in names:
        wakeup.clear(name)


def slot_messages(sent: mock.Mock, slot: int = 0) -> int:
    """Messages sent for push run ``slot`` (0: the run commits kick)."""
    wanted = () if slot == 0 else (slot,)
    return sum(1 for call in sent.call_args_list if tuple(call.kwargs["args"]) == wanted)


def customer(i: int, tag: str = "c") -> Customer:
    return Customer.objects.create(
        identifier=f"{tag}-{i}", first_name="B", last_name=str(i), email=f"{tag}{i}@example.com"
    )


def creates_per_identifier(billing_sandbox) -> Counter:
    return Counter(
        r["body"]["identifier"] for r in billing_sandbox.requests(operation="create_customer")
    )


def test_a_burst_of_100_changes_sends_one_message_and_one_drain_pushes_all(billing_sandbox, sent):
    for i in range(50):  # 50 separate commits ...
        customer(i)
    with transaction.atomic():  # ... and 50 in one transaction
        for i in range(50, 100):
            customer(i)
    assert sent.call_count == 1
    assert push_due_entries() == 100  # what the worker runs for that one message
    assert set(OutboxEntry.objects.values_list("state", flat=True)) == {"done"}
    per_object = creates_per_identifier(billing_sandbox)
    assert len(per_object) == 100 and set(per_object.values()) == {1}
    # It found a full batch (OUTBOX_CLAIM_BATCH, 100): it woke the run of slot 1, once.
    assert slot_messages(sent, 1) == 1
    # The drain cleared the flag first: the next change kicks again.
    customer(100)
    assert slot_messages(sent, 0) == 2


def test_a_change_committed_while_a_drain_runs_is_pushed(billing_sandbox, sent):
    for i in range(3):
        customer(i)
    assert sent.call_count == 1
    real_push = drain.push_entries
    added: list[int] = []

    def push_and_commit_another(ids, **kw):
        results = real_push(ids, **kw)
        if not added:  # during the run, after the flag was cleared
            added.append(customer(99, "late").pk)
        return results

    with mock.patch.object(drain, "push_entries", side_effect=push_and_commit_another):
        handled = push_due_entries()
    # Either this run saw it (higher pk, same sweep) or its kick sent a new message: here both.
    assert handled == 4
    assert sent.call_count == 2
    assert set(OutboxEntry.objects.values_list("state", flat=True)) == {"done"}
    assert creates_per_identifier(billing_sandbox)["late-99"] == 1


def test_a_change_whose_kick_was_suppressed_is_seen_by_the_pending_drain(billing_sandbox, sent):
    customer(0)  # sends; the flag stays set until that message's drain runs
    customer(1)  # committed before that drain clears the flag: suppressed ...
    assert sent.call_count == 1
    assert push_due_entries() == 2  # ... and seen by the drain, which looks after clearing
    assert creates_per_identifier(billing_sandbox) == {"c-0": 1, "c-1": 1}


def test_a_refused_publish_drops_the_flag_so_the_next_commit_retries(billing_sandbox, sent):
    sent.side_effect = ConnectionError("broker down")
    customer(0)
    sent.side_effect = None
    customer(1)
    assert sent.call_count == 2
    assert push_due_entries() == 2


def test_retryable_failures_schedule_one_timer_for_the_earliest_entry(
    billing_sandbox, sent, settings
):
    settings.BILLING = {**settings.BILLING, "MAX_RETRIES": 0, "OUTBOX_RETRY_BASE": 5.0}
    billing_sandbox.faults(operation="create_customer", status=503, count=2)
    customer(0)
    customer(1)
    sent.reset_mock()
    assert push_due_entries() == 2
    entries = list(OutboxEntry.objects.order_by("pk"))
    assert [e.state for e in entries] == ["pending", "pending"]
    assert all(e.next_attempt_at is not None for e in entries)
    (call,) = sent.call_args_list  # one timer, for the earliest retry
    assert 3.0 <= call.kwargs["countdown"] <= 7.0
    OutboxEntry.objects.update(next_attempt_at=None)  # the timer fires
    assert push_due_entries() == 2
    assert set(OutboxEntry.objects.values_list("state", flat=True)) == {"done"}
    assert len(billing_sandbox.objects("customer")) == 2


def test_the_budget_re_kicks_the_drain(billing_sandbox, sent, settings):
    settings.BILLING = {**settings.BILLING, "OUTBOX_PUSH_MAX_ENTRIES": 2}
    for i in range(3):
        customer(i)
    sent.reset_mock()
    assert push_due_entries() == 2
    assert sent.call_count == 1  # kicked itself for the rest
    assert push_due_entries() == 1
    assert set(OutboxEntry.objects.values_list("state", flat=True)) == {"done"}
