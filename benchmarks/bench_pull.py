"""Pull of 10,000 customers and 10,000 subscriptions from a sandbox process (issue 4).

Target: ``pull_customers()`` + ``pull_subscriptions()`` on an empty mirror take <= 1.5x the
floor, the raw paged fetch of the same lists (one ``requests.Session``, the same
page size as the client) plus one ``bulk_create`` per table of the same rows with the same
column values as the pull stores (the JSON values as they are, ``remote_data`` included;
subscriptions linked to their customer and product), without the pull's mapping, checks,
lookups of known rows or per-write transactions. (Until 2026-11-25 the floor stored the ids
only, every other column left to its default: a pull storing the full rows could not come
near it whatever its code.)
Also prints the SQL queries of the pull (and per page) and its peak memory.

    .venv/bin/python benchmarks/bench_pull.py [--customers 10000] [--subscriptions 10000]
                                              [--rounds 3]

Database: ``DATABASE_URL``. Unset: a temporary SQLite file (removed afterwards). A
``postgres://`` URL: the database it names is created and dropped by the script, so its name
must start with ``bench`` (e.g. ``postgres://postgres@127.0.0.1:5432/bench_pull``). A
``sqlite://`` URL is used as given and must hold an empty mirror. Migrations run
programmatically. Rounds alternate the two paths back to back, the order flipped every round
(the pull first in round 1, so ``ru_maxrss`` after the first pull is the pull's own peak);
the verdict is the median of the paired round ratios (``benchmarks/_paired.py``), and the
exit status is 1 when the target is missed. The floor's session is set up as the client's
(no proxy or netrc lookups from the environment, the same connection pool). The query count
and the ``tracemalloc`` peak come from two extra, untimed pulls (both instruments slow the
code they watch).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests
from requests.adapters import HTTPAdapter

from benchmarks._paired import alternate, require, summary
from benchmarks.sandbox_process import sandbox_process

TARGET = 1.5


# --- database ----------------------------------------------------------------------------------
@contextmanager
def bench_database(url: str) -> Iterator[str]:
    """Yield the ``DATABASE_URL`` to use; create/drop a PostgreSQL ``bench*`` database or a
    temporary SQLite file around the run."""
    if not url:
        tmp = Path(tempfile.mkdtemp(prefix="bench-pull-"))
        try:
            yield f"sqlite:///{tmp / 'db.sqlite3'}"
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    if url.startswith(("postgres://", "postgresql://", "pgsql://")):
        parts = urlsplit(url)
        dbname = parts.path.lstrip("/")
        if not dbname.startswith("bench"):
            raise SystemExit(
                f"refusing to create/drop database {dbname!r}: its name must start with 'bench'"
            )
        import psycopg

        admin = urlunsplit(parts._replace(scheme="postgresql", path="/postgres"))
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{dbname}"')
        try:
            yield url
        finally:
            from django.db import connections

            connections.close_all()
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        return
    yield url  # another URL (e.g. an SQLite file): used as given, must be an empty mirror


def empty_mirror() -> None:
    from billing_integration.models import Customer, Subscription

    Subscription.objects.all().delete()
    Customer.objects.all().delete()


# --- the two paths -----------------------------------------------------------------------------
class Floor:
    """Raw paged GETs with one session, then one ``bulk_create`` per table of the rows the
    pull stores."""

    def __init__(self, base_url: str, token: str, page_size: int) -> None:
        # As the client's session (billing_integration.client.client._new_session).
        self.session = requests.Session()
        adapter = HTTPAdapter(pool_connections=4, pool_maxsize=32, max_retries=0)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.session.trust_env = False
        self.base_url = base_url + "/v1/api/billing"
        self.headers = {"Accept": "application/json", "x-kc-token": token}
        self.page_size = page_size
        self.pages = 0

    def fetch(self, resource_name: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        offset = 0
        while True:
            response = self.session.get(
                f"{self.base_url}/{resource_name}",
                params={"limit": self.page_size, "offset": offset},
                headers=self.headers,
                timeout=30,
            )
            response.raise_for_status()
            page = response.json()["data"]
            self.pages += 1
            items.extend(page)
            if len(page) < self.page_size:
                return items
            offset += len(page)

    def __call__(self) -> tuple[int, int]:
        from django.utils import timezone

        from billing_integration.models import Customer, Product, Subscription

        customers = self.fetch("customers")
        subscriptions = self.fetch("subscriptions")
        # The rows the pull stores, column for column, the JSON values passed as they are
        # (Django converts the ids and timestamps); subscriptions linked to the customers
        # just inserted (their ids come back from the insert) and to the products by one query.
        now = timezone.now()
        synced = {"sync_state": "synced", "last_synced_at": now}
        created = Customer.objects.bulk_create(
            [Customer(**_meta(c), **_columns(c, CUSTOMER_COLUMNS), **synced) for c in customers]
        )
        customer_pks = {str(c.remote_id): c.pk for c in created}
        product_pks = {str(r): pk for r, pk in Product.objects.values_list("remote_id", "pk")}
        Subscription.objects.bulk_create(
            [
                Subscription(
                    **_meta(s),
                    **_columns(s, SUBSCRIPTION_COLUMNS),
                    product_remote_id=s["product"],
                    customer_remote_id=s["customer"],
                    product_id=product_pks.get(s["product"]),
                    customer_id=customer_pks.get(s["customer"]),
                    **synced,
                )
                for s in subscriptions
            ]
        )
        return len(customers), len(subscriptions)


#: The columns the pull fills from the JSON field of the same name.
CUSTOMER_COLUMNS = ("identifier", "first_name", "last_name", "email", "status")
CUSTOMER_COLUMNS += ("address_line_1", "address_line_2", "phone")
SUBSCRIPTION_COLUMNS = ("status", "cycle_start_date", "cycle_end_date", "next_billing_date")
SUBSCRIPTION_COLUMNS += ("trial_end_date", "auto_renew", "selected_billing_cycle")
SUBSCRIPTION_COLUMNS += ("selected_currency", "discount_coupon")


def _meta(data: dict[str, Any]) -> dict[str, Any]:
    """The ``RemoteObject`` columns the pull fills, straight from the JSON."""
    return {
        "remote_id": data["id"],
        "remote_created": data["date_created"],
        "remote_updated": data["date_updated"],
        "remote_user_created": data["user_created"],
        "remote_user_updated": data["user_updated"],
        "remote_data": data,
    }


def _columns(data: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {name: data[name] for name in names}


def pull() -> tuple[Any, Any]:
    from billing_integration.sync.pull import pull_customers, pull_subscriptions

    return pull_customers(), pull_subscriptions()


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


@contextmanager
def time_breakdown(connection: Any, client: Any) -> Iterator[dict[str, float]]:
    """Seconds spent in the client's HTTP calls (with JSON decoding), in SQL statements and
    in commits, while the block runs (an untimed run: the wrappers cost a little)."""
    spent = {"http": 0.0, "sql": 0.0, "commit": 0.0}

    def clocked(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - started

        return wrapper

    def sql(execute: Callable[..., Any], *args: Any) -> Any:
        return clocked("sql", execute)(*args)

    wrapper = connection._connections[connection._alias]  # the DatabaseWrapper
    wrapper._commit = clocked("commit", wrapper._commit)
    client._call = clocked("http", client._call)
    try:
        with connection.execute_wrapper(sql):
            yield spent
    finally:
        del wrapper._commit, client._call


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def traced_peak_mib(fn: Callable[[], Any]) -> float:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


# --- main --------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--customers", type=int, default=10_000)
    parser.add_argument("--subscriptions", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    # the floor's token is taken once: it must outlive every round (the default is 300 s)
    sandbox = sandbox_process("--token-lifetime", "7200")
    with sandbox as env, bench_database(os.environ.get("DATABASE_URL", "")) as db_url:
        os.environ.update(env)
        os.environ.update(
            DATABASE_URL=db_url,
            CACHE_URL="locmemcache://",
            DEBUG="0",  # DEBUG=True would log every query (time and memory)
        )
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        from billing_integration.client import get_client
        from billing_integration.models import Customer, Subscription
        from billing_integration.sync.pull import pull_products

        call_command("migrate", verbosity=0)
        if Customer.objects.exists() or Subscription.objects.exists():
            raise SystemExit(f"{db_url}: the mirror is not empty; use an empty database")

        seeded = requests.post(
            env["BILLING_BASE_URL"] + "/_sandbox/seed",
            json={"customers": args.customers, "subscriptions": args.subscriptions},
            timeout=600,
        )
        seeded.raise_for_status()
        client = get_client()
        pull_products()  # the seeded plan (untimed): subscriptions link to it; warms the token
        token = requests.post(
            client.token_url,
            data={
                "grant_type": "client_credentials",
                "client_id": env["BILLING_CLIENT_ID"],
                "client_secret": env["BILLING_CLIENT_SECRET"],
            },
            timeout=10,
        ).json()["access_token"]
        floor = Floor(env["BILLING_BASE_URL"], token, client.page_size)
        vendor = connection.vendor
        print(
            f"database: {vendor} ({connection.settings_dict['NAME']}); sandbox process; "
            f"{args.customers} customers, {args.subscriptions} subscriptions; "
            f"page size {client.page_size}; {args.rounds} rounds"
        )
        rss_start = maxrss_mib()

        rss_after_pull: list[float] = []

        def pull_round() -> float:
            t_pull, (cust, subs) = timed(pull)
            require(
                cust.created == args.customers and subs.created == args.subscriptions,
                f"pull created {cust} / {subs}: expected everything new",
            )
            if not rss_after_pull:
                rss_after_pull.append(maxrss_mib())
            empty_mirror()
            return t_pull

        def floor_round() -> float:
            t_floor, counts = timed(floor)
            require(counts == (args.customers, args.subscriptions), f"floor fetched {counts}")
            empty_mirror()
            return t_floor

        paired = alternate(
            args.rounds,
            floor_round,
            pull_round,
            target_first=True,
            on_round=lambda i, f, t: print(
                f"  round {i}: pull {t:.3f} s, floor {f:.3f} s, ratio {t / f:.2f}"
            ),
        )
        rss_end = maxrss_mib()

        # Untimed: the queries of one pull, then its tracemalloc peak (and the floor's).
        with CaptureQueriesContext(connection) as ctx:
            cust, subs = pull()
        queries = len(ctx.captured_queries)
        pages = cust.pages + subs.pages
        empty_mirror()
        with time_breakdown(connection, client) as spent:
            t_instrumented, _ = timed(pull)
        empty_mirror()
        pull_peak = traced_peak_mib(pull)
        empty_mirror()
        floor_peak = traced_peak_mib(floor)
        empty_mirror()

    print(
        f"floor (raw paged GETs + one bulk_create per table): median "
        f"{statistics.median(paired.floor):.3f} s; pull_customers() + pull_subscriptions(): "
        f"median {statistics.median(paired.target):.3f} s"
    )
    print(summary("pull/floor", paired, TARGET))
    print(
        f"SQL queries of the pull: {queries} for {pages} pages "
        f"({queries / max(pages, 1):.2f} per page; customers {cust.pages} pages, "
        f"subscriptions {subs.pages} pages)"
    )
    python = t_instrumented - sum(spent.values())
    print(
        f"where the pull's time goes (instrumented run, {t_instrumented:.3f} s): "
        f"HTTP+JSON {spent['http']:.3f} s, SQL statements {spent['sql']:.3f} s, "
        f"commits {spent['commit']:.3f} s, the rest {python:.3f} s (Python: mapping, "
        f"rows)"
    )
    print(
        f"peak memory: tracemalloc pull {pull_peak:.1f} MiB (floor {floor_peak:.1f} MiB); "
        f"ru_maxrss {rss_start:.0f} MiB before, {rss_after_pull[0]:.0f} MiB after the first pull, "
        f"{rss_end:.0f} MiB after the floor rounds"
    )
    return 0 if paired.median_ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
