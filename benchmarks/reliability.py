"""Reliability suite: N local changes over products and customers while the sandbox injects
20% 5xx, 5% timeouts, 5% resets after commit, an outage, and the broker is stopped for part of
the run. After the drain it prints and asserts: 0 changes lost, 0 duplicate remote objects,
remote state equal to local state for every object (every pushed field: a product's name,
description, status, selected currencies, each cycle's price per currency and one-time prices;
a customer's identifier, names and email).

    python benchmarks/reliability.py --changes 1000 --outage 30 --broker-stop 10

Uses a private ``redis-server`` as broker (so stopping it disturbs nobody) when one is on the
PATH, a database of its own (``<DATABASE_URL db>_reliability`` on PostgreSQL, else SQLite), an
in-process sandbox and real worker processes. Exit status 1 when an assertion fails.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stack import Stack, wait

#: Customer fields the app pushes (``mapping.customers.CREATE_FIELDS``; the service has no
#: customer update).
CUSTOMER_FIELDS = ("identifier", "first_name", "last_name", "email")


@dataclass
class Comparison:
    """Local mirror against the sandbox's stored objects."""

    lost: int = 0  # local objects with no remote twin
    duplicate_products: int = 0
    duplicate_customers: int = 0
    #: ``(object, field, local value, remote value)`` for each pushed field that differs
    mismatched: list[tuple[str, str, Any, Any]] = field(default_factory=list)
    products: int = 0
    customers: int = 0
    prices: int = 0  # local prices compared


def _amounts(prices: Any) -> dict[int, Decimal]:
    """``{currency id: amount}`` of wire prices (``[{"currency", "amount"}]``)."""
    return {int(p["currency"]): Decimal(str(p["amount"])) for p in prices or []}


def local_product_state(product: Any) -> dict[str, Any]:
    """Every field the app pushes for ``product``, read from the models (not through the
    app's mapping, so a mapping bug shows too): name, description, status, selected
    currencies, each cycle's prices per currency, one-time prices."""
    cycles = {
        f"{c.unit}-{c.frequency}": {int(p.currency_id): p.amount for p in c.prices.all()}
        for c in product.cycles.all()
    }
    prices = {int(p.currency_id): p.amount for p in product.root_prices.all()}
    one_time = product.is_one_time
    return {
        "name": product.name,
        "description": product.description or "",
        "status": product.status,
        "selected_currencies": sorted(int(c) for c in product.selected_currencies or []),
        "cycles": None if one_time else cycles,
        "prices": prices if one_time else None,
    }


def remote_product_state(doc: dict[str, Any], blueprints: dict[str, Any]) -> dict[str, Any]:
    """The same fields from the sandbox's stored product and its blueprint."""
    bp = blueprints.get(doc.get("subscription_blueprint") or "")
    cycles = None
    if bp is not None:
        cycles = {
            f"{c['cycle']}-{c['frequency']}": _amounts(c.get("prices"))
            for c in bp.get("billing_cycles") or []
        }
    return {
        "name": doc.get("name"),
        "description": doc.get("description") or "",
        "status": doc.get("status"),
        "selected_currencies": sorted(int(c) for c in doc.get("selected_currencies") or []),
        "cycles": cycles,
        "prices": None if doc.get("prices") is None else _amounts(doc["prices"]),
    }


def compare_with_remote(sandbox: Any) -> Comparison:
    """Compare every pushed field of every local product and customer with the sandbox's
    stored object; count lost and duplicated objects."""
    from billing_integration.models import Customer, Price, Product

    result = Comparison()
    remote_products = {p["id"]: p for p in sandbox.objects("product")}
    blueprints = {b["id"]: b for b in sandbox.objects("blueprint")}
    remote_customers = {c["id"]: c for c in sandbox.objects("customer")}
    products = Product.objects.prefetch_related("cycles__prices", "root_prices")
    for p in products:
        result.products += 1
        r = remote_products.get(str(p.remote_id)) if p.remote_id else None
        if r is None:
            result.lost += 1
            continue
        local, remote = local_product_state(p), remote_product_state(r, blueprints)
        for name, value in local.items():
            if value != remote[name]:
                result.mismatched.append((f"product {p.pk}", name, value, remote[name]))
    result.prices = Price.objects.count()
    for c in Customer.objects.all():
        result.customers += 1
        r = remote_customers.get(str(c.remote_id)) if c.remote_id else None
        if r is None:
            result.lost += 1
            continue
        for name in CUSTOMER_FIELDS:
            local, remote = getattr(c, name) or "", r.get(name) or ""
            if local != remote:
                result.mismatched.append((f"customer {c.pk}", name, local, remote))
    result.duplicate_products = (
        len(remote_products) - Product.objects.exclude(remote_id=None).count()
    )
    idents = [c["identifier"] for c in remote_customers.values()]
    result.duplicate_customers = len(idents) - len(set(idents))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=1000)
    parser.add_argument("--outage", type=float, default=30.0, help="seconds of 503s")
    parser.add_argument("--broker-stop", type=float, default=10.0, help="seconds without broker")
    parser.add_argument("--workers", type=int, default=4, help="worker processes")
    parser.add_argument("--drain-timeout", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)

    stack = Stack(
        "reliability",
        private_redis=True,
        extra={
            "READ_TIMEOUT": 2.0,
            "MAX_RETRIES": 2,
            "BACKOFF_BASE": 0.2,
            "BACKOFF_MAX": 2.0,
            "OUTBOX_RETRY_BASE": 0.5,
            "OUTBOX_RETRY_MAX": 5.0,
            "OUTBOX_MAX_ATTEMPTS": 1000,
            "OUTBOX_STALE_AFTER": 3.0,
            "OUTBOX_LEASE": 30.0,
        },
    ).start()
    try:
        return run(stack, args)
    finally:
        stack.stop()


