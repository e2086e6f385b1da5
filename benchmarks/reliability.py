"""Reliability suite: N local changes over products and customers while the sandbox injects
20% 5xx, 5% timeouts, 5% resets after commit, a rate limit (429 with Retry-After above N billing
requests a second) for a while, an outage, and the broker is stopped and started again.
After the drain it prints and asserts: 0 changes lost, 0 duplicate remote objects, remote
state equal to local state for every object (every pushed field: a product's name, description,
status, selected currencies, each cycle's price per currency and one-time prices; a customer's
identifier, names and email).

    python benchmarks/reliability.py --changes 1000 --outage 30 --broker-stop 10 \
        --rate-limit 10 --rate-limit-seconds 10
    python benchmarks/reliability.py --broker rabbitmq --changes 1000 --outage 30 \
        --broker-stop 10 --rate-limit 10 --rate-limit-seconds 10

During the rate-limit phase (the changes from 10% to 30% of the run, paced over its seconds)
it prints the billing calls the sandbox received, how many it answered 429, and the peak and
mean calls per second against the limit: the workers back off together, then keep to a
shared pace under it.

The broker (``--broker``):

- ``redis`` (the default): a private ``redis-server`` (so stopping it disturbs nobody) when
  one is on the PATH, else ``CELERY_BROKER_URL`` (not stopped). At 60% of the changes it is
  killed (SIGKILL: what it held in memory is gone) and started again ``--broker-stop``
  seconds later, empty.
- ``rabbitmq``: the machine's RabbitMQ (``RABBITMQ_URL``, default
  ``amqp://guest:guest@127.0.0.1:5672//``; it must be local and this script run as root or
  the ``rabbitmq`` user), with a virtual host of the run's own, created at the start and
  deleted at the end, so its queues disturb nothing else. At 60% of the changes the whole
  server is restarted: ``rabbitmqctl stop`` halts the Erlang node (a graceful stop: it
  closes every connection, the workers' too, and keeps the durable queues and persistent
  messages on disk), the script waits until its port is closed, ``--broker-stop`` seconds
  later starts it with ``rabbitmq-server -detached`` (the machine's own start command) and
  waits until it accepts an AMQP connection to the virtual host again. A full stop rather
  than ``rabbitmqctl stop_app``: it is possible here (the server is the run's alone), and it
  is what an upgrade or a reboot of the broker's host does: the listener, the Erlang VM and
  every connection go, and the boot (tens of seconds on this machine) is part of the outage.
  The server is started again when the run fails or is interrupted too.

The changes go on while the broker is down (each of them paced by ``--broker-stop`` / the
changes left * 3 seconds, as long as the restart lasts), their wake-ups unpublished; the last
10% wait for the broker to be back, so some changes are published to the restarted broker.
The restart's moments (asked, down, started, accepting) are printed from the start of the run.

A database of its own (``<DATABASE_URL db>_reliability`` on PostgreSQL, else SQLite), an
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


def report_rate_limit_phase(
    requests: list[dict[str, Any]], start: float, end: float, limit: float
) -> dict[str, float]:
    """Print the billing calls the sandbox received during the rate-limit phase: how many, how
    many it answered 429, and calls per second (peak in any whole second, and mean) against
    the limit. Returns the figures."""
    calls = [
        r
        for r in requests
        if start <= r["time"] < end and r.get("operation") not in ("token", "checkout_page")
    ]
    refused = sum(1 for r in calls if r.get("status") == 429)
    accepted = len(calls) - refused
    seconds = max(end - start, 1e-9)
    sent: dict[int, int] = {}
    through: dict[int, int] = {}
    for r in calls:
        key = int(r["time"] - start)
        sent[key] = sent.get(key, 0) + 1
        if r.get("status") != 429:
            through[key] = through.get(key, 0) + 1
    peak = max(sent.values(), default=0)
    figures = {
        "calls": len(calls),
        "accepted": accepted,
        "refused": refused,
        "mean": len(calls) / seconds,
        "peak": peak,
        "peak_through": max(through.values(), default=0),
    }
    print(
        f"rate-limit phase: {seconds:.1f}s at {limit:g}/s: {len(calls)} billing calls "
        f"({accepted} let through, {refused} answered 429); calls per second: peak sent "
        f"{peak}, peak let through {figures['peak_through']}, mean sent "
        f"{figures['mean']:.1f} vs limit {limit:g} "
        f"({'under' if figures['mean'] <= limit else 'OVER'} it by "
        f"{abs(limit - figures['mean']):.1f}/s on average)"
    )
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=1000)
    parser.add_argument("--outage", type=float, default=30.0, help="seconds of 503s")
    parser.add_argument(
        "--broker",
        choices=("redis", "rabbitmq"),
        default="redis",
        help="redis: a private redis-server; rabbitmq: a vhost of its own on RABBITMQ_URL",
    )
    parser.add_argument(
        "--broker-stop",
        type=float,
        default=10.0,
        help="seconds the broker stays stopped before it is started again (0: never stopped)",
    )
    parser.add_argument(
        "--rate-limit",
        type=float,
        default=10.0,
        help="billing requests a second the sandbox accepts during the phase",
    )
    parser.add_argument(
        "--rate-limit-seconds",
        type=float,
        default=10.0,
        help="length of the rate-limit phase (0: none)",
    )
    parser.add_argument("--workers", type=int, default=4, help="worker processes")
    parser.add_argument("--drain-timeout", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)

    stack = Stack("reliability", broker=args.broker)
    restart = BrokerRestart(stack, args.broker_stop)
    try:
        stack.start()
        return run(stack, args, restart)
    finally:
        restart.wait()  # a restart under way ends (its steps have timeouts) before the stop
        stack.stop()  # RabbitMQ is started again if the run left it down


class BrokerRestart:
    """Stops the stack's broker, waits ``down`` seconds, starts it again, in a thread of its
    own (changes go on meanwhile); prints each moment in seconds from ``t0`` (the start of
    the changes, ``time.monotonic()``)."""

    def __init__(self, stack: Stack, down: float) -> None:
        self.stack, self.down, self.t0 = stack, down, 0.0
        self.moments: dict[str, float] = {}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _mark(self, moment: str, what: str) -> None:
        self.moments[moment] = time.monotonic() - self.t0
        print(f"[{self.moments[moment]:6.1f}s] broker {what}", flush=True)

    def _run(self) -> None:
        try:
            self._mark("asked", "stop asked")
            self.stack.stop_broker()
            self._mark("down", "down")
            time.sleep(self.down)
            self._mark("starting", "start asked")
            self.stack.start_broker()
            self._mark("up", "accepting connections again")
        except BaseException as exc:  # reported by finish(); the stack restarts RabbitMQ
            self.error = exc

    def start(self, t0: float) -> None:
        self.t0 = t0
        self.thread.start()

    def started(self) -> bool:
        return self.thread.ident is not None

    def running(self) -> bool:
        return self.thread.is_alive()

    def wait(self) -> None:
        if self.started():
            self.thread.join()

    def finish(self) -> None:
        """Wait for the broker to be back; raise what went wrong."""
        self.wait()
        if self.error is not None:
            raise RuntimeError(f"broker restart failed: {self.error}") from self.error

    def summary(self) -> str:
        m = self.moments
        if "up" not in m:
            return "broker restart: not completed"
        return (
            f"broker restart: stop asked at {m['asked']:.1f}s, down at {m['down']:.1f}s, "
            f"start asked at {m['starting']:.1f}s, accepting connections at {m['up']:.1f}s "
            f"({m['up'] - m['down']:.1f}s without a broker)"
        )


def run(stack: Stack, args: argparse.Namespace, restart: BrokerRestart) -> int:
    from django.db import transaction

    from billing_integration.models import BillingCycle, Customer, OutboxEntry, Price, Product
    from billing_integration.outbox.tasks import sweep_outbox

    rng = random.Random(args.seed)
    sandbox = stack.sandbox
    print(f"broker: {stack.broker_label()}  database: {stack.env['DATABASE_URL'].split('@')[-1]}")
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
    outage_at, broker_at, broker_back_by = int(n * 0.3), int(n * 0.6), int(n * 0.9)
    limit_at = int(n * 0.1)
    limited = bool(args.rate_limit_seconds and args.rate_limit and outage_at > limit_at)
    phase: list[float] = []  # wall-clock start and end of the rate-limit phase
    t0 = time.monotonic()
    for i in range(n):
        if limited and i == limit_at:
            sandbox.faults(rate_limit=args.rate_limit)
            phase.append(time.time())
            print(
                f"[{time.monotonic() - t0:6.1f}s] change {i}: rate limit "
                f"{args.rate_limit:g}/s for {args.rate_limit_seconds:g}s"
            )
        if limited and i == outage_at:
            sandbox.faults(rate_limit=None)
            phase.append(time.time())
            print(f"[{time.monotonic() - t0:6.1f}s] change {i}: rate limit lifted")
        if i == outage_at and args.outage:
            sandbox.faults(outage_seconds=args.outage)
            print(f"[{time.monotonic() - t0:6.1f}s] change {i}: sandbox outage {args.outage}s")
        if i == broker_at and args.broker_stop and stack.broker_restartable:
            print(f"[{time.monotonic() - t0:6.1f}s] change {i}: broker restart")
            restart.start(t0)
        if i == broker_back_by and restart.running():
            print(f"[{time.monotonic() - t0:6.1f}s] change {i}: waiting for the broker")
            restart.finish()
            print(f"[{time.monotonic() - t0:6.1f}s] change {i}: changes go on")
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
        if restart.running():
            time.sleep(args.broker_stop / max(1, n - broker_at) * 3)
        if limited and limit_at <= i < outage_at:  # the phase's changes, paced over it
            end = phase[0] + args.rate_limit_seconds * (i + 1 - limit_at) / (outage_at - limit_at)
            time.sleep(max(0.0, end - time.time()))
    restart.finish()
    print(
        f"[{time.monotonic() - t0:6.1f}s] {n} changes made; "
        f"{len(products)} products, {len(customers)} customers"
    )

    # Drain: the periodic safety net, as beat would run it.
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(3.0):
            try:
                sweep_outbox()
            except Exception as exc:  # broker still down
                print("drain:", exc)

    # The sweep of this process takes entries untouched for 3 s (not a minute), and those a
    # killed worker held after 30 s (not 5 minutes): the run is short.
    from billing_integration.models import outbox as outbox_model
    from billing_integration.outbox import tasks as outbox_tasks

    outbox_tasks.STALE_AFTER, outbox_model.LEASE = 3.0, 30.0
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
    if len(phase) == 2:
        report_rate_limit_phase(requests, phase[0], phase[1], args.rate_limit)
    if restart.started():
        print(restart.summary())
        lost_connections = stack.worker_log_count("Connection to broker lost")
        print(f"worker connections to the broker lost (worker logs): {lost_connections}")
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
