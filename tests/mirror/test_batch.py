"""``outbox.push.push_entries``: the drain's batched claim / call / record, against the sandbox
over real HTTP. The guarantees are ``push_entry_now``'s; these tests check them on a batch."""

from __future__ import annotations

import time
from collections import Counter
from unittest import mock

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing_integration.customers import get_or_create_customer
from billing_integration.mapping.products import to_remote
from billing_integration.models import Customer, OutboxEntry, Subscription
from billing_integration.outbox import push
from billing_integration.outbox.push import PushOutcome, push_entries

from .test_outbox import make_product

pytestmark = pytest.mark.django_db(transaction=True)


def customers(n: int, tag: str = "b") -> list[Customer]:
    with transaction.atomic():
        return [
            Customer.objects.create(
                identifier=f"{tag}-{i}",
                first_name="B",
                last_name=str(i),
                email=f"{tag}{i}@example.com",
            )
            for i in range(n)
        ]


def open_ids() -> list[int]:
    return list(OutboxEntry.objects.open().order_by("pk").values_list("pk", flat=True))


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_batch_pushes_every_entry_once_with_its_key_and_stores_the_answers(
    billing_sandbox, settings, concurrency
):
    settings.BILLING = {**settings.BILLING, "OUTBOX_PUSH_CONCURRENCY": concurrency}
    made = customers(5)
    entries = list(OutboxEntry.objects.order_by("pk"))
    results = push_entries([e.pk for e in entries])
    assert [r.status for r in results] == [PushOutcome.DONE] * 5
    calls = billing_sandbox.requests(operation="create_customer")
    sent = [(c["headers"]["x-idempotency-id"], c["body"]["identifier"]) for c in calls]
    wanted = [(str(e.idempotency_key), f"b-{i}") for i, e in enumerate(entries)]
    if concurrency == 1:  # one call at a time, in primary-key order
        assert sent == wanted
    else:  # calls in flight together may reach the service in any order: each once
        assert sorted(sent) == sorted(wanted)
    remote = {c["identifier"]: c["id"] for c in billing_sandbox.objects("customer")}
    for customer in made:
        customer.refresh_from_db()
        assert str(customer.remote_id) == remote[customer.identifier]
        assert customer.sync_state == "synced"
        assert customer.remote_data["id"] == remote[customer.identifier]
    for entry in OutboxEntry.objects.all():
        assert (entry.state, entry.attempts, entry.payload is not None) == ("done", 1, True)
    assert [r.status for r in push_entries([e.pk for e in entries])] == [PushOutcome.SKIPPED] * 5
    assert len(billing_sandbox.requests(operation="create_customer")) == 5


def test_the_statements_of_a_batch_do_not_grow_with_its_size(billing_sandbox, settings):
    # The shared backoff window is read from the (database) cache once per BACKOFF_REFRESH,
    # whatever the batch size: long enough here that only the warm-up reads it.
    settings.BILLING = {**settings.BILLING, "BACKOFF_REFRESH": 60}

    def statements(n: int, tag: str) -> int:
        customers(n, tag)
        ids = open_ids()
        with CaptureQueriesContext(connection) as queries:
            assert {r.status for r in push_entries(ids)} == {PushOutcome.DONE}
        return len(queries)

    statements(2, "warm")  # token, content types
    small, large = statements(5, "s"), statements(50, "l")
    assert small == large
    # Two transactions (claim, record) and a savepoint around the answers: 8 statements
    # that do the work, whatever the size; plus one read of the service the mirror belongs
    # to (billing_integration.service), once per batch.
    assert large <= 15


def test_two_entries_of_one_object_in_a_batch_go_out_in_order(billing_sandbox):
    product = make_product()
    create = OutboxEntry.objects.get()
    # The create is in flight (its body stored) when the rename is saved: the rename gets an
    # entry of its own.
    OutboxEntry.objects.filter(pk=create.pk).update(attempts=1, payload=to_remote(product))
    product.name = "Pro plan (renamed)"
    product.save()
    OutboxEntry.objects.filter(pk=create.pk).update(attempts=0)
    ids = open_ids()
    assert len(ids) == 2
    assert [r.status for r in push_entries(ids)] == [PushOutcome.DONE, PushOutcome.DONE]
    sent = [
        (r["operation"], (r["body"] or {}).get("name"))
        for r in billing_sandbox.requests()
        if r["operation"] in ("create_product", "update_product")
    ]
    assert sent == [("create_product", "Pro plan"), ("update_product", "Pro plan (renamed)")]
    (remote,) = billing_sandbox.objects("product")
    assert remote["name"] == "Pro plan (renamed)"
    product.refresh_from_db()
    assert str(product.remote_id) == remote["id"] and product.sync_state == "synced"


