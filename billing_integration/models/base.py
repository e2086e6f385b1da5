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
    #: A local change no request can carry (``sync_error`` says what).
    NOT_SENT = "not_sent", _("Not sent")


#: Fields only the remote side writes: a plain ``save()`` never writes them back.
REMOTE_STATE_FIELDS = frozenset(
    {
        "remote_id",
        "remote_created",
        "remote_updated",
        "remote_updated_ours",
        "remote_user_created",
        "remote_user_updated",
        "remote_data",
        "sync_state",
        "sync_error",
        "last_attempt_at",
        "last_synced_at",
    }
)


class RemoteObject(AtomicSaveMixin, models.Model):
    """A local row mirroring one resource of the service (``remote_id``: null until created
    there; ``remote_data``: the last JSON seen)."""

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

    def save(self, *args: Any, **kwargs: Any) -> None:
        from ..context import is_from_remote

        if (
            not self._state.adding
            and not args
            and kwargs.get("update_fields") is None
            and not kwargs.get("force_insert")
            and not is_from_remote()
        ):
            kwargs["update_fields"] = [
                f.name
                for f in self._meta.concrete_fields
                if not f.primary_key and f.name not in REMOTE_STATE_FIELDS
            ]
        super().save(*args, **kwargs)
