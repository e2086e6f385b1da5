"""``outbox.push.push_entry`` against the sandbox over real HTTP: each entry once with its key,
order per object, the same key on retry, two pushers racing one entry make one call."""

from __future__ import annotations

import json
import threading
from collections import Counter
from unittest import mock

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing_integration.mapping.products import to_remote
from billing_integration.models import Customer, OutboxEntry, Product, Subscription
from billing_integration.outbox import push
from billing_integration.outbox.push import PushOutcome, push_entry
from billing_integration.sync.pull import pull_subscriptions
from billing_integration.timestamps import parse_timestamp
from billing_integration.webhooks.ingest import store_delivery
from billing_integration.webhooks.processing import process_event
from billing_integration.webhooks.verification import Verification

from .conftest import subscribe
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


def push_entries(ids: list[int]) -> list[push.PushResult]:
    return [push_entry(pk) for pk in ids]


def test_each_entry_is_pushed_once_with_its_key_and_the_answers_are_stored(billing_sandbox):
    made = customers(5)
    entries = list(OutboxEntry.objects.order_by("pk"))
    results = push_entries([e.pk for e in entries])
    assert [r.status for r in results] == [PushOutcome.DONE] * 5
    calls = billing_sandbox.requests(operation="create_customer")
    sent = [(c["headers"]["x-idempotency-id"], c["body"]["identifier"]) for c in calls]
    wanted = [(str(e.idempotency_key), f"b-{i}") for i, e in enumerate(entries)]
    assert sent == wanted
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


def test_the_statements_of_a_push_do_not_grow_with_the_number_pushed(billing_sandbox, monkeypatch):
    monkeypatch.setattr("billing_integration.client.backoff.REFRESH", 60.0)  # no timed cache read

    def statements(n: int, tag: str) -> float:
        customers(n, tag)
        ids = open_ids()
        with CaptureQueriesContext(connection) as queries:
            assert {r.status for r in push_entries(ids)} == {PushOutcome.DONE}
        return len(queries) / n

    statements(2, "warm")  # token, content types
    assert statements(5, "s") == statements(20, "l")


@pytest.mark.postgresql
def test_two_pushers_racing_one_entry_make_one_call(billing_sandbox):
    """The second pusher tries to claim the entry while the first holds its row lock: it
    skips the row (busy); the first pushes it."""
    customers(1)
    (pk,) = open_ids()
    real = push._build
    results: list[str] = []

    def run():
        try:
            results.append(push_entry(pk).status)
        finally:
            connection.close()

    def build(entry, obj):
        if not results and threading.current_thread() is threading.main_thread():
            other = threading.Thread(target=run)  # while this pusher holds the row
            other.start()
            other.join(timeout=30)
            while_held.extend(results)  # the other's answer, given before this one went on
        return real(entry, obj)

    while_held: list[str] = []
    with mock.patch.object(push, "_build", side_effect=build):
        results.append(push_entry(pk).status)
    assert while_held == [PushOutcome.BUSY]  # skipped the locked row, did not wait for it
    assert results == [PushOutcome.BUSY, PushOutcome.DONE]  # the race happened, one won
    assert len(billing_sandbox.requests(operation="create_customer")) == 1


@pytest.mark.postgresql
def test_an_edit_committed_while_the_answer_is_recorded_is_not_lost(billing_sandbox):
    """A worker records a push's answer (its product marked synced when no other entry is
    open) while a request saves another edit of the product. The edit must not be marked
    synced: the next pull would overwrite it with the service's older state, and its own
    entry would then find nothing to send. The edit's save waits for the record (the row
    lock), then leaves the product pending; the edit reaches the service."""
    from billing_integration.models import Product
    from billing_integration.sync.pull import pull_products

    product = make_product("Plan")
    assert [r.status for r in push_entries(open_ids())] == [PushOutcome.DONE]
    product.refresh_from_db()
    product.name = "Plan v1"
    product.save()
    (first,) = open_ids()
    real_done = push._done
    edit: dict[str, object] = {}

    def edit_elsewhere() -> None:
        try:
            other = Product.objects.get(pk=product.pk)
            other.name = "Plan v2"
            edit["started"] = True
            other.save()
            edit["saved"] = True
        finally:
            connection.close()

    def done_then_edit(entry, note="", **fields):
        others_open = real_done(entry, note, **fields)
        if entry.pk == first and "thread" not in edit:
            edit["thread"] = thread = threading.Thread(target=edit_elsewhere)
            thread.start()
            thread.join(timeout=1)  # the edit runs while this record's transaction is open
            edit["saved_before_record"] = edit.get("saved", False)
        return others_open

    with mock.patch.object(push, "_done", side_effect=done_then_edit):
        assert push_entry(first).status == PushOutcome.DONE
    edit["thread"].join(timeout=30)  # type: ignore[attr-defined]
    assert edit.get("started") and edit.get("saved")  # the race happened
    assert edit["saved_before_record"] is False  # the edit waited for the record
    product.refresh_from_db()
    assert (product.name, product.sync_state) == ("Plan v2", "pending")

    pull_products()  # the hourly pull, before the edit is pushed: the local edit is kept
    product.refresh_from_db()
    assert product.name == "Plan v2"
    assert [r.status for r in push_entries(open_ids())] == [PushOutcome.DONE]
    assert [p["name"] for p in billing_sandbox.objects("product")] == ["Plan v2"]
    bodies = [c["body"].get("name") for c in billing_sandbox.requests(operation="update_product")]
    assert bodies == ["Plan v1", "Plan v2"]


