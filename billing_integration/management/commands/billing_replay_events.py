"""``python manage.py billing_replay_events``: process stored events again (options: --help)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from billing_integration.models import EventState, WebhookEvent
from billing_integration.webhooks.processing import replay_events
from billing_integration.webhooks.types import normalize_type


class Command(BaseCommand):
    help = "Process stored billing events again (failed, unrecognised or all not yet processed)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--failed", action="store_true", help="Only failed events.")
        parser.add_argument(
            "--unrecognised",
            "--ignored",  # its name before 'unrecognised'
            dest="unrecognised",
            action="store_true",
            help="Only unrecognised events (no handler, or data a handler cannot use).",
        )
        parser.add_argument("--type", dest="event_type", help="Only events of this type.")
        parser.add_argument("--since", help="Only events received at or after this date/time.")
        parser.add_argument("--force", action="store_true", help="Also re-apply processed events.")
        parser.add_argument("--async", dest="use_celery", action="store_true", help="On Celery.")

    def handle(self, *args: Any, **options: Any) -> None:
        events = WebhookEvent.objects.exclude(state=EventState.REJECTED)
        states = [s for s in (EventState.FAILED, EventState.UNRECOGNISED) if options[s.value]]
        if states:
            events = events.filter(state__in=states)
        if options["event_type"]:
            wanted = options["event_type"]
            canonical = normalize_type(wanted) or wanted
            events = events.filter(Q(type=canonical) | Q(raw_type=wanted))
        if options["since"]:
            events = events.filter(received_at__gte=self._since(options["since"]))
        counts = replay_events(events, inline=not options["use_celery"], force=options["force"])
        total = sum(counts.values())
        detail = ", ".join(f"{state}: {n}" for state, n in sorted(counts.items())) or "nothing"
        self.stdout.write(f"Replayed {total} event(s) ({detail}).")

    @staticmethod
    def _since(value: str) -> datetime:
        try:  # well formed but not a date (month 13, February 30) raises ValueError
            moment = parse_datetime(value)
            if moment is None and (day := parse_date(value)) is not None:
                moment = datetime(day.year, day.month, day.day)
        except ValueError:
            moment = None
        if moment is None:
            raise CommandError(f"--since: not a date or datetime: {value!r}")
        return moment if timezone.is_aware(moment) else timezone.make_aware(moment)
