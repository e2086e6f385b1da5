"""``python manage.py billing_prune_events``: delete old, finished event deliveries."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import gettext as _

from billing_integration.schedule import PRUNE_OLDER_THAN
from billing_integration.webhooks import prune


class Command(BaseCommand):
    help = (
        "Delete processed, unrecognised, failed and rejected event deliveries older than a "
        "duration."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            default=PRUNE_OLDER_THAN,
            help=f"90d, 12h, 30m, seconds; default {PRUNE_OLDER_THAN}",
        )
        parser.add_argument("--dry-run", action="store_true", help="Only count what would go.")
        parser.add_argument("--batch-size", type=int, default=1000, help="Rows per DELETE.")
        parser.add_argument("--pause", type=float, default=0.0, help="Seconds between batches.")
        parser.add_argument("--max-busy", type=float, default=0.25, help="Busy share, (0, 1].")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch_size"] < 1:
            raise CommandError(_("--batch-size must be at least 1."))
        if options["pause"] < 0:
            raise CommandError(_("--pause must not be negative."))
        if not 0 < options["max_busy"] <= 1:
            raise CommandError(_("--max-busy must be above 0 and at most 1."))
        try:
            older_than = prune.parse_duration(options["older_than"])
        except ValueError as exc:
            raise CommandError(f"--older-than: {exc}") from exc
        if options["dry_run"]:
            count = prune.count_prunable(older_than)
            age = str(options["older_than"]).strip()  # as given: "90d", not "90 days, 0:00:00"
            self.stdout.write(
                _("%(count)s event delivery(ies) received more than %(age)s ago would be deleted.")
                % {"count": count, "age": f"{age}s" if age.isdigit() else age}
            )
            return
        result = prune.prune_events(
            older_than,
            batch_size=options["batch_size"],
            pause=options["pause"],
            max_busy=options["max_busy"],
        )
        self.stdout.write(
            _("Deleted %(count)s event delivery(ies) in %(batches)s batch(es).")
            % {"count": result.deleted, "batches": result.batches}
        )
