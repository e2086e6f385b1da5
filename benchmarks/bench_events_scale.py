"""Event processing spread over Celery worker processes: 4 workers against 1 (target >= 3x).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/events \
    CELERY_BROKER_URL=redis://127.0.0.1:6379/4 CACHE_URL=redis://127.0.0.1:6379/5 \
        .venv/bin/python benchmarks/bench_events_scale.py [--events 10000] \
        [--subscriptions 1000] [--rounds 5] [--workers 4]
    ... --profile        instead: the task's body for every event in this process, timed
                         (wall, CPU of this process and of its backend), then under cProfile

The stack (``benchmarks/_stack.py``) gets a database of its own (``<db>_events_scale`` on
PostgreSQL, created and dropped by the script). Set-up, once: ``--subscriptions``
subscriptions (each with its customer) and ``--events`` signed events about them, 70%
``subscription.*`` (renewal, canceled, paused) and 30% ``payment.*`` (each subscription has
two payments; a payment event also moves its subscription's ``last_payment_status``), every
object's events in increasing ``date_updated``, the subscriptions interleaved at random. They
are stored through the ingest path (``store_delivery``: the envelope read, the signed headers
kept, one INSERT each), and their rows kept. Then the reference: the same events processed in
this process, one by one in order of reception (``process_event``); its final state
(subscriptions' status, version, ``last_payment_status``; payments' status and version) is
checked against the plain-Python answer (per object, the event with the latest version
wins) and is what every round must end with.

Each measurement: the subscriptions and payments are reset, the stored rows are inserted
again as ``received`` (one transaction, reception times kept), and the commit sends one
``process_webhook_event`` message per event, as the webhook view does; the time runs from the
commit until no event is ``received``. Then the final state must equal the reference, every event be
``processed`` with one attempt; anything else fails the run (``MeasurementFailed``).
The floor is one Celery worker process (``celery worker -c 1``), the target four
(``-c 4``, prefork; the worker processes are started, and have run one task with nothing
to do, before each measurement, and are stopped after it, outside the timing). Rounds run
the two back to back, the order flipped every round; the verdict is the median of the paired
round ratios rate(4) / rate(1)
(``benchmarks/_paired.py``). Also printed per side, on Linux: the CPU time per event of the
worker processes plus their PostgreSQL backends (``/proc``), and the cores busy during the
measurement, those processes' and the whole machine's (``/proc/stat``): what the machine's
cores can give, and how much of them other work took.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paired import MeasurementFailed, alternate, require, summary
from _stack import Stack, cpu_seconds, wait

TARGET = 3.0
T0 = datetime(2026, 1, 1, tzinfo=UTC)
SECRET = "whsec_" + "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="


def ts(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


# --- the world and the events ------------------------------------------------------------


def make_world(n_subscriptions: int) -> list[dict]:
    """Customers, a product and ``n`` subscriptions as from the service; returns the
    subscriptions' initial column values (to reset them before every measurement)."""
    from billing_integration.models import Customer, Product, Subscription

    product = Product.objects.create(remote_id=uuid.uuid4(), name="P", sync_state="synced")
    customers = Customer.objects.bulk_create(
        [
            Customer(remote_id=uuid.uuid4(), identifier=f"c{i}", sync_state="synced")
            for i in range(n_subscriptions)
        ]
    )
    rows = [
        {
            "remote_id": uuid.uuid4(),
            "customer_id": customer.pk,
            "product_id": product.pk,
            "customer_remote_id": customer.remote_id,
            "product_remote_id": product.remote_id,
            "status": "published",
            "remote_updated": T0 - timedelta(days=1),
            "cycle_start_date": T0,
            "cycle_end_date": T0 + timedelta(days=30),
            "sync_state": "synced",
        }
        for customer in customers
    ]
    Subscription.objects.bulk_create([Subscription(**row) for row in rows])
    return rows


def reset_world(initial: list[dict]) -> None:
    """Back to the state before any event: no events, no payments, the subscriptions as
    created (same remote ids)."""
    from billing_integration.models import OutboxEntry, Payment, Subscription, WebhookEvent

    WebhookEvent.objects.all().delete()
    Payment.objects.all().delete()
    Subscription.objects.all().delete()
    OutboxEntry.objects.all().delete()
    Subscription.objects.bulk_create([Subscription(**row) for row in initial])


