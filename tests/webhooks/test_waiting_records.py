"""Records stored before the subscription, customer or product they name is known here are
linked when it arrives, by whichever path: a pull (the sandbox over real HTTP), its own event,
an outbox push."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import date, timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from billing_integration.models import (
    Customer,
    Invoice,
    OutboxEntry,
    Payment,
    Refund,
    ReportState,
    Subscription,
)
from billing_integration.outbox.push import PushOutcome, push_entry
from billing_integration.sync.pull import (
    pull_customers,
    pull_subscriptions,
    upsert_customers,
    upsert_subscriptions,
)
from billing_integration.webhooks.ingest import store_delivery
from billing_integration.webhooks.processing import process_event
from billing_integration.webhooks.verification import Verification

from .conftest import (
    T0,
    envelope,
    invoice_data,
    payment_data,
    refund_data,
    subscription_data,
)


def deliver(event_type: str, data: dict) -> None:
    payload = envelope(event_type, data)
    body = json.dumps(payload).encode()
    event = store_delivery(body, {}, Verification("signature", payload["id"])).event
    assert process_event(event.pk).state == "processed"


def pay(status: str, sub, customer, product, hours: int) -> uuid.UUID:
    rid = uuid.uuid4()
    data = payment_data(
        rid,
        status=status,
        subscription=sub,
        customer=customer,
        product=product,
        updated=T0 + timedelta(hours=hours),
    )
    deliver(f"payment.{status}", data)
    return rid


@pytest.mark.django_db(transaction=True)
def test_records_wait_for_a_pulled_subscription_and_customer(billing_sandbox):
    billing_sandbox.seed(customers=1, subscriptions=1)
    (remote,) = billing_sandbox.objects("subscription")
    ids = remote["id"], remote["customer"], remote["product"]
    # The lists fail meanwhile: the event is applied without them (the raw ids kept).
    billing_sandbox.faults(operation="list_customers", status=400)
    billing_sandbox.faults(operation="list_subscriptions", status=400)
    older = pay("failed", *ids, hours=1)
    newer = pay("completed", *ids, hours=2)
    invoice = uuid.uuid4()
    data = invoice_data(
        invoice, status="paid", subscription=ids[0], customer=ids[1], product=ids[2]
    )
    deliver("invoice.paid", data)
    assert not Payment.objects.filter(subscription__isnull=False).exists()
    assert not Payment.objects.filter(customer__isnull=False).exists()
    billing_sandbox.clear_faults()

    assert pull_subscriptions().created == 1  # its customer is still unknown
    sub = Subscription.objects.get(remote_id=ids[0])
    assert sub.customer_id is None and sub.last_payment_status == "completed"
    for model, rid in ((Payment, older), (Payment, newer), (Invoice, invoice)):
        assert model.objects.get(remote_id=rid).subscription_id == sub.pk

    assert pull_customers().created == 1
    customer = Customer.objects.get(remote_id=ids[1])
    sub.refresh_from_db()
    assert sub.customer_id == customer.pk
    assert set(Payment.objects.values_list("customer_id", flat=True)) == {customer.pk}
    assert Invoice.objects.get(remote_id=invoice).customer_id == customer.pk


@pytest.mark.django_db(transaction=True)
def test_payments_wait_for_a_subscription_that_arrives_by_its_own_event(billing_sandbox, mirror):
    """The sandbox does not know the subscription: the payment event's pull finds nothing."""
    rid = uuid.uuid4()
    ids = rid, mirror.customer.remote_id, mirror.product.remote_id
    older = pay("completed", *ids, hours=1)
    newer = pay("failed", *ids, hours=2)
    # A record linked already (here to another subscription) is not touched, nor counted.
    linked = pay("canceled", *ids, hours=3)
    Payment.objects.filter(remote_id=linked).update(subscription=mirror.subscription)
    assert Payment.objects.filter(subscription__isnull=True).count() == 2

    data = subscription_data(rid, customer=ids[1], product=ids[2], updated=T0)
    deliver("subscription.renewal", data)
    sub = Subscription.objects.get(remote_id=rid)
    assert sub.last_payment_status == "failed"  # the newest of its payments
    assert {p: Payment.objects.get(remote_id=p).subscription_id for p in (older, newer)} == {
        older: sub.pk,
        newer: sub.pk,
    }
    assert Payment.objects.get(remote_id=linked).subscription_id == mirror.subscription.pk
    mirror.subscription.refresh_from_db()
    assert mirror.subscription.last_payment_status is None


