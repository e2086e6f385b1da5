"""``manage.py billing_doctor``: the integration's health report; exits 1 when a fact fails."""

from __future__ import annotations

import json
import math
from argparse import ArgumentTypeError
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import gettext as _

from ...health import FACTS, FAIL, OK, Thresholds, diagnose

LABELS = {OK: "OK  ", "warning": "WARN", FAIL: "FAIL"}
#: One option per field of ``Thresholds``: what it limits.
LIMITS = {
    "max_beat_age": "seconds since the newest periodic (beat) run",
    "max_outbox_age": "seconds the oldest pending outbox entry may wait",
    "max_failed_entries": "failed outbox entries allowed",
    "max_event_lag": "seconds the oldest unprocessed event may wait",
    "max_failed_events": "failed events allowed",
    "max_pull_age": "seconds since each resource's last successful pull",
    "timeout": "seconds for the token request, the service read and the broker",
    "ping_timeout": "seconds workers have to answer",
}


def _limit(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """A command-line limit of ``kind``: a finite number, 0 or more (a usage error otherwise)."""

    def read(text: str) -> int | float:
        problem = ArgumentTypeError(f"{text!r} is not a non-negative number")
        try:
            value = kind(text)
        except ValueError:
            raise problem from None
        if not math.isfinite(value) or value < 0:
            raise problem
        return value

    return read


class Command(BaseCommand):
    help = (
        "Check the billing integration's health: token, service, broker and workers, beat, outbox, "
        "events, refused deliveries, pulls. Exits 1 when something is unhealthy."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        skip = f"facts not to check (one or more, the option repeatable): {', '.join(FACTS)}"
        parser.add_argument(
            "--skip",
            nargs="+",
            action="extend",
            choices=FACTS,
            default=[],
            metavar="FACT",
            help=skip,
        )
        defaults = Thresholds()
        for f in fields(Thresholds):
            default = getattr(defaults, f.name)
            option = "--" + f.name.replace("_", "-")
            no_limit = "; 0 = no limit" if f.name.endswith(("_age", "_lag")) else ""
            what = f"{LIMITS[f.name]} (default {default:g}{no_limit})"
            parser.add_argument(option, type=_limit(type(default)), default=default, help=what)

    def handle(self, *args: Any, **options: Any) -> None:
        thresholds = Thresholds(**{f.name: options[f.name] for f in fields(Thresholds)})
        report = diagnose(thresholds, skip=options["skip"])
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
        else:
            styles = {OK: self.style.SUCCESS, "warning": self.style.WARNING, FAIL: self.style.ERROR}
            for fact in report.facts:
                self.stdout.write(styles[fact.status](LABELS[fact.status]) + " " + fact.summary)
        if not report.healthy:
            failed = ", ".join(f.key for f in report.failures)
            raise CommandError(_("unhealthy: %(facts)s") % {"facts": failed}, returncode=1)
        if not options["json"]:
            self.stdout.write(self.style.SUCCESS(_("healthy")))