def make_events(initial: list[dict], n_events: int, rng: random.Random) -> list[dict]:
    """``n_events`` envelopes about the subscriptions (and two payments of each), every
    object's in increasing version, the objects interleaved at random."""
    product = str(initial[0]["product_remote_id"])
    per_sub: list[list[dict]] = []
    for i, row in enumerate(initial):
        sub, customer = str(row["remote_id"]), str(row["customer_remote_id"])
        payments = [str(uuid.uuid4()), str(uuid.uuid4())]
        count = n_events // len(initial) + (1 if i < n_events % len(initial) else 0)
        events = []
        for j in range(count):
            at = T0 + timedelta(minutes=10 * (j + 1), seconds=i % 60)
            if rng.random() < 0.7:
                action = rng.choice(["renewal", "canceled", "paused"])
                data = {
                    "id": sub,
                    "user_created": None,
                    "user_updated": None,
                    "date_created": ts(T0 - timedelta(days=1)),
                    "date_updated": ts(at),
                    "status": {"renewal": "published"}.get(action, action),
                    "product": product,
                    "customer": customer,
                    "cycle_start_date": ts(T0 + timedelta(days=j)),
                    "cycle_end_date": ts(T0 + timedelta(days=j + 30)),
                    "next_billing_date": ts(T0 + timedelta(days=j + 30)),
                    "auto_renew": True,
                    "discount_coupon": None,
                    "trial_end_date": None,
                    "selected_billing_cycle": "months-1",
                    "selected_currency": "XOF",
                }
                event_type = f"subscription.{action}"
            else:
                status = rng.choice(["completed", "failed", "canceled"])
                data = {
                    "id": rng.choice(payments),
                    "status": status,
                    "amount": rng.randint(1, 9999),
                    "currency": "XOF",
                    "customer": customer,
                    "subscription": sub,
                    "product": product,
                    "invoice": None,
                    "failure_reason": None,
                    "date_created": ts(T0),
                    "date_updated": ts(at),
                }
                event_type = f"payment.{status}"
            events.append(
                {"id": str(uuid.uuid4()), "type": event_type, "created_at": ts(at), "data": data}
            )
        per_sub.append(events)
    # Interleave: each next event comes from a random subscription with events left, so each
    # object's events keep their order of version.
    order = [i for i, events in enumerate(per_sub) for _ in events]
    rng.shuffle(order)
    cursors = [0] * len(per_sub)
    out = []
    for i in order:
        out.append(per_sub[i][cursors[i]])
        cursors[i] += 1
    return out


def store(envelopes: list[dict]) -> list[dict]:
    """Store the events through the ingest path (signed deliveries) and return their rows'
    column values, in order of reception, to insert again before each measurement."""
    from billing_integration.models import WebhookEvent
    from billing_integration.webhooks.ingest import safe_headers, store_delivery
    from billing_integration.webhooks.verification import Verification, sign

    now = int(time.time())
    for env in envelopes:
        body = json.dumps(env).encode()
        headers = {
            "webhook-id": env["id"],
            "webhook-timestamp": str(now),
            "webhook-signature": sign(body, SECRET, env["id"], now),
            "content-type": "application/json",
        }
        result = store_delivery(
            body, safe_headers(headers), Verification("signature", env["id"], now)
        )
        require(result.created, f"event {env['id']} not stored")
    fields = [f.attname for f in WebhookEvent._meta.concrete_fields if f.attname != "id"]
    return list(WebhookEvent.objects.order_by("received_at", "pk").values(*fields))


def insert_received(rows: list[dict]) -> float:
    """Insert the rows as ``received`` in one transaction and send each event's message after
    its commit, as the webhook view does; returns the time of the commit."""
    from django.db import transaction

    from billing_integration.models import WebhookEvent
    from billing_integration.webhooks.tasks import send

    committed: list[float] = []
    with transaction.atomic():
        events = [WebhookEvent(**row) for row in rows]
        WebhookEvent.objects.bulk_create(events, batch_size=2000)
        pks = list(WebhookEvent.objects.order_by("received_at", "pk").values_list("pk", flat=True))
        transaction.on_commit(lambda: committed.append(time.perf_counter()))
        transaction.on_commit(lambda: [send(pk) for pk in pks])
    return committed[0]


# --- the outcome -------------------------------------------------------------------------


def final_state() -> dict:
    from billing_integration.models import Payment, Subscription

    return {
        "subscriptions": {
            str(rid): (status, updated, last)
            for rid, status, updated, last in Subscription.objects.values_list(
                "remote_id", "status", "remote_updated", "last_payment_status"
            )
        },
        "payments": {
            str(rid): (status, updated)
            for rid, status, updated in Payment.objects.values_list(
                "remote_id", "status", "remote_updated"
            )
        },
    }


