"""Benchmark of the reporting dashboard on PostgreSQL (prints time and query count).

    .venv/bin/python benchmarks/bench_reporting.py [--subscriptions 100000] [--payments 1000000]
                                                   [--runs 5] [--keep] [--reuse]

Creates a dedicated database ``billing_bench_reporting`` on the server of ``DATABASE_URL``
(default postgres://postgres@127.0.0.1:5432/test), migrates it, bulk-loads products,
customers, subscriptions, payments, refunds and invoices with COPY, runs ANALYZE, then times
``build_report()`` (the dashboard's queries) and the whole admin page, and prints the query
count against the target (constant; page under 1 s). The database is dropped at the end
unless ``--keep``. ``--reuse`` skips the load when a kept database is there (migrating it
first, so new indexes get built on the existing rows). ``BENCH_EXPLAIN=1`` prints
``EXPLAIN (ANALYZE, BUFFERS)`` of every query of the page, ``BENCH_SQL=1`` their times.
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import uuid
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "billing_bench_reporting"
SERVER_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
TARGET_SECONDS = 1.0


def with_db(url: str, name: str) -> str:
    return urlunparse(urlparse(url)._replace(path=f"/{name}"))


def admin_conn():
    import psycopg

    return psycopg.connect(with_db(SERVER_URL, "postgres"), autocommit=True)


def create_database() -> None:
    with admin_conn() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}"')
        conn.execute(f'CREATE DATABASE "{DB_NAME}"')


def database_exists() -> bool:
    with admin_conn() as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,))
        return row.fetchone() is not None


def drop_database() -> None:
    from django.db import connections

    connections.close_all()
    with admin_conn() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')


def setup_django() -> None:
    os.environ["DATABASE_URL"] = with_db(SERVER_URL, DB_NAME)
    os.environ.setdefault("CACHE_URL", "locmemcache://")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def copy_rows(model, rows) -> int:
    """COPY ``rows`` (dicts of column values) into ``model``'s table; missing columns get
    the field default. Returns the number of rows."""
    from django.db import connection

    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    defaults = {f.column: f.get_default() for f in fields}
    columns = [f.column for f in fields]
    count = 0
    with connection.cursor() as cursor:
        raw = cursor.cursor
        sql = f'COPY "{model._meta.db_table}" ({", ".join(columns)}) FROM STDIN'
        with raw.copy(sql) as copy:
            for row in rows:
                copy.write_row([row.get(c, defaults[c]) for c in columns])
                count += 1
    return count


def load(n_subs: int, n_payments: int, seed: int = 7) -> dict[str, int]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from billing_integration.models import (
        BillingCycle,
        Customer,
        Invoice,
        Payment,
        Price,
        Product,
        Refund,
        Subscription,
    )

    rnd = random.Random(seed)
    now = timezone.now()
    products = Product.objects.bulk_create(
        [
            Product(name=f"Plan {i}", status="published", selected_currencies=[1, 2])
            for i in range(5)
        ]
    )
    cycles = [
        ("months", 1, Decimal("5000")),
        ("months", 3, Decimal("14000")),
        ("years", 1, Decimal("54000")),
    ]
    for p in products:
        for unit, freq, xof in cycles:
            c = BillingCycle.objects.bulk_create(
                [BillingCycle(product=p, unit=unit, frequency=freq)]
            )[0]
            Price.objects.bulk_create(
                [
                    Price(cycle=c, currency_id=1, amount=xof),
                    Price(cycle=c, currency_id=2, amount=xof / 500),
                ]
            )
    n_customers = max(n_subs // 5, 1)
    customer_ids = [uuid.uuid4() for _ in range(n_customers)]
    copy_rows(
        Customer,
        (
            {
                "identifier": f"cust-{i}",
                "remote_id": rid,
                "created_at": now,
                "updated_at": now,
                "email": f"c{i}@example.com",
            }
            for i, rid in enumerate(customer_ids)
        ),
    )
    customer_pk = dict(Customer.objects.values_list("remote_id", "pk"))
    cust_pks = [customer_pk[r] for r in customer_ids]
    product_pks = [p.pk for p in products]

    def sub_rows():
        for _ in range(n_subs):
            start = now - timedelta(days=rnd.uniform(0, 1100))
            unit, freq, _price = rnd.choices(cycles, weights=(60, 15, 25))[0]
            months = freq * (12 if unit == "years" else 1)
            canceled = rnd.random() < 0.2
            trial = rnd.random() < 0.1
            ended = start + timedelta(days=rnd.uniform(1, max((now - start).days, 2)))
            period_days = 30 * months
            cycles_done = int((now - start).days // period_days) + 1
            yield {
                "product_id": rnd.choice(product_pks),
                "customer_id": rnd.choice(cust_pks),
                "remote_id": uuid.uuid4(),
                "remote_created": start,
                "remote_updated": ended if canceled else None,
                "status": "canceled" if canceled else "published",
                "selected_billing_cycle": f"{unit}-{freq}",
                "selected_currency": "XOF" if rnd.random() < 0.7 else "USD",
                "cycle_start_date": start,
                "cycle_end_date": start + timedelta(days=period_days * cycles_done)
                if rnd.random() < 0.95
                else start + timedelta(days=period_days),
                "trial_end_date": start + timedelta(days=14) if trial else None,
                "last_payment_status": "failed" if rnd.random() < 0.05 else "completed",
                "created_at": start,
                "updated_at": ended if canceled else start,
                "sync_state": "synced",
            }

    counts = {"subscriptions": copy_rows(Subscription, sub_rows())}
    subs = list(
        Subscription.objects.values_list("pk", "customer_id", "product_id", "selected_currency")
    )

    def payment_rows():
        for _ in range(n_payments):
            pk, cust, prod, cur = subs[rnd.randrange(len(subs))]
            r = rnd.random()
            status = "completed" if r < 0.85 else "failed" if r < 0.97 else "canceled"
            at = now - timedelta(days=rnd.uniform(0, 730))
            yield {
                "remote_id": uuid.uuid4(),
                "status": status,
                "amount": Decimal(rnd.choice((5000, 14000, 54000, 10, 28, 108))),
                "currency": cur,
                "customer_id": cust,
                "subscription_id": pk,
                "product_id": prod,
                "remote_created": at,
                "remote_updated": at,
                "created_at": at,
                "updated_at": at,
            }

    counts["payments"] = copy_rows(Payment, payment_rows())
    payments = list(
        Payment.objects.filter(status="completed")
        .order_by("?")
        .values_list("pk", "customer_id", "subscription_id", "currency", "amount")[
            : max(n_payments // 50, 1)
        ]
    )
    counts["refunds"] = copy_rows(
        Refund,
        (
            {
                "remote_id": uuid.uuid4(),
                "status": rnd.choice(("approved", "initiated", "rejected")),
                "amount": amount,
                "currency": cur,
                "customer_id": cust,
                "subscription_id": sub,
                "payment_id": pk,
                "remote_created": now - timedelta(days=rnd.uniform(0, 700)),
                "created_at": now,
                "updated_at": now,
            }
            for pk, cust, sub, cur, amount in payments
        ),
    )
    counts["invoices"] = copy_rows(
        Invoice,
        (
            {
                "remote_id": uuid.uuid4(),
                "status": rnd.choices(("paid", "uncollectable", "open", "void"), (90, 3, 4, 3))[0],
                "amount": Decimal(5000),
                "currency": cur,
                "customer_id": cust,
                "product_id": prod,
                "subscription_id": pk,
                "remote_created": now - timedelta(days=rnd.uniform(0, 700)),
                "created_at": now,
                "updated_at": now,
            }
            for pk, cust, prod, cur in subs[: max(n_subs // 5, 1)]
        ),
    )
    counts["customers"] = n_customers
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    get_user_model().objects.create_superuser("bench", "bench@example.com", "pw")
    return counts


def measure(runs: int) -> None:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    from billing_integration.reporting.report import Period, build_report

    def timed(fn, label: str) -> None:
        fn()  # warm-up (connection, caches, plans)
        times, queries = [], []
        for _ in range(runs):
            with CaptureQueriesContext(connection) as ctx:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            queries.append(len(ctx.captured_queries))
        best, median = min(times), statistics.median(times)
        verdict = "OK" if median < TARGET_SECONDS else "OVER TARGET"
        print(
            f"{label:<44} median {median * 1000:7.1f} ms  best {best * 1000:7.1f} ms  "
            f"queries {sorted(set(queries))}  [{verdict}: target < {TARGET_SECONDS:g} s]"
        )
        return ctx

    timed(lambda: build_report(Period()), "build_report (12 months, all)")
    timed(lambda: build_report(Period(currency="XOF")), "build_report (12 months, XOF)")
    timed(lambda: build_report(Period(months=36)), "build_report (36 months, all)")
    client = Client()
    client.force_login(get_user_model().objects.get(username="bench"))
    url = reverse("admin:billing_integration_report_changelist")

    def page() -> None:
        assert client.get(url).status_code == 200

    ctx = timed(page, "admin dashboard page (GET, full render)")
    if os.environ.get("BENCH_SQL"):
        for q in ctx.captured_queries:
            print(f"  {q['time']}s  {q['sql'][:160]}")
    if os.environ.get("BENCH_EXPLAIN"):
        with connection.cursor() as cursor:
            for q in ctx.captured_queries:
                if not q["sql"].lstrip().upper().startswith("SELECT"):
                    continue
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + q["sql"])
                print(f"\n--- {q['time']}s  {q['sql'][:300]}")
                print("\n".join(r[0] for r in cursor.fetchall()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscriptions", type=int, default=100_000)
    parser.add_argument("--payments", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="use the kept database as it is (no reload); implies --keep",
    )
    args = parser.parse_args()

    reuse = args.reuse and database_exists()
    if args.reuse:
        args.keep = True
    if not reuse:
        create_database()
    setup_django()
    try:
        from django.core.management import call_command

        t0 = time.perf_counter()
        call_command("migrate", verbosity=0)
        if reuse:
            from django.db import connection

            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE")
            print(f"reused database {DB_NAME} (migrate + ANALYZE {time.perf_counter() - t0:.1f} s)")
        else:
            counts = load(args.subscriptions, args.payments)
            print(f"loaded {counts} in {time.perf_counter() - t0:.1f} s into database {DB_NAME}")
        measure(args.runs)
    finally:
        if not args.keep:
            drop_database()


if __name__ == "__main__":
    main()
