"""Pushes in parallel through Celery's own concurrency: a burst of outbox entries pushed by one
worker with a concurrency of 1, 2, 4 and 8 (``-c``), against the sandbox's latency.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench \\
        .venv/bin/python benchmarks/bench_scale.py [--objects 500] [--per-object 4] [--rounds 3] \\
        [--pool prefork|threads]

``--pool``: the worker's pool, Celery's default ``prefork`` (that many worker processes) unless
``threads`` (that many threads in one process, which share its interpreter lock).

The sandbox runs as a process of its own and adds ``--latency`` seconds (default 0.05) to every
call. A burst is ``objects`` products with ``per-object`` entries each (a create, then PATCHes
of the name), interleaved at random in primary-key order, written without an enqueue; then
``enqueue_open()`` sends the push of each object's first entry (each push enqueues the next
entry of its object) and the time until every entry is done is measured. After every run:
every entry done, one remote product per local one (0 duplicates), and per product its create
then its PATCHes in the order of its entries (``order_problems``).

The figure of each configuration is the median over rounds of its speed-up over the 1-thread
run of the same round (``benchmarks/_paired.py``). Target: 8 calls in flight >= 6x one.
PostgreSQL is needed (SQLite serialises the claims).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paired import MeasurementFailed, require
from _stack import Stack, wait

TARGET = 6.0
CONFIGS = (1, 2, 4, 8)


def make_burst(objects: int, per_object: int, *, seed: int = 7, tag: str = "S") -> list[Any]:
    """``objects`` products (no entry written for them) and ``per_object`` outbox entries each:
    the create (body built at claim) then PATCHes of the name ``<name> v1``, ``v2``... (bodies
    stored), interleaved at random in primary-key order but in order per product. Returns the
    products."""
    from django.contrib.contenttypes.models import ContentType
    from django.db import transaction

    from billing_integration.context import from_remote
    from billing_integration.models import BillingCycle, OutboxEntry, Price, Product

    rng = random.Random(seed)
    with transaction.atomic(), from_remote():
        products = Product.objects.bulk_create(
            [Product(name=f"{tag}-{i}", selected_currencies=[1]) for i in range(objects)]
        )
        cycles = BillingCycle.objects.bulk_create(
            [BillingCycle(product=p, unit="months", frequency=1) for p in products]
        )
        Price.objects.bulk_create(
            [Price(cycle=c, currency_id=1, amount=1000 + i) for i, c in enumerate(cycles)]
        )
        ct = ContentType.objects.get_for_model(Product)
        queue = [p for p in products for _ in range(per_object)]
        rng.shuffle(queue)
        step: dict[int, int] = defaultdict(int)
        entries = []
        for product in queue:
            k = step[product.pk]
            step[product.pk] += 1
            entries.append(
                OutboxEntry(content_type=ct, object_id=product.pk, operation="create")
                if k == 0
                else OutboxEntry(
                    content_type=ct,
                    object_id=product.pk,
                    operation="update",
                    payload={"name": f"{product.name} v{k}"},
                )
            )
        OutboxEntry.objects.bulk_create(entries)
    return products


def order_problems(products: list[Any], requests: list[dict[str, Any]], per_object: int) -> list:
    """What went wrong on the wire, per product (empty: nothing): a create count other than
    one, or PATCHes not received in the order of its entries (``v1``, ``v2``...). A call
    repeated with the same idempotency key (a retry) counts once."""
    from billing_integration.models import Product

    remote_of = dict(
        Product.objects.filter(pk__in=[p.pk for p in products]).values_list("pk", "remote_id")
    )
    by_name = {p.name: p for p in products}
    seen_keys: set[str] = set()
    creates: dict[int, int] = defaultdict(int)
    patches: dict[str, list[str]] = defaultdict(list)
    for request in sorted(requests, key=lambda r: r["id"]):
        key = request["headers"].get("x-idempotency-id", "")
        if key in seen_keys:
            continue
        seen_keys.add(key)
        body = request.get("body") or {}
        if request["operation"] == "create_product" and body.get("name") in by_name:
            creates[by_name[body["name"]].pk] += 1
        elif request["operation"] == "update_product":
            patches[request["path"].rstrip("/").rsplit("/", 1)[-1]].append(body.get("name"))
    problems = []
    for product in products:
        remote = str(remote_of.get(product.pk))
        wanted = [f"{product.name} v{k}" for k in range(1, per_object)]
        if creates[product.pk] != 1:
            problems.append((product.name, f"{creates[product.pk]} creates"))
        elif patches[remote] != wanted:
            problems.append((product.name, f"PATCHes {patches[remote]} != {wanted}"))
    return problems


def reset_burst() -> None:
    """Delete the products and entries of the previous run (no entry written, nothing kicked)."""
    from django.db import connection, transaction

    from billing_integration.context import from_remote
    from billing_integration.models import BillingCycle, OutboxEntry, Price, Product

    with transaction.atomic(), from_remote():
        OutboxEntry.objects.all().delete()
        Price.objects.all().delete()
        BillingCycle.objects.all().delete()
        with connection.cursor() as cursor:  # products refuse a delete through the ORM
            cursor.execute(f"DELETE FROM {Product._meta.db_table}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--objects", type=int, default=500)
    parser.add_argument("--per-object", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per burst")
    parser.add_argument(
        "--calls", type=int, nargs="+", default=list(CONFIGS), help="configurations (1 always)"
    )
    parser.add_argument("--pool", default="prefork", choices=("prefork", "threads"))
    args = parser.parse_args()
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench")
    stack = Stack("bench_scale", separate_sandbox=True).start()
    from django.db import connection

    require(connection.vendor == "postgresql", "PostgreSQL is needed (DATABASE_URL)")
    from billing_integration.models import OutboxEntry
    from billing_integration.outbox.tasks import enqueue_open

    entries = args.objects * args.per_object
    times: dict[int, list[float]] = defaultdict(list)
    try:
        sandbox = stack.sandbox

        def run(calls: int, round_no: int) -> float:
            stack.stop_workers()
            stack.workers.clear()
            reset_burst()
            sandbox.reset()
            stack.start_worker(concurrency=calls, pool=args.pool)
            sandbox.faults(operation="*", latency=args.latency)
            products = make_burst(args.objects, args.per_object, tag=f"r{round_no}c{calls}")
            started = time.perf_counter()
            enqueue_open()
            require(
                wait(
                    lambda: not OutboxEntry.objects.exclude(state="done").exists(),
                    timeout=args.timeout,
                    interval=0.05,
                ),
                f"{calls} calls: {entries} entries not done within {args.timeout:g} s",
            )
            elapsed = time.perf_counter() - started
            remote = sandbox.objects("product")
            require(
                len(remote) == args.objects,
                f"{calls} calls: {len(remote)} remote products for {args.objects} (duplicates?)",
            )
            problems = order_problems(products, sandbox.requests(), args.per_object)
            require(not problems, f"{calls} calls: order broken: {problems[:5]}")
            print(
                f"  round {round_no}: {calls} ({args.pool}): {entries} entries in {elapsed:.2f} s, "
                f"{entries / elapsed:.1f}/s; order per object kept, 0 duplicates",
                flush=True,
            )
            return elapsed

        configs = sorted({1, *args.calls})
        for round_no in range(1, args.rounds + 1):
            order = configs if round_no % 2 else list(reversed(configs))
            for calls in order:
                times[calls].append(run(calls, round_no))
    except MeasurementFailed as exc:
        print(f"no figure: {exc}")
        return 1
    finally:
        stack.stop()

    print(
        f"{args.rounds} rounds; {entries} entries over {args.objects} products; "
        f"sandbox latency {args.latency * 1000:.0f} ms per call; pool {args.pool}; server: the "
        "sandbox's threaded "
        "Werkzeug server in a process of its own"
    )
    ok = True
    for calls in configs:
        speedups = [one / t for one, t in zip(times[1], times[calls], strict=True)]
        median = statistics.median(speedups)
        line = (
            f"{calls} call(s): median {statistics.median(times[calls]):.2f} s, speed-up over one "
            f"(median of paired rounds) {median:.2f}x "
            f"[{', '.join(f'{s:.2f}' for s in speedups)}]"
        )
        if calls == 8:
            line += f"  target >= {TARGET:g}x: {'met' if median >= TARGET else 'MISSED'}"
            ok = median >= TARGET
        print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