def test_a_claim_lost_to_another_pusher_between_its_read_and_its_update_calls_nothing(
    billing_sandbox,
):
    """Without row locks (SQLite), two pushers may read the same pending row: the other one
    claims it between this one's read and its update, and this one calls nothing."""
    customers(1)
    (pk,) = open_ids()
    real = push._build
    raced = []

    def build(entry, obj):
        if not raced:  # the other pusher claims the row now
            raced.append(OutboxEntry.objects.filter(pk=pk, state="pending").update(attempts=1))
        return real(entry, obj)

    with mock.patch.object(push, "_build", side_effect=build):
        assert push_entry(pk).status == PushOutcome.BUSY
    assert raced == [1]  # the race happened
    assert billing_sandbox.requests(operation="create_customer") == []


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
    assert results[held.pk].status == PushOutcome.BUSY and results[held.pk].retry_in
    assert results[other.pk].status == PushOutcome.DONE
    assert [
        c["body"]["identifier"] for c in billing_sandbox.requests(operation="create_customer")
    ] == ["b-1"]
    OutboxEntry.objects.filter(pk=held.pk).update(state="failed", in_doubt=True)
    later = OutboxEntry.objects.create(
        content_type=held.content_type, object_id=a.pk, operation="create"
    )
    (result,) = push_entries([later.pk])
    assert result.status == PushOutcome.BUSY  # waits behind the in-doubt create
    assert OutboxEntry.objects.get(pk=later.pk).state == "pending"


def test_a_failed_call_is_retried_later_and_the_others_are_done(billing_sandbox, monkeypatch):
    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    customers(3)
    ids = open_ids()
    billing_sandbox.faults(operation="create_customer", status=503, count=1)
    results = push_entries(ids)
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


def test_an_answer_that_cannot_be_stored_does_not_lose_the_others(billing_sandbox):
    customers(3)
    ids = open_ids()
    real_call = push._call

    def call(entry, obj, client=None):
        data = real_call(entry, obj, client)
        return {} if obj.identifier == "b-1" else data  # no id in this answer

    with mock.patch.object(push, "_call", side_effect=call):
        statuses = [r.status for r in push_entries(ids)]
    assert statuses == [PushOutcome.DONE, PushOutcome.FAILED, PushOutcome.DONE]
    stored = {c.identifier: c for c in Customer.objects.all()}
    assert stored["b-0"].remote_id and stored["b-2"].remote_id
    assert stored["b-1"].remote_id is None
    failed = OutboxEntry.objects.get(pk=ids[1])  # in doubt: the service may hold it
    assert failed.in_doubt and "could not be stored" in failed.last_error


def test_a_subscription_in_a_batch_creates_its_customer_once_then_itself(billing_sandbox):
    product = make_product()
    product.publish()
    subscribe(product, "sub", "s@example.com")
    results = push_entries(open_ids())
    assert {r.status for r in results} <= {PushOutcome.DONE, PushOutcome.SKIPPED}
    ops = Counter(r["operation"] for r in billing_sandbox.requests())
    assert ops["create_customer"] == 1 and ops["create_subscription"] == 1
    assert ops["create_product"] == 1
    assert not OutboxEntry.objects.open().exists()
    assert Subscription.objects.get().remote_id is not None


def test_a_change_after_a_body_was_built_is_not_folded_into_it(billing_sandbox):
    """An entry whose body was built (a worker died after its claim) keeps that body: a later
    change gets an entry of its own, so the service ends with it."""
    product = make_product("Plan")
    push_entries(open_ids())
    product.name = "Plan rev 1"
    product.save()
    (first,) = open_ids()
    OutboxEntry.objects.filter(pk=first).update(
        state="in_progress", attempts=1, operation="update", payload={"name": "Plan rev 1"}
    )
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


