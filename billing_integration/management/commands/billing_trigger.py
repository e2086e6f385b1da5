"""``python manage.py billing_trigger TYPE OBJECT_ID``: make the sandbox emit an event."""

from __future__ import annotations

import json
from typing import Any

import requests
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from ...sandbox.events import EVENT_TYPES


class Command(BaseCommand):
    help = "Make the billing sandbox emit an event for an object (with its state change)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("type", choices=EVENT_TYPES, help="event type")
        parser.add_argument("object_id", help="subscription, payment, refund or invoice id")
        parser.add_argument("--sandbox-url", help="default: BILLING['BASE_URL'] or :8100")
        parser.add_argument("--reason", help="failure or refund reason")

    def handle(self, *args: Any, **options: Any) -> None:
        billing = getattr(settings, "BILLING", None) or {}
        url = options["sandbox_url"] or billing.get("BASE_URL") or "http://127.0.0.1:8100"
        body = {"type": options["type"], "object": options["object_id"]}
        if options["reason"]:
            body["reason"] = options["reason"]
        try:
            response = requests.post(url.rstrip("/") + "/_sandbox/trigger", json=body, timeout=30)
        except requests.RequestException as exc:
            raise CommandError(f"Cannot reach the sandbox at {url}: {exc}") from exc
        if response.status_code != 200:
            raise CommandError(
                f"The sandbox answered {response.status_code}: {response.text[:500]}"
            )
        try:
            answer = response.json()
        except ValueError:
            raise CommandError(
                f"{url} answered 200 without JSON: is it the sandbox? {response.text[:200]!r}"
            ) from None
        self.stdout.write(json.dumps(answer, indent=2))
