"""Benchmark of the event callback under gunicorn + PostgreSQL (prints ratios).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_hooks \
    CELERY_BROKER_URL=redis://127.0.0.1:6379/7 .venv/bin/python benchmarks/bench_webhooks.py

1. Throughput: a load generator in another process sends signed deliveries over loopback to
   gunicorn serving (a) the full path - verify, store, enqueue on Celery (Redis) - and
   (b) a bare Django view on the same stack doing one INSERT of the body. Rounds alternate
   the two targets (the order flips each round) on the same gunicorn (``_paired.py``, the
   method all benchmarks share); prints both rates per round and, at the end, the median of
   the per-round ratios full/bare and the ratio of the median rates (the verdict: target
   >= 0.7 for both), plus the ratio of the best rates for information only: a maximum over
   noisy rounds is decided by one lucky round of either target. On Linux it also prints the
   CPU time per delivery of the gunicorn workers, their PostgreSQL backends and the load
   generator, and the ratio bare/full of those sums (what the throughput ratio tends to when
   the machine's CPUs are the bottleneck, and far less disturbed by other load than the
   rates). Exit status 1 when the throughput target is missed.
2. SQL queries per event on the ingest path and on the processing path, measured in-process
   with few and with many events already stored (target: constant).

Bounded: ``BENCH_REQUESTS`` deliveries per target and round (default 3000), ``BENCH_SECONDS``
at most per load (default 60), ``BENCH_CONCURRENCY`` client threads (default 8),
``BENCH_WORKERS`` gunicorn workers (default 2 x CPUs), ``BENCH_ROUNDS`` rounds (default 7).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/bench_hooks"
REQUESTS = int(os.environ.get("BENCH_REQUESTS", "3000"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "60"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "8"))
WORKERS = int(os.environ.get("BENCH_WORKERS", str(2 * (os.cpu_count() or 1))))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "7"))

os.environ.setdefault("DATABASE_URL", DEFAULT_DB)
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/7")
# A shared cache (BILLING['CACHE']: the "once" keys, the refusal counters), as in production.
os.environ.setdefault("CACHE_URL", "redis://127.0.0.1:6379/8")
os.environ["DJANGO_SETTINGS_MODULE"] = "webhook_bench_site"
sys.path[:0] = [str(ROOT), str(BENCH_DIR)]

from _paired import Paired, alternate, summary  # noqa: E402
from _stack import cpu_seconds  # noqa: E402

# --- the load generator (runs in its own process) ------------------------------------------
LOADGEN = r"""
import http.client, json, sys, threading, time
cfg = json.loads(sys.stdin.read())
bodies = [(b.encode(), h) for b, h in cfg["requests"]]
port, path, threads, deadline = cfg["port"], cfg["path"], cfg["threads"], cfg["seconds"]
lock = threading.Lock()
state = {"next": 0, "codes": {}}
start = time.perf_counter()
def worker():
    while True:
        with lock:
            i = state["next"]; state["next"] += 1
        if i >= len(bodies) or time.perf_counter() - start > deadline:
            return
        body, headers = bodies[i]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        headers = {**headers, "Content-Type": "application/json"}
        conn.request("POST", path, body=body, headers=headers)
        code = conn.getresponse().status
        conn.close()
        with lock:
            state["codes"][code] = state["codes"].get(code, 0) + 1
ts = [threading.Thread(target=worker) for _ in range(threads)]
[t.start() for t in ts]; [t.join() for t in ts]
elapsed = time.perf_counter() - start
print(json.dumps({"elapsed": elapsed, "codes": state["codes"], "cpu": time.process_time()}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_database() -> None:
    import psycopg
    from django.conf import settings

    db = settings.DATABASES["default"]
    if "postgresql" not in db["ENGINE"]:
        sys.exit("bench_webhooks needs PostgreSQL: set DATABASE_URL=postgres://...")
    params = {
        "host": db["HOST"],
        "port": db["PORT"] or 5432,
        "user": db["USER"],
        "password": db["PASSWORD"] or None,
    }
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
        if db["NAME"].startswith("bench"):  # a benchmark-only database: start from scratch
            conn.execute(f'DROP DATABASE IF EXISTS "{db["NAME"]}" WITH (FORCE)')
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]]
        ).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{db["NAME"]}"')


def prepare() -> None:
    import django

    django.setup()
    ensure_database()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    call_command("createcachetable", verbosity=0)  # when CACHE_URL names a database cache
    from webhook_bench_site import BARE_TABLE

    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {BARE_TABLE} "
            "(id bigserial PRIMARY KEY, body text NOT NULL, received_at timestamptz NOT NULL)"
        )
        cursor.execute(f"TRUNCATE {BARE_TABLE}")
        # CASCADE: the notices refer to their events (the benchmark's database only).
        cursor.execute("TRUNCATE billing_integration_webhookevent CASCADE")


