"""The outbox against the sandbox over real HTTP, pushed synchronously (no worker)."""

from __future__ import annotations

import json
import threading
import uuid
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from billing_integration.client import get_client
from billing_integration.customers import ensure_customer_pushed, get_or_create_customer
from billing_integration.models import (
    BillingCycle,
    Customer,
    OutboxEntry,
    Price,
    Product,
    ProductDeletionRefused,
    Subscription,
)
from billing_integration.outbox import from_remote, push, tasks
from billing_integration.outbox.push import PushOutcome, push_entry
from billing_integration.outbox.retry import retry_failed
from billing_integration.outbox.tasks import sweep_outbox
from billing_integration.webhooks.ingest import store_delivery
from billing_integration.webhooks.processing import process_event, process_in_order
from billing_integration.webhooks.verification import Verification

from .conftest import subscribe

pytestmark = pytest.mark.django_db(transaction=True)


def make_product(name: str = "Pro plan", one_time: bool = False) -> Product:
    with transaction.atomic():
        product = Product.objects.create(
            name=name,
            description="All features",
            selected_currencies=[1, 2],
            product_type="one_time" if one_time else "subscription",
        )
        if one_time:
            Price.objects.create(product=product, currency_id=1, amount=Decimal("5000"))
        else:
            cycle = BillingCycle.objects.create(product=product, unit="months", frequency=1)
            Price.objects.create(cycle=cycle, currency_id=1, amount=Decimal("10000"))
            Price.objects.create(cycle=cycle, currency_id=2, amount=Decimal("19.99"))
    return product


def push_all() -> list[str]:
    ids = OutboxEntry.objects.open().values_list("pk", flat=True)
    return [push_entry(pk).status for pk in ids]


def test_create_product_sends_blueprint_with_the_entry_key(billing_sandbox, recorded_enqueues):
    product = make_product()
    entries = list(OutboxEntry.objects.all())
    assert len(entries) == 1, "one entry for the product, its cycle and prices"
    assert recorded_enqueues == [entries[0].pk]

    assert push_entry(entries[0].pk).status == PushOutcome.DONE

    calls = billing_sandbox.requests(operation="create_product")
    assert len(calls) == 1
    assert calls[0]["headers"]["x-idempotency-id"] == str(entries[0].idempotency_key)
    body = calls[0]["body"]
    assert body["selected_currencies"] == ["1", "2"]
    assert body["subscription_blueprint"] == {
        "billing_type": "flat-rate",
        "billing_cycles": [
            {
                "cycle": "months",
                "frequency": 1,
                "prices": [{"currency": 1, "amount": 10000}, {"currency": 2, "amount": 19.99}],
            }
        ],
    }
    product.refresh_from_db()
    remote = billing_sandbox.objects("product")
    assert [str(product.remote_id)] == [p["id"] for p in remote]
    assert product.sync_state == "synced"
    assert product.remote_data["id"] == str(product.remote_id)
    assert product.remote_created is not None


def make_customers(*names: str) -> list[Customer]:
    return [
        Customer.objects.create(
            identifier=name, first_name=name, last_name="X", email=f"{name}@example.com"
        )
        for name in names
    ]


def test_each_entry_of_a_transaction_is_enqueued_after_its_commit(recorded_enqueues):
    with transaction.atomic():
        make_customers("a", "b", "c")
        assert recorded_enqueues == []  # not before the commit
    entries = list(OutboxEntry.objects.order_by("pk").values_list("pk", flat=True))
    assert recorded_enqueues == entries and len(entries) == 3


def test_a_rolled_back_savepoint_enqueues_nothing_and_the_rest_is_enqueued(recorded_enqueues):
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            make_customers("gone")
            raise RuntimeError
        (kept,) = make_customers("kept")
    entry = OutboxEntry.objects.get()
    assert entry.object_id == kept.pk
    assert recorded_enqueues == [entry.pk]


def test_after_a_rolled_back_transaction_the_next_one_kicks(recorded_enqueues):
    with pytest.raises(RuntimeError), transaction.atomic():
        make_customers("gone")
        raise RuntimeError
    assert recorded_enqueues == []
    make_customers("kept")  # autocommit: enqueued at once
    assert recorded_enqueues == [OutboxEntry.objects.get().pk]


