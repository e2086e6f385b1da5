"""Outbox drain vs raw POSTs, and token requests with 4 worker processes.

    python benchmarks/bench_outbox_drain.py [--n 1000]

The sandbox runs as a process of its own; the floor (raw POSTs with the same bodies from one
``requests.Session`` in this process) and the drain (a Celery worker process) are both its
clients. Werkzeug's server closes every connection after its answer, so both reconnect per
request. The drain's time runs from the commit of the 1,000 changes to the last entry done.
Prints ratios (targets: drain <= 1.25x the raw POSTs; exactly 1 token request per token
lifetime with 4 processes). Not a timed test: it only prints.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stack import Stack, wait


def make_customers(n: int, tag: str) -> float:
    """Create ``n`` customers in one transaction; return the time of its commit (the first
    on-commit callback, before those that publish the wake-up: the worker may start at once)."""
    from django.db import transaction

    from billing_integration.models import Customer

    committed: list[float] = []
    with transaction.atomic():
        transaction.on_commit(lambda: committed.append(time.perf_counter()))
        for i in range(n):
            Customer.objects.create(identifier=f"{tag}-{i}", first_name="B", last_name=str(i),
                                    email=f"{tag}{i}@example.com")
    return committed[0]


def drained() -> bool:
    from billing_integration.models import OutboxEntry

    return not OutboxEntry.objects.exclude(state="done").exists()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1000)
    args = parser.parse_args()
    stack = Stack("bench_drain", separate_sandbox=True).start()
    try:
        sandbox = stack.sandbox
        # Floor: raw POSTs to the same sandbox, same bodies, one session. The session skips the
        # environment's proxy settings, as the client does (trust_env=False); 50 warm-up POSTs.
        session = requests.Session()
        session.trust_env = False
        token = sandbox.token()
        url = sandbox.api_url + "/customers"
        for i in range(-50, args.n):
            if i == 0:
                t = time.perf_counter()
            session.post(url, json={"identifier": f"raw-{i}", "first_name": "B",
                                    "last_name": str(i), "email": f"raw{i}@example.com"},
                         headers={"x-kc-token": token, "x-idempotency-id": str(uuid.uuid4())},
                         timeout=30).raise_for_status()
        raw = time.perf_counter() - t

        stack.start_worker(concurrency=1)
        time.sleep(1.0)
        t0 = make_customers(args.n, "one")
        wait(drained, timeout=600, interval=0.05)
        drain = time.perf_counter() - t0

        # Tokens with 4 worker processes (prefork -c 4) after the cached token is dropped.
        for proc in stack.workers:
            proc.terminate()
            proc.wait()
        stack.workers.clear()
        from django.core.cache import cache

        cache.clear()
        sandbox.clear_requests()
        stack.start_worker(concurrency=4)
        time.sleep(1.0)
        t0 = make_customers(args.n, "four")
        wait(drained, timeout=600, interval=0.05)
        drain4 = time.perf_counter() - t0
        tokens = len(sandbox.requests(operation="token"))
        print(f"raw POSTs: {args.n} in {raw:.2f}s ({args.n / raw:.0f}/s)")
        print(f"outbox drain, 1 worker: {args.n} in {drain:.2f}s ({args.n / drain:.0f}/s)")
        print(f"ratio drain / raw: {drain / raw:.2f}x (target <= 1.25x)")
        print(f"outbox drain, 4 worker processes: {args.n} in {drain4:.2f}s")
        print(f"token requests during the 4-process drain (< 1 lifetime): {tokens} (target 1)")
    finally:
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