def signed_requests(n: int) -> list[tuple[str, dict[str, str]]]:
    from webhook_bench_site import BENCH_SECRET

    from billing_integration.webhooks.verification import sign

    out = []
    now = int(time.time())
    for _ in range(n):
        event_id = str(uuid.uuid4())
        body = json.dumps(
            {
                "id": event_id,
                "type": "payment.completed",
                "created_at": "2026-01-01T00:00:00.000Z",
                "data": {
                    "id": str(uuid.uuid4()),
                    "status": "completed",
                    "amount": 5000,
                    "currency": "XOF",
                    "customer": str(uuid.uuid4()),
                    "subscription": str(uuid.uuid4()),
                    "product": str(uuid.uuid4()),
                    "invoice": None,
                    "failure_reason": None,
                    "date_created": "2026-01-01T00:00:00.000Z",
                    "date_updated": "2026-01-01T00:00:00.000Z",
                },
            }
        )
        headers = {
            "webhook-id": event_id,
            "webhook-timestamp": str(now),
            "webhook-signature": sign(body.encode(), BENCH_SECRET, event_id, now),
        }
        out.append((body, headers))
    return out


def start_gunicorn(port: int) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "gunicorn",
        "webhook_bench_site_wsgi:application",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(WORKERS),
        "--worker-class",
        "sync",
        "--log-level",
        "warning",
        "--chdir",
        str(ROOT),
        "--pythonpath",
        f"{ROOT},{BENCH_DIR}",
    ]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "webhook_bench_site"}
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.terminate()
    sys.exit("gunicorn did not start")


def _server_cpu(port: int) -> float | None:
    """CPU seconds so far of this benchmark's gunicorn processes and PostgreSQL backends."""
    from django.conf import settings

    database = settings.DATABASES["default"]["NAME"]
    return cpu_seconds(
        lambda _pid, cmd: (
            ("gunicorn" in cmd and f"127.0.0.1:{port}" in cmd)
            # Backends only: an autovacuum run lands in whichever round it happens to overlap.
            or (cmd.startswith("postgres:") and f" {database} " in cmd and "autovacuum" not in cmd)
        )
    )


def load(port: int, path: str, requests: list) -> dict:
    cfg = {
        "port": port,
        "path": path,
        "threads": CONCURRENCY,
        "seconds": SECONDS,
        "requests": requests,
    }
    result = subprocess.run(
        [sys.executable, "-c", LOADGEN],
        input=json.dumps(cfg),
        capture_output=True,
        text=True,
        timeout=SECONDS + 120,
        check=True,
    )
    data = json.loads(result.stdout)
    data["done"] = sum(data["codes"].values())
    data["rate"] = data["done"] / data["elapsed"]
    return data


def measured_load(port: int, path: str, requests: list) -> dict:
    """``load`` plus ``cpu_per_request``: seconds of CPU of the servers (gunicorn, PostgreSQL
    backends) and of the load generator per delivery; None where it cannot be read."""
    before = _server_cpu(port)
    data = load(port, path, requests)
    after = _server_cpu(port)
    data["cpu_per_request"] = (
        None if before is None or after is None else (after - before + data["cpu"]) / data["done"]
    )
    return data


