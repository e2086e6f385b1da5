"""``python manage.py billing_report``: the dashboard's tables in the terminal, or one as CSV;
``--rebuild [--since YYYY-MM]`` recomputes the reporting rollups."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ...display import printable
from ...models import Product
from ...reporting import rollups
from ...reporting.csv import TABLES, table_csv
from ...reporting.report import Period, Table, build_report, display


def format_table(table: Table) -> str:
    """A plain-text table: a title, a header, aligned columns (numbers on the right)."""
    header = [c.label for c in table.columns]
    rows = [
        [printable(display(v, c.kind)) for v, c in zip(row, table.columns, strict=True)]
        for row in table.values()
    ]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            cell.ljust(w) if c.kind == "text" else cell.rjust(w)
            for cell, w, c in zip(cells, widths, table.columns, strict=True)
        ).rstrip()

    out = [table.title, "=" * len(table.title), line(header), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows] or ["(nothing in this period)"]
    return "\n".join(out)


class Command(BaseCommand):
    help = "Print the billing report (MRR, active subscriptions, churn, payments, customers)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--product", help="product pk or exact name (default: all)")
        parser.add_argument("--currency", help="currency code, e.g. XOF (default: each)")
        parser.add_argument("--months", type=int, default=12, help="months back (default 12)")
        parser.add_argument(
            "--csv",
            choices=TABLES,
            metavar="TABLE",
            help=f"print one table as CSV: {', '.join(TABLES)}",
        )
        parser.add_argument("--at", help="report as of this ISO 8601 instant (default: now)")
        parser.add_argument(
            "--customers", type=int, default=25, help="customers listed (default 25, 0 = all)"
        )
        parser.add_argument(
            "--rebuild",
            action="store_true",
            help="recompute the reporting rollups from the mirror (every month, or --since)",
        )
        parser.add_argument(
            "--since", help="with --rebuild: the first month recomputed, YYYY-MM (default: all)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["rebuild"]:
            self.rebuild(options["since"])
            return
        if options["since"]:
            raise CommandError("--since goes with --rebuild.")
        product = None
        if options["product"]:
            value = options["product"]
            # A pk past 19 digits names no row (and int() refuses past 4,300 digits).
            by_pk = value.isascii() and value.isdigit()
            if by_pk and len(value) > 19:
                raise CommandError(f"No product {value[:40]!r}.")
            match = Product.objects.filter(**({"pk": int(value)} if by_pk else {"name": value}))
            product = match.values_list("pk", flat=True).first()
            if product is None:
                raise CommandError(f"No product {value!r}.")
        try:
            at = parse_datetime(options["at"]) if options["at"] else timezone.now()
        except ValueError:  # well formed, but not a date (month 13, February 30)
            at = None
        if at is None:
            raise CommandError(f"--at {options['at']!r} is not an ISO 8601 date-time.")
        if timezone.is_naive(at):
            at = timezone.make_aware(at)
        try:
            period = Period(
                months=options["months"], product=product, currency=options["currency"], now=at
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if options["customers"] < 0:
            raise CommandError("--customers must not be negative (0 = all).")
        limit = options["customers"] or None
        if options["csv"]:
            report = build_report(period, customer_limit=None, at_risk_limit=None)
            self.stdout.write(table_csv(report, options["csv"]), ending="")
            return
        report = build_report(period, customer_limit=limit, at_risk_limit=limit)
        scope = f"last {period.months} months ({report.months[0]} .. {report.months[-1]})"
        self.stdout.write(
            f"Billing report, {scope}"
            + (f", product {printable(report.product_name(product))}" if product else "")
            + (f", {period.currency}" if period.currency else "")
            + "\n"
        )
        for name, table in report.tables().items():
            if name == "at_risk":
                table.title = f"{table.title}: {report.at_risk_total}"
                if report.at_risk_at is not None:  # from the rollups
                    as_of = display(report.at_risk_at, "datetime")
                    table.title += f" (as of {as_of}, the last refresh)"
            self.stdout.write(format_table(table) + "\n")

    def rebuild(self, since: str | None) -> None:
        first = None
        if since:
            try:
                first = datetime.strptime(since, "%Y-%m").date()
            except ValueError as exc:
                raise CommandError(f"--since {since!r} is not a month (YYYY-MM).") from exc
        started = time.monotonic()
        done = rollups.rebuild(first)
        if done is None:
            raise CommandError("Another refresh of the rollups is running; try again later.")
        self.stdout.write(
            f"Rebuilt {done.months} month(s) of rollups"
            + (f" from {done.first:%Y-%m}" if done.first else "")
            + f" in {time.monotonic() - started:.1f} s; they cover the months before "
            f"{done.basis:%Y-%m}.\n"
        )
