"""Benchmark of the reporting dashboard on PostgreSQL (prints time and query count).

    .venv/bin/python benchmarks/bench_reporting.py [--subscriptions 100000] [--payments 1000000]
                                                   [--sizes S:P,S:P] [--runs 5] [--keep] [--reuse]

Creates a dedicated database ``billing_bench_reporting`` (``BENCH_REPORTING_DB`` names
another) on the server of ``DATABASE_URL`` (default postgres://postgres@127.0.0.1:5432/test),
migrates it, and generates products, customers, subscriptions, payments, refunds and invoices
in the database (``INSERT ... SELECT`` over ``generate_series``, the payments in two parallel
parts, the secondary indexes dropped before and built after, two at a time), runs ANALYZE,
rebuilds the reporting rollups from the loaded rows (prints the time and Python's memory
peak), then times ``build_report()`` and the whole admin page, and prints the query count
against the target (constant; page under 1 s). ``--sizes 100000:1000000,1000000:10000000``
does all of it for each size in turn and prints the page time of the last against the first
(target: at most 1.5x). The database is dropped at the end unless ``--keep``. ``--reuse``
skips the load when a kept database is there (migrating it first, so new indexes get built on
the existing rows). ``BENCH_EXPLAIN=1`` prints ``EXPLAIN (ANALYZE, BUFFERS)`` of every query
of the page, ``BENCH_SQL=1`` their times. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = os.environ.get("BENCH_REPORTING_DB", "billing_bench_reporting")
SERVER_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
TARGET_SECONDS = 1.0
RATIO_TARGET = 1.5


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


def insert_select(model, n_rows: int, exprs: dict[str, str], source: str = "") -> tuple[str, list]:
    """``INSERT INTO`` ``model``'s table ``SELECT`` ``exprs`` (SQL by column) over
    ``generate_series(1, n_rows)`` as ``g`` with a few ``random()`` columns (``r1`` .. ``r8``),
    joined to ``source``; a NOT NULL column not in ``exprs`` gets the field default. Returns
    the statement and its parameters."""
    from django.db import connection

    columns, values, params = [], [], []
    for f in model._meta.concrete_fields:
        if f.primary_key:
            continue
        if f.column in exprs:
            columns.append(f.column)
            values.append(exprs[f.column])
        elif not f.null:
            columns.append(f.column)
            values.append("%s")
            params.append(f.get_db_prep_save(f.get_default(), connection))
    randoms = ", ".join(f"random() AS r{i}" for i in range(1, 9))
    sql = (
        f'INSERT INTO "{model._meta.db_table}" ({", ".join(columns)}) '
        f"SELECT {', '.join(values)} FROM (SELECT g, {randoms} FROM generate_series(1, %s) g) s "
        f"{source}"
    )
    return sql, [*params, n_rows]


def without_indexes(cursor, tables: list[str]) -> list[str]:
    """Drop the secondary indexes and unique constraints of ``tables`` (a bulk load then
    builds each index once, in parallel); returns the statements that rebuild them."""
    rebuild = []
    for table in tables:
        cursor.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = %s::regclass AND contype = 'u'",
            [table],
        )
        constraints = cursor.fetchall()
        for name, definition in constraints:
            cursor.execute(f'ALTER TABLE "{table}" DROP CONSTRAINT "{name}"')
            rebuild.append(f'ALTER TABLE "{table}" ADD CONSTRAINT "{name}" {definition}')
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s AND indexname "
            "NOT IN (SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass)",
            [table, table],
        )
        for name, definition in cursor.fetchall():
            cursor.execute(f'DROP INDEX "{name}"')
            rebuild.append(definition)
    return rebuild


def in_parallel(statements: list[list[Any]]) -> None:
    """Run each list of statements on its own connection, the lists at the same time."""
    import threading

    import psycopg

    url = with_db(SERVER_URL, DB_NAME)
    errors: list[BaseException] = []

    def run(batch: list[str]) -> None:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("SET session_replication_role = replica")  # no FK triggers
                conn.execute("SET maintenance_work_mem = '512MB'")
                for sql in batch:
                    conn.execute(*(sql if isinstance(sql, tuple) else (sql,)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(b,)) for b in statements if b]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def load(n_subs: int, n_payments: int, workers: int = 2) -> dict[str, int]:
    """Generate the rows in the database (``INSERT ... SELECT`` over ``generate_series``: no
    row goes through Python), the payments in ``workers`` parallel parts, with the secondary
    indexes dropped and built once afterwards (two at a time)."""
    from django.contrib.auth import get_user_model
    from django.db import connection

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
    product_array = "ARRAY[" + ", ".join(str(p.pk) for p in products) + "]"
    tables = [m._meta.db_table for m in (Customer, Subscription, Payment, Refund, Invoice)]
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        rebuild = without_indexes(cursor, tables)
        cursor.execute(
            *insert_select(
                Customer,
                n_customers,
                {
                    "identifier": "'cust-' || g",
                    "remote_id": "gen_random_uuid()",
                    "email": "'c' || g || '@example.com'",
                    "created_at": "now()",
                    "updated_at": "now()",
                },
            )
        )
        cursor.execute(f'SELECT min(id) FROM "{Customer._meta.db_table}"')
        first_customer = cursor.fetchone()[0]
        # the shape of the rows of the Python generator this replaced: starts over 1,100
        # days, 60/15/25 % monthly/quarterly/yearly, 20 % canceled, 10 % with a 14-day trial
        days = "(CASE WHEN r4 < 0.6 THEN 30 WHEN r4 < 0.75 THEN 90 ELSE 360 END)"
        start = "(now() - r1 * interval '1100 days')"
        age = "(r1 * 1100)"
        ended = f"({start} + (1 + r8 * greatest({age} - 1, 1)) * interval '1 day')"
        cursor.execute(
            *insert_select(
                Subscription,
                n_subs,
                {
                    "product_id": f"({product_array})[1 + floor(r2 * 5)::int]",
                    "customer_id": f"{first_customer} + floor(r3 * {n_customers})::int",
                    "remote_id": "gen_random_uuid()",
                    "remote_created": start,
                    "remote_updated": f"CASE WHEN r5 < 0.2 THEN {ended} END",
                    "status": "CASE WHEN r5 < 0.2 THEN 'canceled' ELSE 'published' END",
                    "selected_billing_cycle": "CASE WHEN r4 < 0.6 THEN 'months-1' "
                    "WHEN r4 < 0.75 THEN 'months-3' ELSE 'years-1' END",
                    "selected_currency": "CASE WHEN r7 < 0.7 THEN 'XOF' ELSE 'USD' END",
                    "cycle_start_date": start,
                    "cycle_end_date": f"{start} + {days} * interval '1 day' * "
                    f"CASE WHEN g %% 20 = 0 THEN 1 ELSE floor({age} / {days}) + 1 END",
                    "trial_end_date": f"CASE WHEN r6 < 0.1 THEN {start} + interval '14 days' END",
                    "last_payment_status": "CASE WHEN g %% 20 = 1 THEN 'failed' "
                    "ELSE 'completed' END",
                    "created_at": start,
                    "updated_at": f"CASE WHEN r5 < 0.2 THEN {ended} ELSE {start} END",
                    "sync_state": "'synced'",
                },
            )
        )
        cursor.execute(f'SELECT min(id), max(id) FROM "{Subscription._meta.db_table}"')
        first_sub, last_sub = cursor.fetchone()
    connection.close()  # the payments go through connections of their own

    def payments_sql(n: int, seed: int) -> tuple[str, list]:
        at = "(now() - r1 * interval '730 days')"
        exprs = {
            "remote_id": "gen_random_uuid()",
            "status": "CASE WHEN r2 < 0.85 THEN 'completed' WHEN r2 < 0.97 THEN 'failed' "
            "ELSE 'canceled' END",
            "amount": "(ARRAY[5000, 14000, 54000, 10, 28, 108])[1 + floor(r3 * 6)::int]",
            "currency": "sub.selected_currency",
            "customer_id": "sub.customer_id",
            "subscription_id": "sub.id",
            "product_id": "sub.product_id",
            "remote_created": at,
            "remote_updated": at,
            "created_at": at,
            "updated_at": at,
        }
        return insert_select(
            Payment,
            n,
            exprs,
            f'JOIN "{Subscription._meta.db_table}" sub ON sub.id = '
            f"{first_sub} + ((g::bigint * 7919 + {seed}) %% {last_sub - first_sub + 1})",
        )

    parts = [n_payments // workers + (i < n_payments % workers) for i in range(workers)]
    in_parallel([[payments_sql(n, i * 104729)] for i, n in enumerate(parts)])
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        refunds = {
            "remote_id": "gen_random_uuid()",
            "status": "(ARRAY['approved', 'initiated', 'rejected'])[1 + floor(r1 * 3)::int]",
            "amount": "p.amount",
            "currency": "p.currency",
            "customer_id": "p.customer_id",
            "subscription_id": "p.subscription_id",
            "payment_id": "p.id",
            "remote_created": "now() - r2 * interval '700 days'",
            "created_at": "now()",
            "updated_at": "now()",
        }
        first_payment = Payment.objects.order_by("pk").values_list("pk", flat=True).first()
        cursor.execute(
            *insert_select(
                Refund,
                max(n_payments // 50, 1),
                refunds,
                f'JOIN "{Payment._meta.db_table}" p ON p.id = {first_payment} + (g - 1) * 50',
            )
        )
        invoices = {
            "remote_id": "gen_random_uuid()",
            "status": "CASE WHEN r1 < 0.9 THEN 'paid' WHEN r1 < 0.93 THEN 'uncollectable' "
            "WHEN r1 < 0.97 THEN 'open' ELSE 'void' END",
            "amount": "5000",
            "currency": "sub.selected_currency",
            "customer_id": "sub.customer_id",
            "product_id": "sub.product_id",
            "subscription_id": "sub.id",
            "remote_created": "now() - r2 * interval '700 days'",
            "created_at": "now()",
            "updated_at": "now()",
        }
        cursor.execute(
            *insert_select(
                Invoice,
                max(n_subs // 5, 1),
                invoices,
                f'JOIN "{Subscription._meta.db_table}" sub ON sub.id = {first_sub} + g - 1',
            )
        )
    connection.close()
    in_parallel([rebuild[0::2], rebuild[1::2]])
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    get_user_model().objects.create_superuser("bench", "bench@example.com", "pw")
    return {
        "customers": n_customers,
        "subscriptions": n_subs,
        "payments": n_payments,
        "refunds": max(n_payments // 50, 1),
        "invoices": max(n_subs // 5, 1),
    }


def rebuild_rollups() -> None:
    """Rebuild every month of the rollups from the loaded rows; prints the time and the peak
    of Python memory (constant: the batches keep per-month sums, not rows)."""
    import tracemalloc

    from billing_integration.reporting.rollups import rebuild

    tracemalloc.start()
    t0 = time.perf_counter()
    done = rebuild()
    elapsed = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert done is not None
    from django.db import connection

    with connection.cursor() as cursor:  # as autovacuum would after such a change
        cursor.execute(
            "ANALYZE billing_integration_reportmonth, billing_integration_reportcustomer"
        )
    print(
        f"rollups rebuilt: {done.months} months in {elapsed:.1f} s, "
        f"Python memory peak {peak / 2**20:.1f} MiB"
    )


def measure(runs: int) -> dict[str, tuple[float, list[int]]]:
    """Time the report and the page; returns ``{label: (median seconds, query counts)}``."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    from billing_integration.reporting.report import Period, build_report

    results: dict[str, tuple[float, list[int]]] = {}

    def timed(fn, label: str):
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
        results[label] = (median, sorted(set(queries)))
        return ctx

    timed(lambda: build_report(Period()), "build_report (12 months, all)")
    timed(lambda: build_report(Period(currency="XOF")), "build_report (12 months, XOF)")
    timed(lambda: build_report(Period(months=36)), "build_report (36 months, all)")
    client = Client()
    client.force_login(get_user_model().objects.get(username="bench"))
    url = reverse("admin:billing_integration_report_changelist")

    def page() -> None:
        assert client.get(url).status_code == 200

    ctx = timed(page, PAGE)
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
    return results


