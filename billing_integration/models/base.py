"""The abstract base of every mirrored object (``RemoteObject``) and its sync states."""

from __future__ import annotations

from typing import Any

from django.db import models, router, transaction
from django.utils.translation import gettext_lazy as _

__all__ = ["AtomicSaveMixin", "RemoteObject", "SyncState"]


class AtomicSaveMixin:
    """``save()`` runs in a transaction, so the outbox entry its ``post_save`` writes is
    committed together with the change even in autocommit mode."""

    def save(self, *args: Any, **kwargs: Any) -> None:
        using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
        with transaction.atomic(using=using, savepoint=False):
            super().save(*args, **kwargs)  # type: ignore[misc]


class SyncState(models.TextChoices):
    PENDING = "pending", _("Pending push")
    SYNCED = "synced", _("Synced")
    FAILED = "failed", _("Failed")


class RemoteObject(AtomicSaveMixin, models.Model):
    """A local row mirroring one resource of the billing service.

    The local primary key is our own; ``remote_id`` is the service's UUID, null until the
    object has been created remotely. ``remote_data`` keeps the last JSON seen from the
    service (response of a push, a pull or an event).
    """

    remote_id = models.UUIDField(_("remote id"), unique=True, null=True, blank=True, editable=False)
    remote_created = models.DateTimeField(null=True, blank=True, editable=False)
    remote_updated = models.DateTimeField(null=True, blank=True, editable=False)
    remote_user_created = models.UUIDField(null=True, blank=True, editable=False)
    remote_user_updated = models.UUIDField(null=True, blank=True, editable=False)
    remote_data = models.JSONField(null=True, blank=True, editable=False)

    sync_state = models.CharField(
        max_length=16, choices=SyncState.choices, default=SyncState.PENDING, editable=False
    )
    sync_error = models.TextField(blank=True, default="", editable=False)
    last_attempt_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_synced_at = models.DateTimeField(null=True, blank=True, editable=False)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True

    @property
    def is_pushed(self) -> bool:
        return self.remote_id is not None
