"""Benchmark: webhook ingest throughput while the event log is pruned (prints ratios).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/prune_bench \
    CELERY_BROKER_URL=redis://127.0.0.1:6379/10 CACHE_URL=redis://127.0.0.1:6379/9 \
    .venv/bin/python benchmarks/bench_prune.py

The stack of ``bench_webhooks.py`` (gunicorn + PostgreSQL, signed deliveries from a load
generator in another process, to the full callback path). The log is seeded (``bulk_create``)
with ``BENCH_PRUNE_ROWS`` processed deliveries received 200
days ago (default 1,000,000), topped up again before every round with a prune. Paired rounds
(``_paired.py``): the floor is the ingest rate with no prune, the target the ingest rate
while ``prune_events(90 days)`` runs in another process, started as the load starts and
stopped when it ends. Verdict: the median of the per-round ratios with/without >= 0.8. A
round whose prune ran out of rows before the load ended is no measurement (it fails the run:
seed more rows or send fewer deliveries).

Options (environment): ``BENCH_PRUNE_ROWS``, ``BENCH_PRUNE_BATCH`` (rows per DELETE, default
1000), ``BENCH_PRUNE_PAUSE`` (seconds between batches, default 0) and ``BENCH_PRUNE_MAX_BUSY``
(the share of the time the batches may take, default 0.25): the beat task's, and those of
``bench_webhooks.py`` (``BENCH_REQUESTS``, ``BENCH_SECONDS``, ``BENCH_CONCURRENCY``,
``BENCH_WORKERS``, ``BENCH_ROUNDS``, default 5 here).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/prune_bench")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/10")
os.environ.setdefault("CACHE_URL", "redis://127.0.0.1:6379/9")
os.environ.setdefault("BENCH_ROUNDS", "5")
sys.path.insert(0, str(BENCH_DIR))

import bench_webhooks as hooks  # noqa: E402
from _paired import MeasurementFailed, alternate, require, summary  # noqa: E402

ROWS = int(os.environ.get("BENCH_PRUNE_ROWS", "1000000"))
BATCH = int(os.environ.get("BENCH_PRUNE_BATCH", "1000"))
PAUSE = float(os.environ.get("BENCH_PRUNE_PAUSE", "0"))
MAX_BUSY = float(os.environ.get("BENCH_PRUNE_MAX_BUSY", "0.25"))
TARGET = 0.8

# The prune, in its own process: set up Django, say "ready", wait for "go", prune.
PRUNER = r"""
import json, os, sys, time
sys.path[:0] = sys.argv[1:3]
os.environ["DJANGO_SETTINGS_MODULE"] = "webhook_bench_site"
import django
django.setup()
from datetime import timedelta
from billing_integration.webhooks.prune import prune_events
print("ready", flush=True)
sys.stdin.readline()
start = time.perf_counter()
result = prune_events(
    timedelta(days=90),
    batch_size=int(sys.argv[3]),
    pause=float(sys.argv[4]),
    max_busy=float(sys.argv[5]),
)
print(json.dumps({"deleted": result.deleted, "seconds": time.perf_counter() - start}), flush=True)
"""


def old_count() -> int:
    from billing_integration.models import EventState, WebhookEvent

    return WebhookEvent.objects.filter(state=EventState.PROCESSED).count()


def top_up(rows: int) -> None:
    """Seed processed deliveries received 200 days ago until ``rows`` are there (bulk_create)."""
    from django.utils import timezone

    from billing_integration.models import EventState, WebhookEvent

    missing = rows - old_count()
    when = timezone.now() - timedelta(days=200)
    body, headers = hooks.signed_requests(1)[0]
    while missing > 0:
        n = min(missing, 50_000)
        WebhookEvent.objects.bulk_create(
            [
                WebhookEvent(
                    event_id=str(uuid.uuid4()),
                    raw_type="payment.completed",
                    type="payment.completed",
                    body=body,
                    headers=headers,
                    verified_by="signature",
                    received_at=when,
                    occurred_at=when,
                    object_id=str(uuid.uuid4()),
                    state=EventState.PROCESSED.value,
                    outcome="applied",
                    attempts=1,
                    processed_at=when,
                )
                for _ in range(n)
            ],
            batch_size=2000,
        )
        missing -= n
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE billing_integration_webhookevent")


def start_pruner() -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            PRUNER,
            str(hooks.ROOT),
            str(BENCH_DIR),
            str(BATCH),
            str(PAUSE),
            str(MAX_BUSY),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "webhook_bench_site"},
    )
    require(proc.stdout.readline().strip() == "ready", "the prune process did not start")
    return proc


def main() -> int:
    hooks.prepare()
    print(f"seeding {ROWS:,} old processed deliveries (bulk_create) ...", flush=True)
    started = time.perf_counter()
    top_up(ROWS)
    print(f"  seeded in {time.perf_counter() - started:.1f}s", flush=True)
    port = hooks.free_port()
    server = hooks.start_gunicorn(port)
    prune_rates: list[float] = []

    def ingest(with_prune: bool) -> float:
        pruner = None
        if with_prune:
            top_up(ROWS)
            pruner = start_pruner()
            pruner.stdin.write("go\n")
            pruner.stdin.flush()
        before = old_count() if with_prune else 0
        started = time.perf_counter()
        r = hooks.load(port, "/billing/webhooks/", hooks.signed_requests(hooks.REQUESTS))
        elapsed = time.perf_counter() - started
        note = ""
        if pruner is not None:
            still_running = pruner.poll() is None
            pruner.terminate()
            pruner.wait(timeout=60)
            require(
                still_running,
                "the prune ran out of rows before the load ended: raise BENCH_PRUNE_ROWS",
            )
            deleted = before - old_count()
            prune_rates.append(deleted / elapsed)
            note = f", prune deleted {deleted:,} rows meanwhile ({deleted / elapsed:,.0f}/s)"
        require(set(r["codes"]) == {"200"}, f"non-200 answers: {r['codes']}")
        label = "ingest with prune   " if with_prune else "ingest without prune"
        print(f"{label}: {r['rate']:8.1f} req/s ({r['done']} in {r['elapsed']:.1f}s{note})")
        return r["rate"]

    try:
        hooks.load(port, "/billing/webhooks/", hooks.signed_requests(200))  # warm-up
        paired = alternate(
            hooks.ROUNDS,
            lambda: ingest(False),
            lambda: ingest(True),
            on_round=lambda i, f, t: print(f"round {i} ratio with/without: {t / f:.2f}x"),
        )
    except MeasurementFailed as exc:
        print(f"MEASUREMENT FAILED: {exc}")
        return 2
    finally:
        server.terminate()
        server.wait(timeout=30)
        try:  # do not leave the benchmark's messages for a worker to find
            from example_project.celery import app

            app.control.purge()
        except Exception as exc:
            print(f"(could not purge the Celery queue: {exc})")
    print(summary("ingest throughput with/without prune", paired, TARGET, at_least=True))
    print(
        f"  median rates: {statistics.median(paired.target):.1f} with, "
        f"{statistics.median(paired.floor):.1f} without req/s; prune "
        f"{statistics.median(prune_rates):,.0f} rows/s (median; batches of {BATCH}, "
        f"pause {PAUSE}s, busy at most {MAX_BUSY:g} of the time)"
    )
    return 0 if paired.median_ratio >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