def expected_state(envelopes: list[dict]) -> dict:
    """Per object the event with the latest version wins (plain Python)."""
    from billing_integration.timestamps import parse_timestamp

    subs: dict[str, list] = {}
    payments: dict[str, tuple] = {}
    last_payment: dict[str, tuple] = {}
    for env in envelopes:
        data = env["data"]
        at = parse_timestamp(data["date_updated"])
        if env["type"].startswith("subscription."):
            old = subs.get(data["id"])
            if old is None or at >= old[1]:
                subs[data["id"]] = [data["status"], at]
        else:
            if data["id"] not in payments or at >= payments[data["id"]][1]:
                payments[data["id"]] = (data["status"], at)
            sub = data["subscription"]
            if sub not in last_payment or at >= last_payment[sub][1]:
                last_payment[sub] = (data["status"], at)
    return {
        "subscriptions": {rid: (status, at) for rid, (status, at) in subs.items()},
        "payments": payments,
        "last_payment": {rid: status for rid, (status, _) in last_payment.items()},
    }


def check_outcome(reference: dict, n_events: int) -> None:
    from django.db.models import Count

    from billing_integration.models import EventState, WebhookEvent

    states = dict(WebhookEvent.objects.values_list("state").annotate(n=Count("pk")).order_by())
    require(states == {EventState.PROCESSED: n_events}, f"event states {states}")
    attempts = set(WebhookEvent.objects.values_list("attempts", flat=True).distinct())
    require(attempts == {1}, f"attempts {attempts}: an event processed more than once")
    require(final_state() == reference, "the final state differs from in-order processing")


def matches_plain_python(state: dict, expected: dict) -> bool:
    subs = {rid: (status, at) for rid, (status, at, _) in state["subscriptions"].items()}
    last = {rid: lp for rid, (_, _, lp) in state["subscriptions"].items() if lp}
    return (
        all(subs[rid] == value for rid, value in expected["subscriptions"].items())
        and state["payments"] == expected["payments"]
        and last == expected["last_payment"]
    )


# --- the runs ----------------------------------------------------------------------------


def process_in_order() -> float:
    """The reference: every received event processed here, one by one in order of
    reception; returns the seconds it took."""
    from billing_integration.models import EventState, WebhookEvent
    from billing_integration.webhooks.processing import process_event

    pks = list(
        WebhookEvent.objects.filter(state=EventState.RECEIVED)
        .order_by("received_at", "pk")
        .values_list("pk", flat=True)
    )
    started = time.perf_counter()
    for pk in pks:
        process_event(pk)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10000)
    parser.add_argument("--subscriptions", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=4, help="worker processes of the target")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement")
    parser.add_argument("--profile", action="store_true", help="cProfile the tasks in-process")
    args = parser.parse_args()

    os.environ.setdefault("DEBUG", "0")  # no query log in the worker processes
    stack = Stack(
        "events_scale",
        extra={"WEBHOOK_SECRET": SECRET},
    ).start()
    try:
        from django.db import connection

        from billing_integration.outbox import from_remote

        rng = random.Random(20261123)
        with from_remote():
            initial = make_world(args.subscriptions)
        envelopes = make_events(initial, args.events, rng)
        started = time.perf_counter()
        rows = store(envelopes)
        print(
            f"set-up: {len(rows)} events over {args.subscriptions} subscriptions stored through "
            f"the ingest path in {time.perf_counter() - started:.1f} s"
        )
        require(len(rows) == args.events, "events stored")
        if args.profile:
            return profile(initial, rows)

        seconds = process_in_order()
        reference = final_state()
        require(
            matches_plain_python(reference, expected_state(envelopes)),
            "in-order processing does not give the plain-Python state",
        )
        check_outcome(reference, args.events)
        print(
            f"reference: in order, in this process: {args.events / seconds:.0f} events/s "
            f"({seconds:.1f} s)"
        )
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_backend_pid()" if connection.vendor == "postgresql" else "SELECT 0"
            )
            own_backend = cursor.fetchone()[0]
        database = connection.settings_dict["NAME"]

        def server_cpu() -> float:
            return (
                cpu_seconds(
                    lambda pid, cmd: (
                        (stack.queue in cmd and "celery" in cmd)
                        or (
                            cmd.startswith("postgres:")
                            and f" {database} " in cmd
                            and pid != own_backend
                        )
                    )
                )
                or 0.0
            )

        cpu: dict[int, list[float]] = {1: [], args.workers: []}
        #: Cores in use during each measurement: this benchmark's (workers and their
        #: backends) and the whole machine's (everything else running on it included).
        cores: dict[int, list[tuple[float, float]]] = {1: [], args.workers: []}

        def measure(workers: int) -> float:
            reset_world(initial)
            stack.start_worker(concurrency=workers)
            try:
                warm_up(args.timeout)
                before, machine_before = server_cpu(), machine_busy()
                committed = insert_received(rows)
                require(
                    wait(left_received_none, timeout=args.timeout, interval=0.2),
                    f"{workers} worker(s): not done within {args.timeout:g} s",
                )
                elapsed = time.perf_counter() - committed
                ours = server_cpu() - before
                cpu[workers].append(ours / args.events)
                cores[workers].append((ours / elapsed, (machine_busy() - machine_before) / elapsed))
            finally:
                stack.stop_workers()
            check_outcome(reference, args.events)
            return args.events / elapsed

        paired = alternate(
            args.rounds,
            lambda: measure(1),
            lambda: measure(args.workers),
            on_round=lambda i, f, t: print(
                f"  round {i}: 1 worker {f:.0f} events/s, {args.workers} workers {t:.0f} "
                f"events/s, ratio {t / f:.2f}; CPU per event {cpu[1][-1] * 1000:.2f} ms / "
                f"{cpu[args.workers][-1] * 1000:.2f} ms; cores busy (this benchmark / the "
                f"machine) {cores[1][-1][0]:.2f} / {cores[1][-1][1]:.2f} and "
                f"{cores[args.workers][-1][0]:.2f} / {cores[args.workers][-1][1]:.2f}"
            ),
        )
        print(
            f"{args.rounds} alternating rounds of {args.events} events over "
            f"{args.subscriptions} subscriptions"
        )
        print(summary(f"{args.workers} workers / 1 worker", paired, TARGET, at_least=True))
        import statistics

        print(
            f"median CPU per event (workers + their PostgreSQL backends): 1 worker "
            f"{statistics.median(cpu[1]) * 1000:.2f} ms, {args.workers} workers "
            f"{statistics.median(cpu[args.workers]) * 1000:.2f} ms; single-run throughput "
            f"(1 worker, median) {statistics.median(paired.floor):.0f} events/s; "
            f"CPUs here: {os.cpu_count()}"
        )
        print("final state after every run: equal to in-order processing")
    except MeasurementFailed as exc:
        print(f"no figure: {exc}")
        print(stack.worker_logs()[-3000:])
        return 1
    finally:
        stack.stop()
    return 0 if paired.median_ratio >= TARGET else 1


