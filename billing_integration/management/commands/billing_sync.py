"""``python manage.py billing_sync [resource ...] [--push] [--retry-failed]``: pull and upsert
the lists (all three by default). A failed pull or row is reported on stderr, the next
resources still pulled, and the command fails at the end."""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...display import printable
from ...exceptions import BillingError, BillingServiceMismatchError
from ...service import ensure_service


class Command(BaseCommand):
    help = "Pull products, customers and subscriptions from the billing service."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "resources",
            nargs="*",
            metavar="resource",
            help="products, customers, subscriptions (default: all)",
        )
        parser.add_argument(
            "--push",
            action="store_true",
            help="push every open outbox entry now, inline (without a worker), "
            "and print what happened; with no resource named, pull nothing",
        )
        retry = "re-queue failed outbox entries before pulling"
        parser.add_argument("--retry-failed", action="store_true", help=retry)
        parser.add_argument("--no-progress", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        from ...outbox.retry import retry_failed
        from ...sync import pull
        from ...sync.pull import RESOURCES

        unknown = set(options["resources"]) - set(RESOURCES)
        if unknown:
            raise CommandError(f"Unknown resource(s) {sorted(unknown)}; choose from {RESOURCES}")
        resources = [r for r in RESOURCES if r in (options["resources"] or RESOURCES)]
        tty = (
            not options["no_progress"]
            and hasattr(self.stdout, "isatty")
            and (self.stdout.isatty() or sys.stdout.isatty())
        )

        try:  # refuse another service before pushing or pulling
            ensure_service()
        except BillingServiceMismatchError as exc:
            raise CommandError(str(exc)) from exc
        if options["retry_failed"]:
            count = retry_failed()
            self.stdout.write(f"outbox: {count} failed entries re-queued")
        if options["push"]:
            self._push()
            if not options["resources"]:
                return

        def progress(resource: str, counts: pull.PullCounts) -> None:
            line = f"\r{resource}: page {counts.pages}, {counts.total} rows ..."
            self.stdout.write(line, ending="")
            self.stdout.flush()

        errors = 0
        failed: list[str] = []
        for resource, counts in pull.pull_each(resources, progress=progress if tty else None):
            if tty:
                self.stdout.write("\r\033[K", ending="")
            if isinstance(counts, BillingError):  # the next resources are still pulled
                self.stderr.write(f"{resource}: failed: {counts}")
                failed.append(resource)
                continue
            self.stdout.write(self.style.SUCCESS(f"{resource}: {counts}"))
            if resource == "products":
                self._report_without_cycles(pull.products_without_cycles())
            for message in counts.error_messages:
                self.stderr.write(f"{resource}: not applied: {message}")
            errors += counts.errors
        problems = [f"pull failed for {', '.join(failed)}"] if failed else []
        problems += [f"{errors} row(s) not applied (bad data from the service)"] if errors else []
        if problems:
            raise CommandError("; ".join(problems) + ".")

    def _push(self) -> None:
        """Push every open entry now and print one line per entry and a summary."""
        from ...models.outbox import OutboxEntry
        from ...outbox.push import PushOutcome, push_entry

        entries = OutboxEntry.objects.open().select_related("content_type").order_by("pk")
        results = [(entry, push_entry(entry.pk)) for entry in entries]
        words = {
            PushOutcome.DONE: "pushed",
            PushOutcome.RETRY: "to retry later",
            PushOutcome.FAILED: "failed",
            PushOutcome.BUSY: "waiting (held by a worker, or behind another push of the object)",
            PushOutcome.SKIPPED: "nothing to do",
            PushOutcome.REFUSED: "refused (another service)",
        }
        counts = Counter(result.status for _, result in results)
        for entry, result in results:
            what = f"{entry.content_type.model} {entry.object_id}"
            if entry.target is not None:
                what += f" “{printable(str(entry.target)[:60])}”"
            line = f"  {entry.get_operation_display().lower()} {what}: {words[result.status]}"
            if result.error is not None and result.status != PushOutcome.DONE:
                line += f" ({type(result.error).__name__}: {printable(str(result.error)[:200])})"
            style = self.style.SUCCESS if result.status == PushOutcome.DONE else self.style.WARNING
            self.stdout.write(style(line))
        summary = ", ".join(f"{n} {words[s]}" for s, n in counts.items()) or "nothing open"
        self.stdout.write(f"outbox: {len(results)} open entries pushed now: {summary}")

    def _report_without_cycles(self, products: list[Any]) -> None:
        """Products checkout refuses: their cycles are not known here."""
        if not products:
            return
        text = (
            f"products: {len(products)} on the service without known billing cycles "
            "(the service answers with a blueprint id only); checkout refuses them:"
        )
        self.stdout.write(self.style.WARNING(text))
        for product in products:
            self.stdout.write(f"  - {printable(product.name)} (remote id {product.remote_id})")
        self.stdout.write(
            "  To sell them, declare their billing cycles and prices on each product's admin "
            "page (Billing > Products, filter 'billing cycles: no known cycles'); they are "
            "kept as 'declared here, not confirmed by the service'. 'Send declared cycles to "
            "the service' makes them the product's blueprint on the service."
        )