def test_one_time_product_sends_root_prices(billing_sandbox):
    make_product("Setup fee", one_time=True)
    push_all()
    body = billing_sandbox.requests(operation="create_product")[0]["body"]
    assert body["prices"] == [{"currency": 1, "amount": 5000}]
    assert "subscription_blueprint" not in body


def test_a_burst_of_edits_makes_one_patch_with_the_final_state(billing_sandbox):
    product = make_product()
    push_all()
    for i in range(10):
        product.name = f"Pro plan v{i}"
        product.save()
    product.publish()
    assert OutboxEntry.objects.open().count() == 1
    assert push_all() == [PushOutcome.DONE]
    patches = billing_sandbox.requests(operation="update_product")
    assert len(patches) == 1
    assert patches[0]["body"] == {"name": "Pro plan v9", "status": "published"}
    product.refresh_from_db()
    assert product.remote_id is not None, "a stale instance's save keeps the remote id"
    remote = billing_sandbox.object("product", str(product.remote_id))
    assert (remote["name"], remote["status"]) == ("Pro plan v9", "published")


def test_update_of_a_price_patches_the_blueprint_and_archive_patches_status(billing_sandbox):
    product = make_product()
    push_all()
    price = Price.objects.get(cycle__product=product, currency_id=1)
    price.amount = Decimal("12000")
    price.save()
    push_all()
    product.archive()
    push_all()
    patches = billing_sandbox.requests(operation="update_product")
    assert len(patches) == 2
    assert set(patches[0]["body"]) == {"subscription_blueprint"}
    assert patches[0]["body"]["subscription_blueprint"]["billing_cycles"][0]["prices"][0] == {
        "currency": 1,
        "amount": 12000,
    }
    assert patches[1]["body"] == {"status": "archived"}
    product.refresh_from_db()
    assert billing_sandbox.object("product", str(product.remote_id))["status"] == "archived"


def test_an_edit_while_the_create_is_in_flight_gets_its_own_entry_behind_it(billing_sandbox):
    product = make_product()
    first = OutboxEntry.objects.get()
    OutboxEntry.objects.filter(pk=first.pk).update(state="in_progress", attempts=1)  # claimed
    product.name = "Renamed"
    product.save()
    second = OutboxEntry.objects.exclude(pk=first.pk).get()
    assert push_entry(second.pk).status == PushOutcome.BUSY  # waits for the create
    assert billing_sandbox.requests(operation="create_product") == []
    OutboxEntry.objects.filter(pk=first.pk).update(state="pending", started_at=None)
    assert push_entry(first.pk).status == PushOutcome.DONE
    assert push_entry(second.pk).status == PushOutcome.DONE
    assert len(billing_sandbox.requests(operation="create_product")) == 1
    # The create carried the state at push time, so the update has nothing left to send.
    assert len(billing_sandbox.requests(operation="update_product")) <= 1
    product.refresh_from_db()
    assert billing_sandbox.object("product", str(product.remote_id))["name"] == "Renamed"


def test_a_rolled_back_change_leaves_no_entry_and_sends_nothing(billing_sandbox, recorded_enqueues):
    with pytest.raises(RuntimeError), transaction.atomic():
        make_product()
        raise RuntimeError("boom")
    assert OutboxEntry.objects.count() == 0
    assert Product.objects.count() == 0
    assert recorded_enqueues == []
    assert sweep_outbox() == 0
    assert billing_sandbox.requests(operation="create_product") == []


def test_a_retry_resends_the_same_key_and_body(billing_sandbox, settings, monkeypatch):
    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    make_product()
    entry = OutboxEntry.objects.get()
    billing_sandbox.faults(operation="create_product", status=503, count=1)
    assert push_entry(entry.pk).status == PushOutcome.RETRY
    entry.refresh_from_db()
    assert (entry.state, entry.attempts, entry.in_doubt) == ("pending", 1, True)
    assert "503" in entry.last_error
    assert entry.next_attempt_at is not None
    assert push_entry(entry.pk).status == PushOutcome.DONE
    calls = billing_sandbox.requests(operation="create_product")
    assert len(calls) == 2
    assert {c["headers"]["x-idempotency-id"] for c in calls} == {str(entry.idempotency_key)}
    assert calls[0]["body"] == calls[1]["body"]
    assert len(billing_sandbox.objects("product")) == 1