def warm_up(timeout: float) -> None:
    """Give the worker its first task (an event that does not exist) and a moment to run it."""
    from billing_integration.webhooks.tasks import send

    send(0)
    time.sleep(min(2.0, timeout))


def machine_busy() -> float:
    """CPU seconds all the machine's cores have been busy since boot (``/proc/stat``: all but
    idle and iowait); 0 where there is no ``/proc``."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:9]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields)
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def left_received_none() -> bool:
    from billing_integration.models import EventState, WebhookEvent

    return not WebhookEvent.objects.filter(state=EventState.RECEIVED).exists()


def profile(initial: list[dict], rows: list[dict]) -> int:
    """Two in-process runs of the task's body over every stored event (as received): one
    timed (wall, this process's CPU, its PostgreSQL backend's CPU), one under cProfile."""
    import cProfile
    import pstats

    from django.db import connection

    from billing_integration.models import WebhookEvent
    from billing_integration.webhooks.processing import process_in_order

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]

    def backend_cpu() -> float:
        return cpu_seconds(lambda pid, _cmd: pid == backend) or 0.0

    for profiled in (False, True):
        reset_world(initial)
        WebhookEvent.objects.bulk_create([WebhookEvent(**row) for row in rows], batch_size=2000)
        # CPU time, not wall time: where this process spends its CPU (waiting for
        # PostgreSQL is in the timed run's figures).
        prof = cProfile.Profile(time.process_time) if profiled else None
        wall, cpu, db = time.perf_counter(), time.process_time(), backend_cpu()
        if prof:
            prof.enable()
        pks = WebhookEvent.objects.order_by("received_at", "pk").values_list("pk", flat=True)
        handled = 0
        for pk in list(pks):
            process_in_order(pk)
            handled += 1
        if prof:
            prof.disable()
        wall, cpu, db = (
            time.perf_counter() - wall,
            time.process_time() - cpu,
            backend_cpu() - db,
        )
        print(
            f"in-process tasks{' (profiled)' if profiled else ''}: {handled} events in "
            f"{wall:.1f} s ({handled / wall:.0f}/s); per event: wall {wall / handled * 1000:.2f}"
            f" ms, Python CPU {cpu / handled * 1000:.2f} ms, PostgreSQL backend CPU "
            f"{db / handled * 1000:.2f} ms"
        )
        if prof:
            stats = pstats.Stats(prof)
            stats.sort_stats("cumulative").print_stats(45)
            stats.sort_stats("tottime").print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
