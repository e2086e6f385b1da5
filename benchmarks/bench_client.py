"""Client overhead: 1,000 product creations through ``BillingClient`` vs 1,000 raw POSTs
with one ``requests.Session`` against the same sandbox process, in the same run (the sandbox's
Werkzeug server closes each connection after answering, so both paths reconnect per request).

Target (issue 2): ratio <= 1.10, judged on the median of the paired round ratios
(``benchmarks/_paired.py``: both paths back to back in each round, the order flipped every
round). Exit status 1 when the target is missed.

    .venv/bin/python benchmarks/bench_client.py [--n 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import django
import requests

from benchmarks._paired import alternate, summary
from benchmarks.sandbox_process import sandbox_process

TARGET = 1.10

PRODUCT = {
    "status": "draft",
    "name": "Bench",
    "description": "benchmark product",
    "selected_currencies": ["1"],
    "subscription_blueprint": {
        "billing_type": "flat-rate",
        "billing_cycles": [
            {"cycle": "months", "frequency": 1, "prices": [{"currency": 1, "amount": 1000}]}
        ],
    },
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    per_round = max(1, args.n // args.rounds)

    with sandbox_process() as env:
        os.environ.update(env)
        os.environ["CACHE_URL"] = "locmemcache://"
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
        django.setup()
        from billing_integration.client import get_client

        client = get_client()
        token_url = client.token_url
        raw = requests.Session()
        raw.trust_env = False  # as the client's session: no per-request proxy/netrc lookups
        token = raw.post(
            token_url,
            data={
                "grant_type": "client_credentials",
                "client_id": env["BILLING_CLIENT_ID"],
                "client_secret": env["BILLING_CLIENT_SECRET"],
            },
            timeout=10,
        ).json()["access_token"]
        url = env["BILLING_BASE_URL"] + "/v1/api/billing/products"
        body = json.dumps(PRODUCT, separators=(",", ":"))

        def raw_round() -> float:
            started = time.perf_counter()
            for _ in range(per_round):
                response = raw.post(
                    url,
                    data=body,
                    headers={
                        "Accept": "application/json",
                        "Content-Type": "application/json",
                        "x-kc-token": token,
                        "x-idempotency-id": str(uuid.uuid4()),
                    },
                    timeout=30,
                )
                response.raise_for_status()
                response.json()["data"]
            return time.perf_counter() - started

        def client_round() -> float:
            started = time.perf_counter()
            for _ in range(per_round):
                client.create_product(PRODUCT)
            return time.perf_counter() - started

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

    total = per_round * args.rounds
    print(f"product creations per path: {total} ({args.rounds} alternating rounds of {per_round})")
    print(summary("client/raw", paired, TARGET))
    return 0 if paired.median_ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