def test_a_reset_after_commit_creates_one_remote_object(billing_sandbox):
    product = make_product()
    billing_sandbox.faults(operation="create_product", reset_after_commit_rate=1.0, count=1)
    assert push_all() == [PushOutcome.DONE]
    calls = billing_sandbox.requests(operation="create_product")
    assert len(calls) == 2
    assert len({c["headers"]["x-idempotency-id"] for c in calls}) == 1
    remote = billing_sandbox.objects("product")
    assert len(remote) == 1
    product.refresh_from_db()
    assert str(product.remote_id) == remote[0]["id"]


def test_exhausted_retries_mark_the_entry_failed_and_retryable(
    billing_sandbox, settings, monkeypatch
):
    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    monkeypatch.setattr(push, "MAX_ATTEMPTS", 2)
    product = make_product()
    entry = OutboxEntry.objects.get()
    billing_sandbox.faults(operation="create_product", status=503, count=2)
    assert push_entry(entry.pk).status == PushOutcome.RETRY
    assert push_entry(entry.pk).status == PushOutcome.FAILED
    entry.refresh_from_db()
    product.refresh_from_db()
    assert entry.state == "failed" and entry.in_doubt
    assert product.sync_state == "failed" and "503" in product.sync_error
    key = entry.idempotency_key
    assert retry_failed() == 1
    entry.refresh_from_db()
    assert (entry.state, entry.idempotency_key) == ("pending", key)  # outcome unknown: same key
    assert push_entry(entry.pk).status == PushOutcome.DONE
    product.refresh_from_db()
    assert product.sync_state == "synced" and product.remote_id is not None


def test_retry_failed_resets_the_rows_and_enqueues_their_pushes_after_commit(monkeypatch):
    """The model layer only resets (``reset_failed`` returns the ids, enqueues nothing); the
    outbox's ``retry_failed`` resets and enqueues each push once the transaction commits."""
    enqueued: list[int] = []
    monkeypatch.setattr(tasks, "enqueue", lambda pk, countdown=None: enqueued.append(pk))
    make_product()
    make_product("Other")
    failed, other = OutboxEntry.objects.order_by("pk")
    OutboxEntry.objects.filter(pk=failed.pk).update(state="failed", attempts=3, in_doubt=False)
    key = failed.idempotency_key
    enqueued.clear()
    with transaction.atomic():
        assert OutboxEntry.objects.reset_failed() == [failed.pk]
    assert enqueued == []
    failed.refresh_from_db()
    assert (failed.state, failed.attempts) == ("pending", 0)
    assert failed.idempotency_key != key  # refused: a new body and key are safe
    OutboxEntry.objects.filter(pk=failed.pk).update(state="failed")
    with transaction.atomic():
        assert retry_failed(OutboxEntry.objects.filter(pk__in=[failed.pk, other.pk])) == 1
        assert enqueued == []  # not before the commit
    assert enqueued == [failed.pk]
    assert OutboxEntry.objects.get(pk=failed.pk).state == "pending"


def test_a_refused_request_fails_at_once(billing_sandbox):
    make_product()
    entry = OutboxEntry.objects.get()
    billing_sandbox.faults(operation="create_product", status=400, count=1)
    assert push_entry(entry.pk).status == PushOutcome.FAILED
    entry.refresh_from_db()
    assert entry.state == "failed" and not entry.in_doubt and entry.attempts == 1


def test_saves_from_the_remote_side_never_push(billing_sandbox):
    with from_remote():
        Product.objects.create(name="Pulled", remote_id=uuid.uuid4())
        Customer.objects.create(identifier="x", remote_id=uuid.uuid4())
    assert OutboxEntry.objects.count() == 0


def test_deleting_a_product_is_refused_and_points_to_archiving(billing_sandbox):
    product = make_product()
    with pytest.raises(ProductDeletionRefused, match="Archive"):
        product.delete()
    with pytest.raises(ProductDeletionRefused):
        Product.objects.filter(pk=product.pk).delete()
    assert Product.objects.filter(pk=product.pk).exists()


