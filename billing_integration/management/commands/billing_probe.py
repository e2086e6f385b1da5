"""``manage.py billing_probe``: check the app's guesses against the configured service
(docs/guesses.md); exits 1 when a guess the app relies on is contradicted."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...conf import billing_settings
from ...probe import (
    CONFIRMED,
    CONTRADICTED,
    PRIVATE,
    default_output,
    run_probe,
    save_answers,
)

LABELS = {CONFIRMED: "confirmed   ", CONTRADICTED: "CONTRADICTED", "unknown": "unknown     "}


class Command(BaseCommand):
    help = (
        "Check each guess the app makes where the interface says 'not shown' against the "
        "service BILLING points at: confirmed, contradicted or unknown. Read-only unless "
        "--write. Exits 1 when a guess the app relies on is contradicted."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the findings as JSON")
        parser.add_argument(
            "--write",
            action="store_true",
            help="also create a probe customer, two draft products (archived after) and a "
            "checkout session (not completed); only in the sandbox realm unless --i-know",
        )
        parser.add_argument(
            "--i-know",
            action="store_true",
            dest="i_know",
            help="allow --write in a realm other than 'sandbox'",
        )
        parser.add_argument(
            "--output",
            metavar="FILE",
            help="where to save the raw answers, secrets and tokens removed "
            "(default: billing-probe-<UTC time>.json in the current directory)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        realm = billing_settings.REALM
        if options["write"] and realm != "sandbox" and not options["i_know"]:
            raise CommandError(
                f"--write creates objects on the service, and BILLING['REALM'] is {realm!r}, "
                "not 'sandbox': add --i-know to do it anyway.",
                returncode=2,
            )
        path = Path(options["output"]) if options["output"] else default_output()
        _writable(path)  # before anything is sent
        report = run_probe(write=options["write"])
        try:
            save_answers(report, path)
        except OSError as exc:
            raise CommandError(_cannot_write(path, exc), returncode=2) from None
        if options["json"]:
            self.stdout.write(json.dumps({**report.as_dict(), "answers_file": str(path)}, indent=2))
        else:
            styles = {CONFIRMED: self.style.SUCCESS, CONTRADICTED: self.style.ERROR}
            for f in report.findings:
                label = styles.get(f.verdict, self.style.WARNING)(LABELS[f.verdict])
                line = f"{label} {f.guess}: {f.seen}"
                if f.verdict != CONFIRMED:
                    line += f" [assumed: {f.assumed}; setting: {_setting(f.setting)}]"
                self.stdout.write(line)
            self.stdout.write(f"Raw answers (secrets and tokens removed): {path}")
        if report.exit_code:
            broken = ", ".join(f.guess for f in report.findings if f.breaks_the_app)
            raise CommandError(f"contradicted guesses the app relies on: {broken}", returncode=1)


def _setting(setting: str) -> str:
    """``CURRENCIES``: ``BILLING['CURRENCIES']``; ``GUESSES['x']``: ``BILLING['GUESSES']['x']``."""
    if " " in setting:
        return setting
    key, bracket, rest = setting.partition("[")
    return f"BILLING['{key}']{bracket}{rest}"


def _writable(path: Path) -> None:
    """Refuse (exit 2) an output file that cannot be written."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE))
    except OSError as exc:
        raise CommandError(_cannot_write(path, exc), returncode=2) from None


def _cannot_write(path: Path, exc: OSError) -> str:
    return f"cannot write the raw answers to {path}: {exc.strerror or exc}"
