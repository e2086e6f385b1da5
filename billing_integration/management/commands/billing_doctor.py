"""``python manage.py billing_doctor [--json] [--skip FACT ...] [--max-... N]``

Report the health of the billing integration (``billing_integration.health``): a new token
can be fetched, the broker is reachable and workers answer, beat ran recently, the outbox
backlog, the event processing lag, failed entries and events, deliveries refused in the last
hour, the last successful pull. Exits 1 when a fact fails, so it can serve as a deployment or
liveness probe.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import gettext as _

from ...health import FACTS, FAIL, OK, Thresholds, diagnose

LABELS = {OK: "OK  ", "warning": "WARN", FAIL: "FAIL"}


class Command(BaseCommand):
    help = (
        "Check the billing integration's health: token, broker and workers, beat, outbox, "
        "events, refused deliveries, pulls. Exits 1 when something is unhealthy."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        d = Thresholds()
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument(
            "--skip",
            nargs="+",
            choices=FACTS,
            default=[],
            metavar="FACT",
            help=f"facts not to check: {', '.join(FACTS)}",
        )
        limits = [
            (
                "--max-beat-age",
                float,
                d.max_beat_age,
                "seconds since the newest periodic (beat) run",
            ),
            (
                "--max-outbox-age",
                float,
                d.max_outbox_age,
                "seconds the oldest pending outbox entry may wait",
            ),
            ("--max-failed-entries", int, d.max_failed_entries, "failed outbox entries allowed"),
            (
                "--max-event-lag",
                float,
                d.max_event_lag,
                "seconds the oldest unprocessed event may wait",
            ),
            ("--max-failed-events", int, d.max_failed_events, "failed events allowed"),
            (
                "--max-pull-age",
                float,
                d.max_pull_age,
                "seconds since each resource's last successful pull",
            ),
            ("--timeout", float, d.timeout, "seconds for the token request and the broker"),
            ("--ping-timeout", float, d.ping_timeout, "seconds workers have to answer"),
        ]
        for flag, kind, default, text in limits:
            parser.add_argument(
                flag,
                type=kind,
                default=default,
                help=f"{text} (default {default:g}; 0 = no limit for ages)",
            )

    def handle(self, *args: Any, **options: Any) -> None:
        thresholds = Thresholds(
            max_beat_age=options["max_beat_age"],
            max_outbox_age=options["max_outbox_age"],
            max_failed_entries=options["max_failed_entries"],
            max_event_lag=options["max_event_lag"],
            max_failed_events=options["max_failed_events"],
            max_pull_age=options["max_pull_age"],
            timeout=options["timeout"],
            ping_timeout=options["ping_timeout"],
        )
        report = diagnose(thresholds, skip=options["skip"])
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
        else:
            styles = {OK: self.style.SUCCESS, "warning": self.style.WARNING, FAIL: self.style.ERROR}
            for fact in report.facts:
                self.stdout.write(styles[fact.status](LABELS[fact.status]) + " " + fact.summary)
        if not report.healthy:
            raise CommandError(
                _("unhealthy: %(facts)s") % {"facts": ", ".join(f.key for f in report.failures)},
                returncode=1,
            )
        if not options["json"]:
            self.stdout.write(self.style.SUCCESS(_("healthy")))
