"""Outbox drain vs raw POSTs, and token requests with 4 worker processes.

    .venv/bin/python benchmarks/bench_outbox_drain.py [--n 1000] [--rounds 5]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench \
        .venv/bin/python benchmarks/bench_outbox_drain.py      # PostgreSQL: <db>_bench_drain

The sandbox runs as a process of its own; the floor (``n`` raw POSTs with the same bodies from
one ``requests.Session`` in this process, set up as the client's) and the drain (``n``
customers committed in one transaction, one push task enqueued each, pushed by one Celery
worker process with concurrency 1, one entry per task)
are both its clients. Werkzeug's server closes every connection after its answer, so both
reconnect per request. The drain's time runs from the commit to the last entry done: the
``completed_at`` the worker stamps on it (not when this process's poll, every 50 ms, notices).
Rounds run the two back to back, the order flipped every round; the verdict is the median of
the paired round ratios (``benchmarks/_paired.py``; target: drain <= 1.5x the raw POSTs).
Then, once: exactly 1 token request per token lifetime while 4 worker processes drain ``n``
more. A drain that does not finish within ``--timeout`` seconds fails the run (exit status 1,
no figure); so does a missed target.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

import requests
from requests.adapters import HTTPAdapter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paired import alternate, require, summary
from _stack import Stack, wait

TARGET = 1.5


def make_customers(n: int, tag: str) -> float:
    """Create ``n`` customers in one transaction; return the time (``time.time()``) of its
    commit (the first on-commit callback, before those that enqueue the pushes)."""
    from django.db import transaction

    from billing_integration.models import Customer

    committed: list[float] = []
    with transaction.atomic():
        transaction.on_commit(lambda: committed.append(time.time()))
        for i in range(n):
            Customer.objects.create(
                identifier=f"{tag}-{i}",
                first_name="B",
                last_name=str(i),
                email=f"{tag}{i}@example.com",
            )
    return committed[0]


def drained() -> bool:
    """No entry left that is not done: asked through the indexes of the entries' states (the
    poll runs every 50 ms beside the drain; a scan of the table would compete with it)."""
    from billing_integration.models import OutboxEntry

    return not OutboxEntry.objects.filter(state__in=("pending", "in_progress", "failed")).exists()


def last_entry() -> int:
    from billing_integration.models import OutboxEntry

    return OutboxEntry.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


def drain_time(after: int, committed: float) -> float:
    """Seconds from the commit to the last entry above ``after`` done: its ``completed_at``,
    which the worker stamps (``time.time()``, this machine's clock) as it records the batch."""
    from django.db.models import Max

    from billing_integration.models import OutboxEntry

    done = OutboxEntry.objects.filter(pk__gt=after).aggregate(last=Max("completed_at"))["last"]
    require(done is not None, "no entry was done")
    return done.timestamp() - committed


def client_like_session() -> requests.Session:
    """A session set up as the client's (``billing_integration.client.client._new_session``):
    no proxy or netrc lookups from the environment, the same pool, no adapter retries."""
    session = requests.Session()
    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=32, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.trust_env = False
    return session


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per drain")
    args = parser.parse_args()
    # One call in flight, as the floor's one session: the drain's overhead, like for like
    # (benchmarks/bench_scale.py measures calls in flight together).
    stack = Stack("bench_drain", separate_sandbox=True).start()
    try:
        sandbox = stack.sandbox
        session = client_like_session()
        token = sandbox.token()
        url = sandbox.api_url + "/customers"
        raw_posts = iter(range(10**9))

        def post() -> None:
            i = next(raw_posts)
            session.post(
                url,
                json={
                    "identifier": f"raw-{i}",
                    "first_name": "B",
                    "last_name": str(i),
                    "email": f"raw{i}@example.com",
                },
                headers={"x-kc-token": token, "x-idempotency-id": str(uuid.uuid4())},
                timeout=30,
            ).raise_for_status()

        def raw_round() -> float:
            started = time.perf_counter()
            for _ in range(args.n):
                post()
            return time.perf_counter() - started

        drains = iter(range(10**9))

        def drain_round() -> float:
            after = last_entry()
            committed = make_customers(args.n, f"one{next(drains)}")
            require(
                wait(drained, timeout=args.timeout, interval=0.05),
                f"the drain of {args.n} entries did not finish within {args.timeout:g} s",
            )
            return drain_time(after, committed)

        for _ in range(50):  # warm-up: connections, the sandbox's code paths
            post()
        stack.start_worker(concurrency=1)
        time.sleep(1.0)
        paired = alternate(
            args.rounds,
            raw_round,
            drain_round,
            on_round=lambda i, f, t: print(
                f"  round {i}: raw POSTs {args.n / f:.0f}/s ({f:.2f} s), drain "
                f"{args.n / t:.0f}/s ({t:.2f} s), ratio {t / f:.2f}"
            ),
        )

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
        after = last_entry()
        committed = make_customers(args.n, "four")
        require(
            wait(drained, timeout=args.timeout, interval=0.05),
            f"the 4-process drain of {args.n} entries did not finish within {args.timeout:g} s",
        )
        drain4 = drain_time(after, committed)
        tokens = len(sandbox.requests(operation="token"))
        print(
            f"{args.rounds} alternating rounds of {args.n} raw POSTs and {args.n} drained "
            "entries (1 worker)"
        )
        print(summary("drain/raw", paired, TARGET))
        print(f"outbox drain, 4 worker processes: {args.n} in {drain4:.2f}s")
        print(f"token requests during the 4-process drain (< 1 lifetime): {tokens} (target 1)")
    finally:
        stack.stop()
    return 0 if paired.median_ratio <= TARGET and tokens == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