def run(stack: Stack, args: argparse.Namespace) -> int:
    from django.db import transaction

    from billing_integration.models import BillingCycle, Customer, OutboxEntry, Price, Product
    from billing_integration.outbox.tasks import requeue_stale_entries

    rng = random.Random(args.seed)
    sandbox = stack.sandbox
    print(f"broker: {stack.broker_url()}  database: {stack.env['DATABASE_URL'].split('@')[-1]}")
    stack.start_worker(concurrency=args.workers)
    sandbox.faults(
        operation="*",
        error_rate=0.20,
        status=503,
        timeout_rate=0.05,
        timeout_seconds=3.0,
        reset_after_commit_rate=0.05,
        seed=args.seed,
    )

    products: list[int] = []
    customers: list[int] = []
    n = args.changes
    outage_at, broker_at = int(n * 0.3), int(n * 0.6)
    broker_stopped = False
    t0 = time.monotonic()
    for i in range(n):
        if i == outage_at and args.outage:
            sandbox.faults(outage_seconds=args.outage)
            print(f"[{time.monotonic() - t0:6.1f}s] change {i}: sandbox outage {args.outage}s")
        if i == broker_at and args.broker_stop and stack.private_redis:
            stack.stop_redis()
            broker_stopped = True
            restart_at = time.monotonic() + args.broker_stop
            print(f"[{time.monotonic() - t0:6.1f}s] change {i}: broker stopped")
        if broker_stopped and time.monotonic() >= restart_at:
            stack.start_redis()
            broker_stopped = False
            print(f"[{time.monotonic() - t0:6.1f}s] change {i}: broker restarted")
        roll = rng.random()
        with transaction.atomic():
            if roll < 0.25 or not products:
                p = Product.objects.create(
                    name=f"Plan {i}", description=f"d{i}", selected_currencies=[1]
                )
                c = BillingCycle.objects.create(product=p, unit="months", frequency=1)
                Price.objects.create(cycle=c, currency_id=1, amount=Decimal(1000 + i))
                products.append(p.pk)
            elif roll < 0.5 or not customers:
                c = Customer.objects.create(
                    identifier=f"rel-{i}",
                    first_name="F",
                    last_name=str(i),
                    email=f"c{i}@example.com",
                )
                customers.append(c.pk)
            elif roll < 0.7:
                p = Product.objects.get(pk=rng.choice(products))
                p.name = f"Plan {p.pk} rev {i}"
                p.save()
            elif roll < 0.85:
                p = Product.objects.get(pk=rng.choice(products))
                if p.status != "archived":
                    p.status = "published" if p.status == "draft" else "archived"
                    p.save()
                else:
                    p.description = f"archived rev {i}"
                    p.save()
            else:
                price = Price.objects.filter(cycle__product_id=rng.choice(products)).first()
                price.amount = Decimal(2000 + i)
                price.save()
        if broker_stopped:
            time.sleep(args.broker_stop / max(1, n - broker_at) * 3)
    if broker_stopped:
        time.sleep(max(0.0, restart_at - time.monotonic()))
        stack.start_redis()
        print(f"[{time.monotonic() - t0:6.1f}s] broker restarted")
    print(
        f"[{time.monotonic() - t0:6.1f}s] {n} changes made; "
        f"{len(products)} products, {len(customers)} customers"
    )

    # Drain: the periodic safety net, as beat would run it.
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(3.0):
            try:
                requeue_stale_entries()
            except Exception as exc:  # broker still down
                print("drain:", exc)

    threading.Thread(target=beat, daemon=True).start()
    finished = wait(
        lambda: not OutboxEntry.objects.exclude(state="done").exists(),
        timeout=args.drain_timeout,
        interval=1.0,
    )
    stop.set()
    sandbox.clear_faults()
    elapsed = time.monotonic() - t0
    open_entries = OutboxEntry.objects.exclude(state="done").count()
    print(
        f"[{elapsed:6.1f}s] drain {'finished' if finished else 'TIMED OUT'}; "
        f"entries not done: {open_entries}"
    )

    # --- verification --------------------------------------------------------------------
    result = compare_with_remote(sandbox)
    lost, mismatched = result.lost, result.mismatched
    dup_products, dup_customers = result.duplicate_products, result.duplicate_customers
    requests = sandbox.requests()
    faults = sum(1 for r in requests if (r.get("status") or 200) >= 500)
    print(f"requests seen by the sandbox: {len(requests)} ({faults} answered 5xx)")
    print(f"changes lost: {lost}")
    print(
        f"duplicate remote objects: {dup_products + dup_customers} "
        f"(products {dup_products}, customers {dup_customers})"
    )
    print(f"objects whose remote state differs from local: {len(mismatched)}")
    for item in mismatched[:10]:
        print("   ", item)
    print(
        f"compared: {result.products} products, {result.customers} customers, "
        f"{result.prices} prices"
    )
    ok = finished and lost == 0 and dup_products == 0 and dup_customers == 0 and not mismatched
    if not ok:
        print(stack.worker_logs()[-4000:])
    print("RELIABILITY", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