def test_an_entry_held_by_a_live_lease_or_behind_an_older_one_is_left(billing_sandbox):
    a, _ = customers(2)
    held, other = OutboxEntry.objects.order_by("pk")
    OutboxEntry.objects.filter(pk=held.pk).update(state="in_progress", started_at=timezone.now())
    results = {r.entry_id: r for r in push_entries([held.pk, other.pk])}
    assert results[held.pk].status == PushOutcome.BUSY and results[held.pk].held
    assert results[other.pk].status == PushOutcome.DONE
    assert [
        c["body"]["identifier"] for c in billing_sandbox.requests(operation="create_customer")
    ] == ["b-1"]
    OutboxEntry.objects.filter(pk=held.pk).update(state="failed", in_doubt=True)
    later = OutboxEntry.objects.create(
        content_type=held.content_type, object_id=a.pk, operation="create"
    )
    (result,) = push_entries([later.pk])
    assert result.status == PushOutcome.BUSY and not result.held  # waits behind the in-doubt create
    assert OutboxEntry.objects.get(pk=later.pk).state == "pending"


def test_a_failed_call_is_retried_later_and_the_others_are_done(billing_sandbox, settings):
    settings.BILLING = {**settings.BILLING, "MAX_RETRIES": 0}
    customers(3)
    ids = open_ids()
    billing_sandbox.faults(operation="create_customer", status=503, count=1)
    results = push_entries(ids)
    # The calls are in flight together (OUTBOX_PUSH_CONCURRENCY): the fault hits one of them.
    statuses = [r.status for r in results]
    assert sorted(statuses) == sorted([PushOutcome.RETRY, PushOutcome.DONE, PushOutcome.DONE])
    failed = ids[statuses.index(PushOutcome.RETRY)]
    first = OutboxEntry.objects.get(pk=failed)
    assert first.state == "pending" and first.in_doubt and first.next_attempt_at is not None
    OutboxEntry.objects.filter(pk=failed).update(next_attempt_at=None)
    assert [r.status for r in push_entries(ids)] == [
        PushOutcome.DONE if pk == failed else PushOutcome.SKIPPED for pk in ids
    ]
    keys = [
        c["headers"]["x-idempotency-id"]
        for c in billing_sandbox.requests(operation="create_customer")
    ]
    assert keys.count(str(first.idempotency_key)) == 2  # the retry reused the key
    assert len(billing_sandbox.objects("customer")) == 3


def test_the_deadline_releases_what_was_not_called(billing_sandbox):
    customers(3)
    ids = open_ids()
    results = push_entries(ids, deadline=time.monotonic() - 1)
    assert all(r.status == PushOutcome.BUSY and r.released for r in results)
    assert billing_sandbox.requests(operation="create_customer") == []
    assert [(e.state, e.attempts, e.started_at) for e in OutboxEntry.objects.all()] == [
        ("pending", 0, None)
    ] * 3
    assert [r.status for r in push_entries(ids)] == [PushOutcome.DONE] * 3


def test_an_answer_that_cannot_be_stored_does_not_lose_the_others(billing_sandbox):
    customers(3)
    ids = open_ids()
    real_call = push._call

    def call(entry, obj, client=None):
        data = real_call(entry, obj, client)
        return {} if obj.identifier == "b-1" else data  # no id in this answer

    with mock.patch.object(push, "_call", side_effect=call):
        assert [r.status for r in push_entries(ids)] == [PushOutcome.DONE] * 3
    stored = {c.identifier: c for c in Customer.objects.all()}
    assert stored["b-0"].remote_id and stored["b-2"].remote_id
    assert stored["b-1"].remote_id is None
    assert "could not be stored" in OutboxEntry.objects.get(pk=ids[1]).last_error


def test_a_subscription_in_a_batch_creates_its_customer_once_then_itself(billing_sandbox):
    product = make_product()
    product.publish()
    user = get_user_model().objects.create(username="sub", email="s@example.com")
    customer, _ = get_or_create_customer(user)
    Subscription.objects.create(
        product=product,
        customer=customer,
        selected_currency="XOF",
        selected_billing_cycle="months-1",
        auto_renew=True,
    )
    results = push_entries(open_ids())
    assert {r.status for r in results} <= {PushOutcome.DONE, PushOutcome.SKIPPED}
    ops = Counter(r["operation"] for r in billing_sandbox.requests())
    assert ops["create_customer"] == 1 and ops["create_subscription"] == 1
    assert ops["create_product"] == 1
    assert not OutboxEntry.objects.open().exists()
    assert Subscription.objects.get().remote_id is not None


