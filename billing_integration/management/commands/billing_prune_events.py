"""``python manage.py billing_prune_events``: delete old, finished event deliveries."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import gettext as _

from billing_integration.webhooks import prune


class Command(BaseCommand):
    help = (
        "Delete processed, unrecognised, failed and rejected event deliveries older than a "
        "duration."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", help="90d, 12h, 30m, seconds; default EVENT_RETENTION")
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
        given = options["older_than"]
        try:
            older_than = prune.retention() if given is None else prune.parse_duration(given)
        except ValueError as exc:
            source = "BILLING['EVENT_RETENTION']" if given is None else "--older-than"
            raise CommandError(f"{source}: {exc}") from exc
        if older_than is None:
            raise CommandError(
                _(
                    "BILLING['EVENT_RETENTION'] is None (keep every delivery): "
                    "pass --older-than to prune anyway."
                )
            )
        if options["dry_run"]:
            count = prune.count_prunable(older_than)
            self.stdout.write(
                _("%(count)s event delivery(ies) received more than %(age)s ago would be deleted.")
                % {"count": count, "age": older_than}
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
