"""Client overhead: product creations through ``BillingClient`` vs raw POSTs from one
``requests.Session``, against the same sandbox process, in paired rounds (the order flipped
every round). Target: median round ratio <= 1.10; exit status 1 when missed.

    .venv/bin/python benchmarks/bench_client.py [--n 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import django
import requests

from benchmarks._paired import alternate, summary
from benchmarks.sandbox_process import sandbox_process

TARGET = 1.10
CYCLE = {"cycle": "months", "frequency": 1, "prices": [{"currency": 1, "amount": 1000}]}
BLUEPRINT = {"billing_type": "flat-rate", "billing_cycles": [CYCLE]}
PRODUCT = {"status": "draft", "name": "Bench", "description": "benchmark product"}
PRODUCT |= {"selected_currencies": ["1"], "subscription_blueprint": BLUEPRINT}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    per_round = max(1, args.n // args.rounds)
    with sandbox_process() as env:
        os.environ.update(env, CACHE_URL="locmemcache://")
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
        django.setup()
        from billing_integration.client import get_client

        client = get_client()
        raw = requests.Session()
        raw.trust_env = False  # as the client's session
        form = {"grant_type": "client_credentials", "client_id": env["BILLING_CLIENT_ID"]}
        form["client_secret"] = env["BILLING_CLIENT_SECRET"]
        token = raw.post(client.token_url, data=form, timeout=10).json()["access_token"]
        url = env["BILLING_BASE_URL"] + "/v1/api/billing/products"
        body = json.dumps(PRODUCT, separators=(",", ":"))
        headers = {"Accept": "application/json", "Content-Type": "application/json"}

        def raw_post() -> None:
            key = {"x-kc-token": token, "x-idempotency-id": str(uuid.uuid4())}
            response = raw.post(url, data=body, headers=headers | key, timeout=30)
            response.raise_for_status()
            response.json()["data"]

        def timed(call: Callable[[], object]) -> Callable[[], float]:
            def run() -> float:
                started = time.perf_counter()
                for _ in range(per_round):
                    call()
                return time.perf_counter() - started

            return run

        raw_round, client_round = timed(raw_post), timed(lambda: client.create_product(PRODUCT))
        client_round(), raw_round()  # warm up both paths (token, connections)
        paired = alternate(
            args.rounds,
            raw_round,
            client_round,
            on_round=lambda i, f, t: print(
                f"  round {i}: raw {f / per_round * 1000:.2f} ms/call, "
                f"client {t / per_round * 1000:.2f} ms/call, ratio {t / f:.3f}"
            ),
        )
    print(f"product creations per path: {per_round * args.rounds} ({args.rounds} rounds)")
    print(summary("client/raw", paired, TARGET))
    return 0 if paired.median_ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
