"""Pushes at once (Celery's worker threads or processes): the pushes of one object stay in
order, each entry once, with one idempotency key per entry."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from benchmarks.bench_scale import make_burst, order_problems
from billing_integration.models import OutboxEntry
from billing_integration.outbox.push import push_entry
from billing_integration.outbox.tasks import enqueue_open

from .conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.postgresql
def test_pushers_at_once_keep_each_objects_pushes_in_order_with_no_duplicate(billing_sandbox):
    billing_sandbox.faults(operation="*", latency=0.02)  # calls overlap between the pushers
    products = make_burst(12, 4, tag="par")
    pushed: list[int] = []
    start = threading.Barrier(3, timeout=30)

    def pusher() -> None:
        try:
            start.wait()
            n = 0
            while OutboxEntry.objects.open().exists():
                for pk in OutboxEntry.objects.open().heads().values_list("pk", flat=True):
                    n += push_entry(pk).status == "done"
            pushed.append(n)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=pusher) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert len(pushed) == 3 and all(n > 0 for n in pushed), pushed  # the race happened
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


@pytest.mark.worker
@pytest.mark.slow
def test_a_worker_with_two_processes_pushes_a_burst_in_order_once(
    celery_worker_process, billing_sandbox
):
    billing_sandbox.faults(operation="*", latency=0.05)
    celery_worker_process(concurrency=2)
    products = make_burst(30, 2, tag="spread")  # 60 entries, written without an enqueue
    enqueue_open()  # the heads; each push enqueues the next entry of its object
    wait_for(lambda: not OutboxEntry.objects.exclude(state="done").exists(), timeout=120)
    assert len(billing_sandbox.objects("product")) == 30
    assert order_problems(products, billing_sandbox.requests(), 2) == []