@pytest.mark.django_db(transaction=True)
def test_a_customer_found_by_its_push_takes_the_records_waiting_for_it(billing_sandbox):
    billing_sandbox.seed(customers=1)
    (remote,) = billing_sandbox.objects("customer")
    Payment.objects.create(remote_id=uuid.uuid4(), customer_remote_id=remote["id"])
    customer = Customer.objects.create(identifier=remote["identifier"], first_name="A")
    entry = OutboxEntry.objects.get()
    OutboxEntry.objects.filter(pk=entry.pk).update(in_doubt=True)  # an earlier try created it
    assert push_entry(entry.pk).status == PushOutcome.DONE
    customer.refresh_from_db()
    assert str(customer.remote_id) == remote["id"]
    assert Payment.objects.get().customer_id == customer.pk


def _statements(arrive, waiting: int, on_commit) -> int:
    rid = uuid.uuid4()
    Payment.objects.bulk_create(
        Payment(
            remote_id=uuid.uuid4(),
            status="failed" if i else "completed",  # the first is the newest
            subscription_remote_id=rid,
            remote_updated=T0 - timedelta(hours=i),
        )
        for i in range(waiting)
    )
    # the linking runs after the commit (records.link_waiting): counted
    with CaptureQueriesContext(connection) as queries, on_commit(execute=True):
        arrive(rid)
    sub = Subscription.objects.get(remote_id=rid)
    assert Payment.objects.filter(subscription_remote_id=rid, subscription=sub).count() == waiting
    assert sub.last_payment_status == "completed"
    return len([q for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]])


@pytest.mark.django_db
def test_the_statements_do_not_grow_with_the_records_waiting(
    mirror, django_capture_on_commit_callbacks
):
    refs = {"customer": mirror.customer.remote_id, "product": mirror.product.remote_id}

    def by_event(rid: uuid.UUID) -> None:
        deliver("subscription.renewal", subscription_data(rid, **refs))

    def by_pull(rid: uuid.UUID) -> None:
        assert upsert_subscriptions([subscription_data(rid, **refs)]).created == 1

    for arrive in (by_event, by_pull):
        on_commit = django_capture_on_commit_callbacks
        _statements(arrive, 1, on_commit)  # warm-up
        assert _statements(arrive, 1, on_commit) == _statements(arrive, 20, on_commit)


def refund_first(mirror, refunds: int) -> tuple[uuid.UUID, list[uuid.UUID]]:
    """``refunds`` refund events naming a payment not known here; returns its id and theirs."""
    payment = uuid.uuid4()
    ids = [uuid.uuid4() for _ in range(refunds)]
    common = {"subscription": mirror.subscription.remote_id, "customer": mirror.customer.remote_id}
    for rid in ids:
        deliver("refund.initiated", refund_data(rid, status="initiated", payment=payment, **common))
    assert not Refund.objects.filter(remote_id__in=ids, payment__isnull=False).exists()
    return payment, ids


def pay_for(mirror, payment: uuid.UUID) -> None:
    refs = mirror.subscription.remote_id, mirror.customer.remote_id, mirror.product.remote_id
    deliver(
        "payment.completed",
        payment_data(
            payment,
            status="completed",
            **dict(zip(("subscription", "customer", "product"), refs, strict=True)),
        ),
    )


@pytest.mark.django_db
def test_a_refund_waits_for_the_payment_it_refunds(mirror, django_capture_on_commit_callbacks):
    """A refund.* event comes before the payment.* event of the payment it refunds: the refund
    is linked to the payment when that arrives, in statements that do not grow with the
    refunds waiting."""
    payment, refunds = refund_first(mirror, 1)
    with django_capture_on_commit_callbacks(execute=True):  # the linking, after the commit
        pay_for(mirror, payment)
    stored = Payment.objects.get(remote_id=payment)
    assert Refund.objects.get(remote_id=refunds[0]).payment_id == stored.pk
    assert list(stored.refunds.values_list("remote_id", flat=True)) == refunds

    def statements(refunds: int) -> int:
        payment, ids = refund_first(mirror, refunds)
        with (
            CaptureQueriesContext(connection) as queries,
            django_capture_on_commit_callbacks(execute=True),
        ):
            pay_for(mirror, payment)
        linked = Refund.objects.filter(remote_id__in=ids, payment__remote_id=payment)
        assert linked.count() == refunds
        return len([q for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]])

    assert statements(1) == statements(20)