def test_a_push_task_pushes_its_own_entry_and_enqueues_the_next_of_its_object(
    billing_sandbox, recorded_enqueues, django_capture_on_commit_callbacks
):
    """One task, one entry: the next entry of the same object is enqueued when it is over; the
    other objects' entries wait for their own tasks; a task whose entry is done sends nothing."""
    from billing_integration.outbox.tasks import push_outbox_entry

    a, _b = customers(2)
    OutboxEntry.objects.filter(object_id=a.pk).update(payload={"built": True})
    a.first_name = "Renamed"
    a.save()  # a's create has its body built: the rename gets an entry of its own
    create_a, create_b, rename_a = open_ids()
    OutboxEntry.objects.filter(pk=create_a).update(payload=None)
    recorded_enqueues.clear()
    with django_capture_on_commit_callbacks() as callbacks:
        assert push_outbox_entry(create_a) == "done"
    for callback in callbacks:
        callback()
    assert recorded_enqueues == [rename_a]
    calls = billing_sandbox.requests(operation="create_customer")
    assert [c["body"]["identifier"] for c in calls] == ["b-0"]
    assert OutboxEntry.objects.get(pk=create_b).state == "pending"
    assert [push_outbox_entry(pk) for pk in (create_b, rename_a)] == ["done", "done"]
    assert [push_outbox_entry(pk) for pk in (create_a, create_b)] == ["skipped", "skipped"]
    assert len(billing_sandbox.requests(operation="create_customer")) == 2


def test_a_task_skips_an_entry_behind_an_open_one_and_pushes_the_others(billing_sandbox):
    a, b, c = customers(3)
    OutboxEntry.objects.filter(object_id=a.pk).update(
        state="in_progress", started_at=timezone.now()
    )
    later = OutboxEntry.objects.create(
        content_type=OutboxEntry.objects.get(object_id=a.pk).content_type,
        object_id=a.pk,
        operation="update",
    )
    from billing_integration.outbox.tasks import push_outbox_entry

    assert push_outbox_entry(later.pk) == "busy"  # waits behind a's create in progress
    for customer in (b, c):
        assert push_outbox_entry(OutboxEntry.objects.get(object_id=customer.pk).pk) == "done"
    assert OutboxEntry.objects.get(pk=later.pk).state == "pending"
    calls = billing_sandbox.requests(operation="create_customer")
    assert [call["body"]["identifier"] for call in calls] == ["b-1", "b-2"]


def test_an_answer_older_than_an_event_applied_meanwhile_does_not_take_it_back(billing_sandbox):
    """While a subscription's create call is out, a pull links the row to the one created
    (adopted by its customer, product and cycle), then the service cancels it and that event
    is applied here. The create's answer, the service's state right
    after our write (published, no date_updated), then wrote over it: the subscription was
    published again (access kept) and its version nulled. An answer older than the stored
    version settles the entry but keeps the stored state; one without a version keeps the
    stored version."""
    product = make_product()
    product.publish()
    subscribe(product, "late", "l@example.com")
    real_call = push._call
    events: list[dict] = []

    def call(entry, obj, client=None):
        data = real_call(entry, obj, client)
        if isinstance(obj, Subscription):
            assert data["status"] == "published" and data.get("date_updated") is None
            assert pull_subscriptions().updated == 1  # adopted: the row has the remote id
            billing_sandbox.advance(seconds=60)  # the cancel a minute later
            envelope = billing_sandbox.trigger("subscription.canceled", data["id"])
            body = json.dumps(envelope).encode()
            stored = store_delivery(body, {}, Verification("signature", envelope["id"]))
            events.append({"envelope": envelope, "result": process_event(stored.event.pk)})
        return data

    with mock.patch.object(push, "_call", side_effect=call):
        results = push_entries(open_ids())
    assert {r.status for r in results} <= {PushOutcome.DONE, PushOutcome.SKIPPED}
    (event,) = events
    assert event["result"].outcome == "applied"
    sub = Subscription.objects.get()
    assert sub.status == "canceled"
    assert sub.remote_updated == parse_timestamp(event["envelope"]["data"]["date_updated"])
    assert sub.sync_state == "synced" and str(sub.remote_id) == event["envelope"]["data"]["id"]