def test_two_pushers_never_push_the_same_entry_at_once(billing_sandbox):
    make_product()
    entry = OutboxEntry.objects.get()
    billing_sandbox.faults(operation="create_product", latency=0.5)
    results: list[str] = []

    def run() -> None:
        results.append(push_entry(entry.pk).status)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results).count(PushOutcome.DONE) == 1, results
    assert len(billing_sandbox.requests(operation="create_product")) == 1


# --- customers -----------------------------------------------------------------------------------
def test_customer_from_subscriber_and_synchronous_push_uses_the_entry_key(billing_sandbox):
    user = get_user_model().objects.create(
        username="ada", first_name="Ada", last_name="Lovelace", email="ada@example.com"
    )
    customer, created = get_or_create_customer(user)
    assert created and customer.identifier == f"auth.user:{user.pk}"
    assert (customer.first_name, customer.email) == ("Ada", "ada@example.com")
    assert get_or_create_customer(user) == (customer, False)
    entry = OutboxEntry.objects.get()

    ensure_customer_pushed(customer)
    assert customer.remote_id is not None
    # The queued task for the same entry then finds nothing to do.
    assert push_entry(entry.pk).status == "skipped"
    ensure_customer_pushed(customer)
    calls = billing_sandbox.requests(operation="create_customer")
    assert len(calls) == 1
    assert calls[0]["headers"]["x-idempotency-id"] == str(entry.idempotency_key)
    assert calls[0]["body"] == {
        "identifier": f"auth.user:{user.pk}",
        "first_name": "Ada",
        "last_name": "Lovelace",
        "email": "ada@example.com",
    }
    assert [c["id"] for c in billing_sandbox.objects("customer")] == [str(customer.remote_id)]


def test_customer_identifier_rule_is_overridable(billing_sandbox, settings):
    settings.BILLING = {
        **settings.BILLING,
        "CUSTOMER_FIELDS": "tests.mirror.test_outbox.email_identifier",
    }
    user = get_user_model().objects.create(username="bob", email="bob@example.com")
    customer, _ = get_or_create_customer(user)
    assert customer.identifier == "user-bob@example.com"
    assert customer.email == "bob@example.com"


def email_identifier(subscriber) -> dict:
    return {"identifier": f"user-{subscriber.email}", "email": subscriber.email}


# --- subscriptions -------------------------------------------------------------------------------
def test_subscription_created_through_the_api_pushes_its_dependencies_first(billing_sandbox):
    product = make_product()
    product.publish()
    user = get_user_model().objects.create(username="sub", email="s@example.com")
    customer, _ = get_or_create_customer(user)
    sub = Subscription.objects.create(
        product=product,
        customer=customer,
        selected_currency="XOF",
        selected_billing_cycle="months-1",
        auto_renew=True,
    )
    entry = OutboxEntry.objects.for_object(sub).get()
    assert push_entry(entry.pk).status == PushOutcome.DONE
    sub.refresh_from_db()
    customer.refresh_from_db()
    product.refresh_from_db()
    assert customer.remote_id and product.remote_id and sub.remote_id
    call = billing_sandbox.requests(operation="create_subscription")[0]
    assert call["headers"]["x-idempotency-id"] == str(entry.idempotency_key)
    assert call["body"] == {
        "customer": str(customer.remote_id),
        "product": str(product.remote_id),
        "selected_currency": "XOF",
        "selected_billing_cycle": "months-1",
        "auto_renew": True,
    }
    assert sub.status == "published"
    assert sub.product_remote_id == product.remote_id
    assert Subscription.objects.for_subscriber(user).active().get() == sub
    done = PushOutcome.DONE
    assert push_all() in ([], [done], [done, done])  # the dependencies' own entries: no-ops
    assert len(billing_sandbox.requests(operation="create_customer")) == 1
    assert len(billing_sandbox.requests(operation="create_product")) == 1