def _stored(event_type: str, data: dict) -> int:
    payload = envelope(event_type, data)
    return store_delivery(json.dumps(payload).encode(), {}, Verification("signature")).pk


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("last", ["payment", "refund"])
def test_a_refund_and_its_payment_stored_at_once_are_linked(mirror, last):
    """Two workers: one stores a payment, the other a refund of it. Whichever commits last,
    neither saw the other's row before its commit (READ COMMITTED): the refund is linked all
    the same, by the linking each runs after its commit."""
    ReportState.objects.filter(name=ReportState.DIRTY).update(month=date(2000, 1, 1))
    payment = uuid.uuid4()
    refs = {"subscription": mirror.subscription.remote_id, "customer": mirror.customer.remote_id}
    data = payment_data(payment, status="completed", product=mirror.product.remote_id, **refs)
    events = {
        "payment": _stored("payment.completed", data),
        "refund": _stored(
            "refund.initiated",
            refund_data(uuid.uuid4(), status="initiated", payment=payment, **refs),
        ),
    }
    first = "refund" if last == "payment" else "payment"
    seen: dict[str, object] = {}

    def other_worker() -> None:  # commits while the one below is not committed yet
        try:
            seen["state"] = process_event(events[first]).state
            seen["payment"] = Payment.objects.filter(remote_id=payment).exists()
            seen["refunds"] = list(Refund.objects.values_list("payment_remote_id", "payment_id"))
        finally:
            connection.close()

    with transaction.atomic():  # the last one's work: not committed while the other runs
        assert process_event(events[last]).state == "processed"
        if last == "refund":
            assert Refund.objects.get().payment_id is None
        worker = threading.Thread(target=other_worker)
        worker.start()
        worker.join(timeout=30)
        assert not worker.is_alive(), "the other worker waited on this transaction"
    assert seen["state"] == "processed"
    if last == "payment":  # the refund's lookup ran while the payment was not committed
        assert seen["payment"] is False and seen["refunds"] == [(payment, None)]
    else:  # the payment was committed while the refund (stored unlinked) was not: none seen
        assert seen["payment"] is True and seen["refunds"] == []
    refund = Refund.objects.get()
    assert refund.payment_id == Payment.objects.get(remote_id=payment).pk


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("last", ["customer", "subscription"])
def test_a_subscription_and_its_customer_pulled_at_once_are_linked(mirror, last):
    """Two pulls: one writes a customer, the other a subscription of it. Whichever commits
    last, the subscription is linked to the customer."""
    ReportState.objects.filter(name=ReportState.DIRTY).update(month=date(2000, 1, 1))
    customer = uuid.uuid4()
    rid = uuid.uuid4()
    resource = {"id": str(customer), "identifier": "c-race", "first_name": "Ada"}
    writes = {
        "customer": lambda: upsert_customers([resource]),
        "subscription": lambda: upsert_subscriptions(
            [subscription_data(rid, customer=customer, product=mirror.product.remote_id)]
        ),
    }
    first = "subscription" if last == "customer" else "customer"
    seen: dict[str, object] = {}

    def other_pull() -> None:  # commits while the one below is not committed yet
        try:
            seen["created"] = writes[first]().created
            seen["customer"] = Customer.objects.filter(remote_id=customer).exists()
            seen["subscriptions"] = list(
                Subscription.objects.filter(remote_id=rid).values_list("customer_id", flat=True)
            )
        finally:
            connection.close()

    with transaction.atomic():  # the last one's write: not committed while the other runs
        assert writes[last]().created == 1
        worker = threading.Thread(target=other_pull)
        worker.start()
        worker.join(timeout=30)
        assert not worker.is_alive(), "the other pull waited on this transaction"
    assert seen["created"] == 1
    if last == "customer":  # the subscription's lookup ran while the customer was uncommitted
        assert seen["customer"] is False and seen["subscriptions"] == [None]
    else:  # the customer was committed while the subscription was not: none seen
        assert seen["customer"] is True and seen["subscriptions"] == []
    assert Subscription.objects.get(remote_id=rid).customer.remote_id == customer


@pytest.mark.django_db(transaction=True)
def test_a_link_not_made_after_its_commit_is_made_by_the_periodic_pull(
    billing_sandbox, mirror, monkeypatch
):
    """A link ``link_waiting`` could not make after its commit (the connection lost, say)
    leaves records naming objects stored here unlinked; the periodic pull links them."""
    from billing_integration.models import records
    from billing_integration.sync.tasks import sync_all

    def lost(model, ids) -> None:
        raise DatabaseError("connection lost")

    rid = uuid.uuid4()
    paid = pay("completed", rid, mirror.customer.remote_id, mirror.product.remote_id, hours=1)
    monkeypatch.setattr(records, "_link_waiting", lost)
    data = subscription_data(
        rid, customer=mirror.customer.remote_id, product=mirror.product.remote_id, updated=T0
    )
    payload = envelope("subscription.renewal", data)
    body = json.dumps(payload).encode()
    event = store_delivery(body, {}, Verification("signature", payload["id"])).event
    assert process_event(event.pk).state == "failed"  # after its commit: the row is stored
    sub = Subscription.objects.get(remote_id=rid)
    assert Payment.objects.get(remote_id=paid).subscription_id is None
    monkeypatch.undo()
    process_event(event.pk)  # retried: the subscription is stored already, nothing arrives
    assert Payment.objects.get(remote_id=paid).subscription_id is None

    sync_all()
    assert Payment.objects.get(remote_id=paid).subscription_id == sub.pk
    sub.refresh_from_db()
    assert sub.last_payment_status == "completed"