def test_a_change_after_a_release_is_not_folded_into_the_built_body(billing_sandbox):
    """A released entry is pending again with no attempt counted, but its body was built at
    the claim: a later change gets an entry of its own, so the service ends with it."""
    product = make_product("Plan")
    push_entries(open_ids())
    product.name = "Plan rev 1"
    product.save()
    (first,) = open_ids()
    (released,) = push_entries([first], deadline=time.monotonic() - 1)
    assert released.released
    entry = OutboxEntry.objects.get(pk=first)
    assert (entry.state, entry.attempts) == ("pending", 0)
    assert entry.payload["name"] == "Plan rev 1"  # built at the claim
    product.name = "Plan rev 2"
    product.save()
    ids = open_ids()
    assert len(ids) == 2 and ids[0] == first
    assert [r.status for r in push_entries(ids)] == [PushOutcome.DONE] * 2
    sent = [c["body"].get("name") for c in billing_sandbox.requests(operation="update_product")]
    assert sent == ["Plan rev 1", "Plan rev 2"]
    product.refresh_from_db()
    (remote,) = billing_sandbox.objects("product")
    assert remote["name"] == product.name == "Plan rev 2"


def test_a_change_after_an_in_doubt_reset_gets_an_entry_of_its_own(billing_sandbox):
    """An in-doubt entry put back keeps its body and key (the service may hold it): a later
    change is not folded into it."""
    product = make_product("Plan")
    push_entries(open_ids())
    product.name = "Plan rev 1"
    product.save()
    (first,) = open_ids()
    # As a push whose answer never came, then gave up on (attempts spent), leaves it.
    OutboxEntry.objects.filter(pk=first).update(
        state="failed", in_doubt=True, attempts=3, payload={"name": "Plan rev 1"}
    )
    assert OutboxEntry.objects.reset_failed() == [first]
    entry = OutboxEntry.objects.get(pk=first)
    assert (entry.state, entry.attempts, entry.payload) == ("pending", 0, {"name": "Plan rev 1"})
    product.name = "Plan rev 2"
    product.save()
    assert open_ids() == [first, first + 1]
    assert [r.status for r in push_entries(open_ids())] == [PushOutcome.DONE] * 2
    (remote,) = billing_sandbox.objects("product")
    assert remote["name"] == "Plan rev 2"


# --- the size of a push run's batches (drain.claim_size) --------------------------------------
def test_claim_size_is_half_a_second_of_calls_never_under_the_setting_nor_over_the_cap():
    from billing_integration.outbox.drain import CLAIM_MAX, CLAIM_SECONDS, claim_size

    assert CLAIM_SECONDS == 0.5
    assert claim_size(100, 100, 0.125) == 400  # 800 a second: 400 in half a second
    assert claim_size(100, 100, 5.0) == 100  # a slow service: the setting
    assert claim_size(100, 100, 0.001) == CLAIM_MAX
    assert claim_size(CLAIM_MAX + 500, 10, 0.001) == CLAIM_MAX + 500  # the setting above the cap
    assert claim_size(100, 0, 0.0) == 100  # nothing measured


@pytest.fixture
def batch_sizes(settings, monkeypatch) -> list[int]:
    """Push runs of batches of at least 5; the size of each batch they push, in order."""
    from billing_integration.outbox import drain

    settings.BILLING = {**settings.BILLING, "OUTBOX_CLAIM_BATCH": 5}
    sizes: list[int] = []

    def counted(ids, **kwargs):
        sizes.append(len(ids))
        return push_entries(ids, **kwargs)

    monkeypatch.setattr(drain, "push_entries", counted)
    return sizes


def push_run(seconds_per_batch: float):
    """``push_due`` with a fake clock on which each batch takes ``seconds_per_batch``."""
    from billing_integration.outbox import drain

    ticks = iter(range(1000))
    return drain.push_due(clock=lambda: next(ticks) * seconds_per_batch)


@pytest.mark.parametrize(
    ("seconds_per_batch", "batches"),
    [(0.001, [5, 25]), (10.0, [5, 5, 5, 5, 5, 5])],
    ids=["fast service: the next batch takes the rest", "slow service: the setting's size"],
)
def test_a_push_run_claims_larger_batches_when_the_calls_are_fast(
    billing_sandbox, batch_sizes, seconds_per_batch, batches
):
    customers(30, "grow")
    report = push_run(seconds_per_batch)
    assert batch_sizes == batches
    assert report.pushed == 30
    assert len(billing_sandbox.requests(operation="create_customer")) == 30
    assert set(OutboxEntry.objects.values_list("state", flat=True)) == {"done"}


def test_the_pace_counts_calls_not_entries_settled_without_one(billing_sandbox, batch_sizes):
    """Entries settled without a call (here: edits of pushed customers, which the service
    cannot take) would make a batch look fast: the next batch stays at the setting."""
    import uuid

    from billing_integration.outbox import from_remote

    with from_remote():
        pushed = [
            Customer.objects.create(identifier=f"old-{i}", first_name="A", remote_id=uuid.uuid4())
            for i in range(10)
        ]
    for customer in pushed:
        customer.first_name = "Edited"
        customer.save()
    customers(20, "new")
    report = push_run(0.001)
    # 10 edits (no call): two batches at the setting; then 5 calls, fast: the rest at once.
    assert batch_sizes == [5, 5, 5, 15]
    assert report.handled == 30
    assert len(billing_sandbox.requests(operation="create_customer")) == 20
