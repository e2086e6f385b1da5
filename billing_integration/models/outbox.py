"""The transactional outbox: one row per logical push of a local change, written in the
change's transaction and pushed by a Celery task enqueued on commit (``outbox``)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import models
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

__all__ = ["LEASE", "OutboxEntry", "OutboxOperation", "OutboxQuerySet", "OutboxState"]


class OutboxOperation(models.TextChoices):
    CREATE = "create", _("Create")
    UPDATE = "update", _("Update")


class OutboxState(models.TextChoices):
    PENDING = "pending", _("Pending")
    IN_PROGRESS = "in_progress", _("In progress")
    DONE = "done", _("Done")
    FAILED = "failed", _("Failed")


OPEN_STATES = (OutboxState.PENDING, OutboxState.IN_PROGRESS)
#: The entries that hold back the later ones of their object: open, or failed in doubt.
BLOCKING = Q(state__in=OPEN_STATES) | Q(state=OutboxState.FAILED, in_doubt=True)
LEASE = 300.0  # seconds a worker's claim holds; then the sweep gives the entry to another


class OutboxQuerySet(models.QuerySet["OutboxEntry"]):
    def for_object(self, obj: models.Model) -> OutboxQuerySet:
        return self.filter(
            content_type=ContentType.objects.get_for_model(obj, for_concrete_model=True),
            object_id=obj.pk,
        )

    def open(self) -> OutboxQuerySet:
        return self.filter(state__in=OPEN_STATES)

    def pending(self) -> OutboxQuerySet:
        return self.filter(state=OutboxState.PENDING)

    def failed(self) -> OutboxQuerySet:
        return self.filter(state=OutboxState.FAILED)

    def due(self, *, stale_after: float = 0.0) -> OutboxQuerySet:
        """Pending entries due (untouched for ``stale_after`` seconds), and in-progress ones
        whose lease expired."""
        now = timezone.now()
        pending = Q(state=OutboxState.PENDING) & (
            Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now)
        )
        if stale_after:
            pending &= Q(updated_at__lte=now - timedelta(seconds=stale_after))
        return self.filter(
            pending
            | Q(state=OutboxState.IN_PROGRESS, started_at__lte=now - timedelta(seconds=LEASE))
        )

    def heads(self) -> OutboxQuerySet:
        """Entries with no older ``BLOCKING`` entry of their object."""
        same = {name: OuterRef(name) for name in ("content_type_id", "object_id")}
        older = OutboxEntry.objects.filter(BLOCKING, pk__lt=OuterRef("pk"), **same)
        return self.filter(~Exists(older))

    def reset_failed(self) -> list[int]:
        """Put failed entries back in the queue and return their ids. One in doubt keeps its
        key and body; one the service refused (nothing created) gets new ones. A refused
        create whose object has a later entry open or in doubt is closed instead: that entry
        creates the object (its create may have reached the service already), and a create
        built again here, with a new key, would go first and could make a second one."""
        failed = list(self.filter(state=OutboxState.FAILED).values_list("pk", flat=True))
        ids = []
        for entry in OutboxEntry.objects.filter(pk__in=failed):
            later = OutboxEntry.objects.filter(
                BLOCKING,
                content_type_id=entry.content_type_id,
                object_id=entry.object_id,
                pk__gt=entry.pk,
            ).first()
            if not entry.in_doubt and entry.operation == OutboxOperation.CREATE and later:
                entry.state, entry.completed_at = OutboxState.DONE, timezone.now()
                entry.last_error += f"\nNot retried: entry {later.pk} creates the object."
                entry.save()
                continue
            entry.state, entry.attempts, entry.next_attempt_at = OutboxState.PENDING, 0, None
            if not entry.in_doubt:
                entry.payload, entry.idempotency_key = None, uuid.uuid4()
            entry.save()
            ids.append(entry.pk)
        return ids


class OutboxEntry(models.Model):
    content_type = models.ForeignKey(ContentType, on_delete=models.CASCADE)
    object_id = models.BigIntegerField()
    operation = models.CharField(max_length=8, choices=OutboxOperation.choices)
    idempotency_key = models.UUIDField(default=uuid.uuid4, editable=False)
    state = models.CharField(
        max_length=16, choices=OutboxState.choices, default=OutboxState.PENDING, db_index=True
    )
    #: Wire fields marked changed by related rows (cycles, prices) since the last push.
    changed_fields = models.JSONField(default=list, blank=True)
    #: The body sent on the first attempt, resent unchanged by every retry (same key).
    payload = models.JSONField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    #: An attempt's outcome is unknown: later entries wait, retries reuse key and body.
    in_doubt = models.BooleanField(default=False)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = OutboxQuerySet.as_manager()

    class Meta:
        ordering = ["pk"]
        verbose_name = _("outbox entry")
        verbose_name_plural = _("outbox entries")
        indexes = [
            models.Index(fields=["content_type", "object_id", "state"], name="billing_outbox_obj"),
            models.Index(fields=["state", "updated_at"], name="billing_outbox_due"),
            models.Index(
                fields=["content_type", "object_id"],
                condition=models.Q(state__in=["pending", "in_progress"])
                | models.Q(state="failed", in_doubt=True),
                name="billing_outbox_open",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.operation} {self.content_type.model}#{self.object_id} ({self.state})"

    @property
    def target(self) -> Any:
        model = ContentType.objects.get_for_id(self.content_type_id).model_class()
        return model._default_manager.filter(pk=self.object_id).first() if model else None