@pytest.mark.parametrize("left_out", [(), ("customer",), ("product",), ("customer", "product")])
def test_an_event_during_the_subscription_create_call_makes_no_second_row(
    billing_sandbox, monkeypatch, left_out
):
    """The service created the subscription and, before its answer reached us, the event of
    a change to it arrived and was processed: the event created a second local row, the
    answer then failed the remote-id uniqueness check, and the entry failed in doubt with two
    rows for one subscription. Now the event stores nothing and stays received, to be tried
    again (its task retries it as a transient failure, the sweep sends it again); the answer
    links the waiting row and settles the entry, and the event's next try applies it."""
    product = make_product()
    product.publish()
    sub = subscribe(product, "sub", "s@example.com")
    session = get_client().session
    real = session.request
    events: list = []

    def request(method, url, **kwargs):
        response = real(method, url, **kwargs)
        if method == "POST" and url.endswith("/subscriptions") and not events:
            remote_id = response.json()["data"][0]["id"]
            billing_sandbox.advance(seconds=60)
            payload = billing_sandbox.trigger("subscription.paused", remote_id)
            for name in left_out:  # the data may not name them
                payload["data"].pop(name)
            body = json.dumps(payload).encode()
            stored = store_delivery(body, {}, Verification("signature", payload["id"]))
            events.append(process_event(stored.event.pk))
        return response

    monkeypatch.setattr(session, "request", request)
    entry = OutboxEntry.objects.for_object(sub).get()
    assert push_entry(entry.pk).status == PushOutcome.DONE
    (event,) = events
    assert (event.state, event.outcome, event.retryable) == ("received", "deferred", True)
    (remote,) = billing_sandbox.objects("subscription")
    assert list(Subscription.objects.values_list("pk", "remote_id")) == [
        (sub.pk, uuid.UUID(remote["id"]))
    ]
    entry.refresh_from_db()
    assert (entry.state, entry.in_doubt) == ("done", False)
    again = process_in_order(event.pk)
    assert (again.state, again.outcome) == ("processed", "applied")
    sub.refresh_from_db()
    assert (sub.status, sub.sync_state) == ("paused", "synced")
    assert Subscription.objects.count() == 1


def test_an_event_naming_no_customer_does_not_wait_for_a_create_left_in_doubt(billing_sandbox):
    """A create in doubt may stay so until staff act: only an event naming its customer and
    product waits for it; one that names neither is applied (it may be of any subscription)."""
    product = make_product()
    product.publish()
    sub = subscribe(product, "sub", "s@example.com")
    OutboxEntry.objects.for_object(sub).update(state="failed", in_doubt=True)
    rid = uuid.uuid4()
    payload = {
        "id": str(uuid.uuid4()),
        "type": "subscription.paused",
        "data": {"id": str(rid), "status": "paused"},
    }
    stored = store_delivery(
        json.dumps(payload).encode(), {}, Verification("signature", payload["id"])
    )
    result = process_event(stored.event.pk)
    assert (result.state, result.outcome) == ("processed", "applied")
    assert Subscription.objects.get(remote_id=rid).status == "paused"


def test_drain_re_enqueues_entries_whose_message_was_lost(billing_sandbox, recorded_enqueues):
    make_product()
    entry = OutboxEntry.objects.get()
    recorded_enqueues.clear()
    assert sweep_outbox() == 0  # not stale yet
    from datetime import timedelta

    from django.utils import timezone

    OutboxEntry.objects.filter(pk=entry.pk).update(updated_at=timezone.now() - timedelta(hours=1))
    assert sweep_outbox() == 1
    assert recorded_enqueues == [entry.pk]
    assert sweep_outbox() == 0  # touched: not again before STALE_AFTER


REAL_ENQUEUE = tasks.enqueue


def test_a_broker_down_at_commit_loses_no_push_the_sweep_sends_it(billing_sandbox, monkeypatch):
    from datetime import timedelta

    from django.utils import timezone

    sent: list[int] = []
    down = [True]

    def apply_async(args, **options):
        if down:
            raise OSError("broker down")
        sent.append(args[0])

    monkeypatch.setattr(tasks, "enqueue", REAL_ENQUEUE)
    monkeypatch.setattr(tasks.push_outbox_entry, "apply_async", apply_async)
    make_product()  # committed; its enqueue fails (logged) and the save goes on
    entry = OutboxEntry.objects.get()
    assert entry.state == "pending" and sent == []
    down.clear()  # the broker is back; beat's sweep finds the entry
    OutboxEntry.objects.filter(pk=entry.pk).update(updated_at=timezone.now() - timedelta(hours=1))
    assert sweep_outbox() == 1
    assert sent == [entry.pk]