def test_an_answer_without_a_version_keeps_the_stored_one(billing_sandbox):
    """While a subscription's create call is out, a pull links the row and an undated event
    is applied (its version, the time it was received, is stored). The create's answer has no
    ``date_updated``: it wrote ``remote_updated`` = null, and the next event older than the
    stored state applied. The stored version now stays; the answer's state applies (a version
    of ours never makes the service's answer stale)."""
    product = make_product()
    product.publish()
    subscribe(product, "undated", "u@example.com")
    real_call = push._call
    versions: list = []

    def call(entry, obj, client=None):
        data = real_call(entry, obj, client)
        if isinstance(obj, Subscription):
            assert pull_subscriptions().updated == 1  # adopted: the row has the remote id
            envelope = {
                "id": "evt-undated",
                "type": "subscription.renewal",
                "data": {"id": data["id"]},
            }
            stored = store_delivery(
                json.dumps(envelope).encode(), {}, Verification("signature", "e")
            )
            assert process_event(stored.event.pk).outcome == "applied"
            versions.append(Subscription.objects.values_list("remote_updated", flat=True).get())
        return data

    with mock.patch.object(push, "_call", side_effect=call):
        results = push_entries(open_ids())
    assert {r.status for r in results} <= {PushOutcome.DONE, PushOutcome.SKIPPED}
    sub = Subscription.objects.get()
    assert versions[0] is not None and sub.remote_updated == versions[0]
    assert sub.remote_updated_ours and sub.status == "published" and sub.sync_state == "synced"


@pytest.mark.postgresql
def test_an_edit_saved_while_a_pusher_claims_the_entry_gets_an_entry_of_its_own(billing_sandbox):
    """A pusher holds an unbuilt entry's row (building its body) when a request saves another
    edit of the product: the edit does not extend that entry (its body would not carry the
    edit), nor wait for the pusher (``SKIP LOCKED``); it writes an entry of its own, and the
    service ends with the edit."""
    from billing_integration.models import Product

    product = make_product("Plan")
    push_entries(open_ids())
    product.name = "Plan rev 1"
    product.save()
    (first,) = open_ids()
    real = push._build
    edit: dict[str, object] = {}

    def edit_elsewhere() -> None:
        try:
            other = Product.objects.get(pk=product.pk)
            other.name = "Plan rev 2"
            other.save()
            edit["saved"] = True
        finally:
            connection.close()

    def build(entry, obj):
        if "thread" not in edit:  # the edit is saved while this pusher holds the entry's row
            edit["thread"] = thread = threading.Thread(target=edit_elsewhere)
            thread.start()
            thread.join(timeout=10)
            edit["saved_while_held"] = edit.get("saved", False)
        return real(entry, obj)

    with mock.patch.object(push, "_build", side_effect=build):
        assert push_entry(first).status == PushOutcome.DONE
    edit["thread"].join(timeout=30)  # type: ignore[attr-defined]
    assert edit["saved_while_held"] is True  # the race happened; the edit did not wait
    ids = open_ids()
    assert len(ids) == 1 and ids[0] > first  # the edit's own entry
    assert [r.status for r in push_entries(ids)] == [PushOutcome.DONE]
    sent = [c["body"].get("name") for c in billing_sandbox.requests(operation="update_product")]
    assert sent == ["Plan rev 1", "Plan rev 2"]
    (remote,) = billing_sandbox.objects("product")
    assert remote["name"] == "Plan rev 2"


def test_a_body_that_cannot_be_built_fails_the_entry_naming_the_setting(billing_sandbox):
    """A pushed product holding a currency id BILLING['CURRENCIES'] lacks (pulled as received)
    and edited: building its body raised out of push_entry, so the entry stayed pending with
    no error, retried by every sweep, the product "Pending push" for ever. It fails, nothing
    sent, saying which setting to fix (docs/admin.md); the next entry of the product waits
    for no one."""
    product = make_product()
    assert [r.status for r in push_entries(open_ids())] == [PushOutcome.DONE]
    Product.objects.filter(pk=product.pk).update(selected_currencies=[1, 2, 9])
    product.refresh_from_db()
    attempted = product.last_attempt_at
    assert attempted is not None
    product.description = "Now with more"
    product.save()
    billing_sandbox.clear_requests()

    [entry_id] = open_ids()
    result = push_entry(entry_id)

    assert result.status == PushOutcome.FAILED
    entry = OutboxEntry.objects.get(pk=entry_id)
    assert entry.state == "failed" and not entry.in_doubt
    assert "Currency 9 is not in BILLING['CURRENCIES']" in entry.last_error
    product.refresh_from_db()
    assert product.sync_state == "failed"
    assert "Currency 9 is not in BILLING['CURRENCIES']" in product.sync_error
    assert product.last_attempt_at == attempted  # no call was attempted
    assert billing_sandbox.requests(operation="update_product") == []
    # Once the product can be sent (the currency unticked), its next change goes out.
    product.selected_currencies = [1, 2]
    product.save()
    assert [r.status for r in push_entries(open_ids())] == [PushOutcome.DONE]
    product.refresh_from_db()
    assert product.sync_state == "synced"
