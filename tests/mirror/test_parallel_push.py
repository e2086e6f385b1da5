"""Pushes in parallel: calls in flight together within a run (``OUTBOX_PUSH_CONCURRENCY``),
runs together over the workers (``OUTBOX_PUSH_RUNS``), and the pushes of one object still in
order, once each, with one idempotency key per entry."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from typing import Any

import pytest
from django.db import connections, transaction

from benchmarks.bench_scale import make_burst, order_problems
from billing_integration import wakeup
from billing_integration.client import get_client
from billing_integration.models import Customer, OutboxEntry
from billing_integration.outbox.drain import push_due
from billing_integration.outbox.parallel import call_all
from billing_integration.outbox.push import PushOutcome, push_entries
from billing_integration.outbox.tasks import OUTBOX, push_run
from billing_integration.wakeup import DrainRun

from .conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


# --- call_all: the bound ----------------------------------------------------------------------
def test_call_all_has_width_calls_in_flight_together_and_never_more():
    in_flight = 0
    peak = 0
    lock = threading.Lock()
    # The first three calls wait for each other: with fewer than three in flight at once the
    # barrier breaks (its timeout) and those calls end in error.
    barrier = threading.Barrier(3, timeout=10)

    def call(i: int) -> int:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        try:
            if i < 3:
                barrier.wait()
            return i * 10
        finally:
            with lock:
                in_flight -= 1

    outcomes = call_all(list(range(12)), call, width=3, stop_at=time.monotonic() + 60)
    assert [o.error for o in outcomes] == [None] * 12
    assert [o.value for o in outcomes] == [i * 10 for i in range(12)]
    assert peak == 3


def test_call_all_keeps_errors_and_starts_nothing_after_the_stop_time():
    def call(i: int) -> int:
        if i == 1:
            raise ValueError("boom")
        return i

    outcomes = call_all([0, 1, 2], call, width=2, stop_at=time.monotonic() + 60)
    assert [o.started for o in outcomes] == [True] * 3
    assert isinstance(outcomes[1].error, ValueError) and outcomes[2].value == 2
    late = call_all([0, 1, 2], call, width=2, stop_at=time.monotonic() - 1)
    assert [o.started for o in late] == [False] * 3


# --- one run: calls in flight together ------------------------------------------------------
class MeetingClient:
    """The real client; its customer creates wait until ``parties`` of them are in flight at
    once (a barrier: with fewer the barrier breaks and the calls fail)."""

    def __init__(self, parties: int) -> None:
        self.real = get_client()
        self.barrier = threading.Barrier(parties, timeout=10)
        self.threads: set[str] = set()

    def create_customer(self, body: dict[str, Any], *, idempotency_key: str) -> dict[str, Any]:
        self.threads.add(threading.current_thread().name)
        self.barrier.wait()
        return self.real.create_customer(body, idempotency_key=idempotency_key)


def new_customers(n: int, tag: str = "p") -> list[Customer]:
    with transaction.atomic():
        return [
            Customer.objects.create(
                identifier=f"{tag}-{i}", first_name="P", last_name=str(i), email=f"{tag}{i}@x.io"
            )
            for i in range(n)
        ]


def test_a_run_has_its_concurrency_of_calls_in_flight_and_pushes_each_once(
    billing_sandbox, settings
):
    settings.BILLING = {**settings.BILLING, "OUTBOX_PUSH_CONCURRENCY": 4}
    new_customers(8)
    ids = list(OutboxEntry.objects.order_by("pk").values_list("pk", flat=True))
    client = MeetingClient(parties=4)
    results = push_entries(ids, client=client)
    assert [r.status for r in results] == [PushOutcome.DONE] * 8
    assert len(client.threads) == 4  # four threads met at the barrier, twice
    keys = Counter(
        r["headers"]["x-idempotency-id"]
        for r in billing_sandbox.requests(operation="create_customer")
    )
    assert set(keys.values()) == {1}
    assert set(keys) == {
        str(k) for k in OutboxEntry.objects.values_list("idempotency_key", flat=True)
    }
    assert len(billing_sandbox.objects("customer")) == 8
    assert not Customer.objects.filter(remote_id__isnull=True).exists()


def test_with_concurrency_one_the_calls_do_not_overlap(billing_sandbox, settings):
    settings.BILLING = {**settings.BILLING, "OUTBOX_PUSH_CONCURRENCY": 1}
    new_customers(2)
    ids = list(OutboxEntry.objects.order_by("pk").values_list("pk", flat=True))
    client = MeetingClient(parties=2)
    client.barrier = threading.Barrier(2, timeout=0.5)
    # One call at a time: the first waits alone at the barrier, which breaks; an unexpected
    # error is raised once the others are recorded, and its entry stays held (its lease).
    with pytest.raises(threading.BrokenBarrierError):
        push_entries(ids, client=client)
    assert client.threads == {threading.current_thread().name}
    assert billing_sandbox.requests(operation="create_customer") == []


# --- several runs: order per object ---------------------------------------------------------
@pytest.mark.postgresql
def test_runs_at_once_keep_each_objects_pushes_in_order_with_no_duplicate(
    billing_sandbox, settings
):
    settings.BILLING = {
        **settings.BILLING,
        "OUTBOX_PUSH_CONCURRENCY": 3,
        "OUTBOX_CLAIM_BATCH": 4,
    }
    billing_sandbox.faults(operation="*", latency=0.02)  # calls overlap between the runs
    products = make_burst(12, 4, tag="par")
    handled: list[int] = []
    start = threading.Barrier(3, timeout=30)

    def one_run() -> None:
        try:
            start.wait()
            handled.append(push_due(DrainRun(120)).handled)
        finally:
            connections.close_all()

    runs = [threading.Thread(target=one_run) for _ in range(3)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(timeout=180)
    assert len(handled) == 3
    # The race happened: every run pushed part of the burst.
    assert all(n > 0 for n in handled), handled
    assert set(OutboxEntry.objects.values_list("state", flat=True)) == {"done"}
    assert len(billing_sandbox.objects("product")) == 12  # 0 duplicates
    assert order_problems(products, billing_sandbox.requests(), 4) == []


def test_the_order_check_sees_a_duplicate_and_a_patch_out_of_order():
    """``order_problems`` (used above and by benchmarks/bench_scale.py) can fail."""
    products = make_burst(2, 3, tag="chk")
    for n, product in enumerate(products):
        type(product).objects.filter(pk=product.pk).update(
            remote_id=f"00000000-0000-0000-0000-00000000000{n}"
        )
    a, b = (f"/v1/api/billing/products/00000000-0000-0000-0000-00000000000{n}" for n in (0, 1))

    def request(n: int, operation: str, name: str, path: str = "/v1/api/billing/products"):
        return {
            "id": n,
            "operation": operation,
            "path": path,
            "body": {"name": name},
            "headers": {"x-idempotency-id": f"k{n}"},
        }

    good = [
        request(1, "create_product", "chk-0"),
        request(2, "create_product", "chk-1"),
        request(3, "update_product", "chk-1 v1", b),
        request(4, "update_product", "chk-0 v1", a),
        request(5, "update_product", "chk-0 v2", a),
        request(6, "update_product", "chk-1 v2", b),
    ]
    assert order_problems(products, good, 3) == []
    swapped = [*good[:3], good[4] | {"id": 4}, good[3] | {"id": 5}, good[5]]
    assert order_problems(products, swapped, 3) == [
        ("chk-0", "PATCHes ['chk-0 v2', 'chk-0 v1'] != ['chk-0 v1', 'chk-0 v2']")
    ]
    twice = [*good, request(7, "create_product", "chk-1")]
    assert order_problems(products, twice, 3) == [("chk-1", "2 creates")]
    replay = [*good, good[1] | {"id": 7}]  # the same key again: a retry, counted once
    assert order_problems(products, replay, 3) == []


# --- over the workers: a burst spreads --------------------------------------------------------
@pytest.mark.worker
@pytest.mark.slow
def test_a_burst_spreads_over_two_worker_processes(celery_worker_process, billing_sandbox):
    billing_sandbox.faults(operation="*", latency=0.05)
    worker = celery_worker_process(
        concurrency=2,
        extra={"OUTBOX_CLAIM_BATCH": 5, "OUTBOX_PUSH_RUNS": 2, "OUTBOX_PUSH_CONCURRENCY": 2},
    )
    products = make_burst(30, 2, tag="spread")  # 60 entries, written without a kick
    for slot in (0, 1):
        wakeup.clear(push_run(slot).name)
    OUTBOX.kick()  # one message: the run of slot 0
    wait_for(lambda: not OutboxEntry.objects.exclude(state="done").exists(), timeout=120)
    by_slot: Counter[int] = Counter()
    for slot, n in re.findall(r"push run (\d+): (\d+) entries handled", worker.output()):
        by_slot[int(slot)] += int(n)
    # Run 0 found a full batch and woke run 1, on the other process, which pushed part of it.
    assert by_slot[0] > 0 and by_slot[1] > 0, worker.output()[-3000:]
    assert len(billing_sandbox.objects("product")) == 30
    assert order_problems(products, billing_sandbox.requests(), 2) == []
