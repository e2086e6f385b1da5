"""Shuffled deliveries with duplicates: each event applied once, final state = in order.

CI size: 1,000 deliveries (30% duplicates). ``BILLING_ORDERING_DELIVERIES=10000`` for the
full run.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection

from billing_integration.models import (
    EventState,
    Invoice,
    Payment,
    Refund,
    Subscription,
    WebhookEvent,
)
from billing_integration.webhooks.ingest import store_delivery
from billing_integration.webhooks.processing import process_event
from billing_integration.webhooks.verification import Verification

from .conftest import (
    T0,
    envelope,
    invoice_data,
    payment_data,
    post_signed,
    refund_data,
    subscription_data,
    ts,
)

DELIVERIES = int(os.environ.get("BILLING_ORDERING_DELIVERIES", "1000"))
DUPLICATES = 0.3


def make_world(n_subs: int = 10):
    from billing_integration.models import Customer, Product
    from billing_integration.outbox import from_remote

    with from_remote():
        product = Product.objects.create(remote_id=uuid.uuid4(), name="P", sync_state="synced")
        subs = []
        for i in range(n_subs):
            customer = Customer.objects.create(
                remote_id=uuid.uuid4(), identifier=f"c{i}", sync_state="synced"
            )
            subs.append(
                Subscription.objects.create(
                    remote_id=uuid.uuid4(),
                    customer=customer,
                    product=product,
                    customer_remote_id=customer.remote_id,
                    product_remote_id=product.remote_id,
                    status="published",
                    remote_updated=T0 - timedelta(days=1),
                    sync_state="synced",
                )
            )
    return product, subs


def make_events(unique: int, product, subs, rng: random.Random) -> list[dict]:
    """``unique`` events on a small pool of objects, with strictly increasing times."""
    payments = [(uuid.uuid4(), rng.choice(subs)) for _ in range(max(3, unique // 40))]
    refunds = [(uuid.uuid4(), rng.choice(payments)) for _ in range(max(2, unique // 80))]
    invoices = [(uuid.uuid4(), rng.choice(subs)) for _ in range(max(2, unique // 60))]
    events = []
    for i in range(unique):
        at = T0 + timedelta(seconds=10 * (i + 1))
        kind = rng.choice(["subscription", "payment", "refund", "invoice"])
        if kind == "subscription":
            sub = rng.choice(subs)
            action = rng.choice(["renewal", "canceled", "paused"])
            data = subscription_data(
                sub.remote_id,
                customer=sub.customer_remote_id,
                product=product.remote_id,
                status={"renewal": "published"}.get(action, action),
                updated=at,
                start=T0 + timedelta(days=i),
            )
            events.append(envelope(f"subscription.{action}", data, created_at=at))
        elif kind == "payment":
            pay, sub = rng.choice(payments)
            status = rng.choice(["completed", "failed", "canceled"])
            data = payment_data(
                pay,
                status=status,
                subscription=sub.remote_id,
                customer=sub.customer_remote_id,
                product=product.remote_id,
                updated=at,
                amount=rng.randint(1, 9999),
            )
            events.append(envelope(f"payment.{status}", data, created_at=at))
        elif kind == "refund":
            ref, (pay, sub) = rng.choice(refunds)
            status = rng.choice(["initiated", "approved", "rejected"])
            data = refund_data(
                ref,
                status=status,
                payment=pay,
                subscription=sub.remote_id,
                customer=sub.customer_remote_id,
                updated=at,
            )
            events.append(envelope(f"refund.{status}", data, created_at=at))
        else:
            inv, sub = rng.choice(invoices)
            action, status = rng.choice(
                [
                    ("paid", "paid"),
                    ("voided", "void"),
                    ("marked_uncollectable", "uncollectable"),
                    ("deleted", "deleted"),
                ]
            )
            data = invoice_data(
                inv,
                status=status,
                subscription=sub.remote_id,
                customer=sub.customer_remote_id,
                product=product.remote_id,
                updated=at,
            )
            events.append(envelope(f"invoice.{action}", data, created_at=at))
    return events


def expected_state(events: list[dict]) -> dict:
    """Apply the events in order, in plain Python: the last event per object wins."""
    state: dict = {
        "subscription": {},
        "payment": {},
        "refund": {},
        "invoice": {},
        "last_payment": {},
    }
    for env in sorted(events, key=lambda e: e["created_at"]):
        group = env["type"].split(".")[0]
        data = env["data"]
        if group == "subscription":
            state["subscription"][data["id"]] = (data["status"], data["cycle_start_date"])
        else:
            state[group][data["id"]] = (data["status"], data.get("amount"))
        if group == "payment":
            state["last_payment"][data["subscription"]] = data["status"]
    return state


def actual_state() -> dict:
    return {
        "subscription": {
            str(s.remote_id): (s.status, ts(s.cycle_start_date))
            for s in Subscription.objects.exclude(remote_data=None)
        },
        "payment": {str(p.remote_id): (p.status, int(p.amount)) for p in Payment.objects.all()},
        "refund": {str(r.remote_id): (r.status, int(r.amount)) for r in Refund.objects.all()},
        "invoice": {str(i.remote_id): (i.status, int(i.amount)) for i in Invoice.objects.all()},
        "last_payment": {
            str(s.remote_id): s.last_payment_status
            for s in Subscription.objects.exclude(last_payment_status=None)
        },
    }


def deliveries(events: list[dict], rng: random.Random) -> list[dict]:
    """The events plus 30% duplicates (of the total), shuffled."""
    n_dup = int(len(events) * DUPLICATES / (1 - DUPLICATES))
    out = events + [rng.choice(events) for _ in range(n_dup)]
    rng.shuffle(out)
    return out


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_shuffled_duplicated_deliveries_over_http(client, settings, eager):
    from .conftest import SECRET

    settings.BILLING = {
        **settings.BILLING,
        "WEBHOOK_SECRET": SECRET,
    }
    rng = random.Random(1234)
    product, subs = make_world()
    unique = int(DELIVERIES * (1 - DUPLICATES))
    events = make_events(unique, product, subs, rng)
    sent = deliveries(events, rng)
    assert len(sent) >= DELIVERIES - 2
    statuses = {post_signed(client, env).status_code for env in sent}
    assert statuses == {200}

    assert WebhookEvent.objects.count() == len(events)
    assert set(WebhookEvent.objects.values_list("state", flat=True)) == {EventState.PROCESSED}
    assert set(WebhookEvent.objects.values_list("attempts", flat=True)) == {1}  # applied once
    assert actual_state() == expected_state(events)


@pytest.mark.slow
@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_concurrent_processing_serialises_per_object():
    """8 threads process the shuffled log at once (PostgreSQL row locks): no deadlock, no
    failure, each event applied once, the final state equals the in-order one."""
    rng = random.Random(99)
    product, subs = make_world(n_subs=3)  # few objects: much contention
    events = make_events(600, product, subs, rng)
    pks = []
    for env in deliveries(events, rng):
        result = store_delivery(json.dumps(env).encode(), {}, Verification("signature"))
        pks.append(result.event.pk)

    def work(pk: int):
        try:
            return process_event(pk).state
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=8) as pool:
        states = list(pool.map(work, pks))
    assert set(states) == {EventState.PROCESSED}, {s: states.count(s) for s in set(states)}
    assert set(WebhookEvent.objects.values_list("attempts", flat=True)) == {1}
    assert actual_state() == expected_state(events)
