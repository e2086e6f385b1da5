"""The log of event deliveries (``WebhookEvent``): stored first, raw; the source of truth for
processing, deduplication (``event_id`` is unique) and replay."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..strictjson import parse_body

__all__ = ["EventState", "WebhookEvent"]


class EventState(models.TextChoices):
    RECEIVED = "received", _("Received")
    PROCESSED = "processed", _("Processed")
    FAILED = "failed", _("Failed")
    #: No handler for its type, or data a handler cannot use: kept until mapped, never retried
    #: by itself ("Unrecognised events" in the admin; replayed after an alias or a handler).
    UNRECOGNISED = "unrecognised", _("Unrecognised (kept until mapped)")
    REJECTED = "rejected", _("Rejected (malformed body)")


class WebhookEvent(models.Model):
    """One delivery of an event by the billing service."""

    #: The envelope ``id`` (else the ``webhook-id`` header, else a hash of the body); unique.
    event_id = models.CharField(_("event id"), max_length=255)
    raw_type = models.CharField(_("type as received"), max_length=255, blank=True, default="")
    #: The canonical type (``invoice.paid``) or a project's own (``@handler``); "" if not known.
    type = models.CharField(_("type"), max_length=64, blank=True, default="")
    body = models.TextField(_("raw body"), blank=True, default="")
    #: Request headers, with authorization and signature headers redacted.
    headers = models.JSONField(_("headers"), default=dict, blank=True)
    #: How the delivery was authenticated: ``signature``, ``basic`` or ``none``.
    verified_by = models.CharField(max_length=16, blank=True, default="")

    received_at = models.DateTimeField(_("received at"), default=timezone.now)
    occurred_at = models.DateTimeField(_("occurred at"), null=True, blank=True)
    #: ``data.id``: the object the event is about.
    object_id = models.CharField(_("object id"), max_length=64, blank=True, default="")

    state = models.CharField(max_length=16, choices=EventState.choices, default=EventState.RECEIVED)
    #: What processing did: ``applied``, ``stale`` (an older event, skipped), ...
    outcome = models.CharField(max_length=32, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    processed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("event delivery")
        verbose_name_plural = _("event deliveries")
        ordering = ("-received_at", "-id")
        indexes = [
            models.Index(fields=["state", "received_at"], name="billing_event_state_idx"),
            # The last event applied to an object (``EventHandler.later_than_stored``, on a tie
            # of versions); partial: written when an event is processed, not on ingest.
            models.Index(
                fields=["object_id", "processed_at"],
                condition=models.Q(state="processed", outcome="applied"),
                name="billing_event_applied_idx",
            ),
        ]
        # Not ``unique=True``: on PostgreSQL that adds a second (LIKE) index, paid on ingest.
        constraints = [models.UniqueConstraint(fields=["event_id"], name="billing_event_id_unique")]

    def __str__(self) -> str:
        return f"{self.type or self.raw_type or '?'} {self.event_id} ({self.state})"

    @property
    def payload(self) -> dict[str, Any]:
        """The parsed envelope (``{}`` if the body is not a JSON object)."""
        try:
            return parse_body(self.body)
        except ValueError:
            return {}