PAGE = "admin dashboard page (GET, full render)"


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """``"100000:1000000,1000000:10000000"``: (subscriptions, payments) pairs."""
    return [(int(a), int(b)) for a, b in (part.split(":") for part in text.split(","))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscriptions", type=int, default=100_000)
    parser.add_argument("--payments", type=int, default=1_000_000)
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        help="several SUBSCRIPTIONS:PAYMENTS sizes measured one after the other in this run, "
        "e.g. 100000:1000000,1000000:10000000; prints the page time ratio of the last to the "
        f"first (target <= {RATIO_TARGET:g})",
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="use the kept database as it is (no reload); implies --keep",
    )
    args = parser.parse_args()
    sizes = args.sizes or [(args.subscriptions, args.payments)]

    reuse = args.reuse and database_exists() and len(sizes) == 1
    if args.reuse:
        args.keep = True
    pages: list[tuple[tuple[int, int], float, list[int]]] = []
    try:
        for i, (n_subs, n_payments) in enumerate(sizes):
            if not reuse:
                if i:
                    drop_database()
                create_database()
            if i == 0:
                setup_django()
            from django.core.management import call_command

            t0 = time.perf_counter()
            call_command("migrate", verbosity=0)
            if reuse:
                from django.db import connection

                with connection.cursor() as cursor:
                    cursor.execute("VACUUM ANALYZE")
                print(
                    f"reused database {DB_NAME} (migrate + ANALYZE "
                    f"{time.perf_counter() - t0:.1f} s)"
                )
            else:
                counts = load(n_subs, n_payments)
                print(f"loaded {counts} in {time.perf_counter() - t0:.1f} s into {DB_NAME}")
            rebuild_rollups()
            page_median, page_queries = measure(args.runs)[PAGE]
            pages.append(((n_subs, n_payments), page_median, page_queries))
        if len(pages) > 1:
            (small, t_small, q_small), (large, t_large, q_large) = pages[0], pages[-1]
            ratio = t_large / t_small
            print(
                f"page {small[0]:,}/{small[1]:,}: {t_small * 1000:.1f} ms, "
                f"{large[0]:,}/{large[1]:,}: {t_large * 1000:.1f} ms; ratio {ratio:.2f} "
                f"[{'OK' if ratio <= RATIO_TARGET else 'OVER TARGET'}: target <= "
                f"{RATIO_TARGET:g}]; queries {q_small} / {q_large} "
                f"[{'constant' if q_small == q_large else 'NOT CONSTANT'}]"
            )
    finally:
        if not args.keep:
            drop_database()


if __name__ == "__main__":
    main()
