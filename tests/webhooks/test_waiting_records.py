"""Records stored before the subscription, customer or product they name is known here are
linked when it arrives, by whichever path: a pull (the sandbox over real HTTP), its own event,
an outbox push."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing_integration.models import (
    Customer,
    Invoice,
    OutboxEntry,
    Payment,
    Refund,
    Subscription,
)
from billing_integration.outbox.push import PushOutcome, push_entry
from billing_integration.sync.pull import pull_customers, pull_subscriptions, upsert_subscriptions
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


def _statements(arrive, waiting: int) -> int:
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
    with CaptureQueriesContext(connection) as queries:
        arrive(rid)
    sub = Subscription.objects.get(remote_id=rid)
    assert Payment.objects.filter(subscription_remote_id=rid, subscription=sub).count() == waiting
    assert sub.last_payment_status == "completed"
    return len([q for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]])


@pytest.mark.django_db
def test_the_statements_do_not_grow_with_the_records_waiting(mirror):
    refs = {"customer": mirror.customer.remote_id, "product": mirror.product.remote_id}

    def by_event(rid: uuid.UUID) -> None:
        deliver("subscription.renewal", subscription_data(rid, **refs))

    def by_pull(rid: uuid.UUID) -> None:
        assert upsert_subscriptions([subscription_data(rid, **refs)]).created == 1

    for arrive in (by_event, by_pull):
        _statements(arrive, 1)  # warm-up
        assert _statements(arrive, 1) == _statements(arrive, 20)


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
def test_a_refund_waits_for_the_payment_it_refunds(mirror):
    """A refund.* event comes before the payment.* event of the payment it refunds: the refund
    is linked to the payment when that arrives, in statements that do not grow with the
    refunds waiting."""
    payment, refunds = refund_first(mirror, 1)
    pay_for(mirror, payment)
    stored = Payment.objects.get(remote_id=payment)
    assert Refund.objects.get(remote_id=refunds[0]).payment_id == stored.pk
    assert list(stored.refunds.values_list("remote_id", flat=True)) == refunds

    def statements(refunds: int) -> int:
        payment, ids = refund_first(mirror, refunds)
        with CaptureQueriesContext(connection) as queries:
            pay_for(mirror, payment)
        linked = Refund.objects.filter(remote_id__in=ids, payment__remote_id=payment)
        assert linked.count() == refunds
        return len([q for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]])

    assert statements(1) == statements(20)