def throughput() -> tuple[Paired, dict[str, list[float]]]:
    """The rates (requests/s) of the bare view (the floor) and the full path (the target),
    round by round (``_paired.alternate``), and the CPU per request of each (seconds; empty
    where it cannot be read)."""
    port = free_port()
    server = start_gunicorn(port)
    targets = {"bare": "/bare/", "full": "/billing/webhooks/"}
    cpu: dict[str, list[float]] = {name: [] for name in targets}
    labels = {"bare": "bare INSERT view ", "full": "webhook full path"}
    non_200 = False

    def measure(name: str) -> float:
        nonlocal non_200
        r = measured_load(port, targets[name], signed_requests(REQUESTS))
        if r["cpu_per_request"] is not None:
            cpu[name].append(r["cpu_per_request"])
        non_200 |= set(r["codes"]) != {"200"}
        print(
            f"{labels[name]}: {r['rate']:8.1f} req/s  ({r['done']} in "
            f"{r['elapsed']:.1f}s, codes {r['codes']})"
            + (
                f", CPU {r['cpu_per_request'] * 1e6:.0f} us/req"
                if r["cpu_per_request"] is not None
                else ""
            )
        )
        return r["rate"]

    try:
        for path in targets.values():  # warm-up: workers, connections
            load(port, path, signed_requests(200))
        paired = alternate(
            ROUNDS,
            lambda: measure("bare"),
            lambda: measure("full"),
            on_round=lambda i, f, t: print(f"round {i} ratio full/bare  : {t / f:.2f}x"),
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
    if non_200:
        print("WARNING: non-200 answers above")
    return paired, cpu


def statements(ctx) -> int:
    """SQL statements, not counting transaction control (psycopg 3 logs BEGIN/COMMIT)."""
    skip = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT")
    return sum(1 for q in ctx.captured_queries if not q["sql"].startswith(skip))


def rollup_statements(ctx) -> int:
    """Those of the reporting rollups' hook (``touch_reports``): the dirty month's UPDATE (and
    SELECT), and the trial end of a payment's subscription."""
    return sum(
        1
        for q in ctx.captured_queries
        if "billing_integration_reportstate" in q["sql"]
        or ('"trial_end_date" IS NOT NULL' in q["sql"] and " IN (" in q["sql"])
    )


def queries_per_event() -> tuple[dict[int, int], dict[int, int], dict[int, int]]:
    """Ingest and processing queries for one event, with few and with many stored, and the
    processing statements the reporting rollups add."""
    from django.db import connection
    from django.test import RequestFactory
    from django.test.utils import CaptureQueriesContext

    from billing_integration.models import Customer, Product, Subscription, WebhookEvent
    from billing_integration.outbox import from_remote
    from billing_integration.webhooks import views
    from billing_integration.webhooks.processing import process_in_order

    factory = RequestFactory()
    ingest: dict[int, int] = {}
    processing: dict[int, int] = {}
    rollups: dict[int, int] = {}
    with from_remote():
        customer = Customer.objects.create(
            remote_id=uuid.uuid4(), identifier="bench", sync_state="synced"
        )
        product = Product.objects.create(remote_id=uuid.uuid4(), name="bench", sync_state="synced")
        sub = Subscription.objects.create(
            remote_id=uuid.uuid4(),
            customer=customer,
            product=product,
            customer_remote_id=customer.remote_id,
            product_remote_id=product.remote_id,
            sync_state="synced",
        )
    from unittest import mock

    for stored in (WebhookEvent.objects.count(), None):
        if stored is None:  # grow the log, then measure again
            WebhookEvent.objects.bulk_create(
                [
                    WebhookEvent(event_id=str(uuid.uuid4()), raw_type="x", body="{}")
                    for _ in range(20000)
                ]
            )
        stored_now = WebhookEvent.objects.count()
        body, headers = signed_requests(1)[0]
        data = json.loads(body)
        data["data"].update(
            customer=str(customer.remote_id),
            subscription=str(sub.remote_id),
            product=str(product.remote_id),
        )
        from webhook_bench_site import BENCH_SECRET

        from billing_integration.webhooks.verification import sign

        body = json.dumps(data)
        headers["webhook-signature"] = sign(
            body.encode(), BENCH_SECRET, data["id"], int(headers["webhook-timestamp"])
        )
        meta = {"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()}
        request = factory.post(
            "/billing/webhooks/", data=body, content_type="application/json", **meta
        )
        with (
            mock.patch("billing_integration.webhooks.tasks.send"),
            CaptureQueriesContext(connection) as ctx,
        ):
            response = views.webhook(request)
        assert response.status_code == 200, response.content
        ingest[stored_now] = statements(ctx)
        pk = WebhookEvent.objects.get(event_id=data["id"]).pk
        with CaptureQueriesContext(connection) as ctx:
            result = process_in_order(pk)  # what the task does
        assert result.state == "processed", result
        processing[stored_now] = statements(ctx)
        rollups[stored_now] = rollup_statements(ctx)
    return ingest, processing, rollups


def main() -> int:
    prepare()
    paired, cpu = throughput()
    full, bare = paired.target, paired.floor
    print(summary("throughput full/bare", paired, 0.7, at_least=True))
    medians = paired.ratio_of_medians
    met = min(paired.median_ratio, medians) >= 0.7
    print(
        f"  verdict (median of the paired ratios and ratio of the median rates both >= 0.70): "
        f"{'OK' if met else 'BELOW TARGET'} (median {statistics.median(full):.1f} vs "
        f"{statistics.median(bare):.1f} req/s)"
    )
    print(
        f"  for information: ratio of the best rates {max(full) / max(bare):.2f}x "
        f"(best {max(full):.1f} vs {max(bare):.1f} req/s)"
    )
    cpu_full, cpu_bare = cpu["full"], cpu["bare"]
    if cpu_full and cpu_bare:
        print(
            f"CPU per delivery (gunicorn + PostgreSQL backends + load generator): full "
            f"{statistics.median(cpu_full) * 1e6:.0f} us, bare "
            f"{statistics.median(cpu_bare) * 1e6:.0f} us (medians); bare/full "
            f"{statistics.median(cpu_bare) / statistics.median(cpu_full):.2f}"
        )
    ingest, processing, rollups = queries_per_event()
    print(
        "  of the processing statements, added by the reporting rollups (touch_reports): "
        + ", ".join(f"{n} with {stored} events stored" for stored, n in rollups.items())
    )
    for label, counts in (("ingest", ingest), ("processing", processing)):
        detail = ", ".join(f"{n} with {stored} events stored" for stored, n in counts.items())
        ok = len(set(counts.values())) == 1
        print(
            f"SQL statements/event, {label:10s}: {detail}  (target: constant) "
            f"{'OK' if ok else 'CHECK'}"
        )
    try:  # do not leave the benchmark's messages for a worker to find
        from example_project.celery import app

        app.control.purge()
    except Exception as exc:
        print(f"(could not purge the Celery queue: {exc})")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
