"""``python manage.py billing_sandbox --port 8100``: run the offline sandbox of the service
(``billing_integration.sandbox.server``, which never uses Django). The webhook secret is read
from ``BILLING_SANDBOX_WEBHOOK_SECRET``, never from the command line."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from billing_integration.sandbox.server import SandboxStartError, add_arguments, run


class Command(BaseCommand):
    help = "Run the offline sandbox of the billing service (API, checkout page, events)."

    def add_arguments(self, parser: Any) -> None:
        add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            run(options)
        except SandboxStartError as exc:
            raise CommandError(str(exc)) from None
