"""The abstract base of every mirrored object (``RemoteObject``) and its sync states."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, cast

from django.db import models, router, transaction
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..context import is_from_remote
from ..timestamps import TOLERANCE

__all__ = ["AtomicSaveMixin", "RemoteObject", "SyncState", "older_than_stored", "trusted_until"]


def trusted_until(at: datetime | None = None) -> datetime:
    """The latest stored version (``remote_updated``) that holds back older states at ``at``
    (default now): one more than ``TOLERANCE`` later came from a clock ahead (a
    ``date_updated`` of 2099) and would hold back every real state until then."""
    return (at or timezone.now()) + timedelta(seconds=TOLERANCE)


def older_than_stored(
    version: datetime | None, stored: datetime | None, at: datetime | None = None
) -> bool:
    """``version`` (of an event received at ``at``, a pulled row, a push's answer: default
    now) is older than the ``stored`` one, which is not beyond ``trusted_until(at)``: the
    version guard of the events, the pull and the push answers."""
    return version is not None and stored is not None and version < stored <= trusted_until(at)


class AtomicSaveMixin:
    """``save()`` runs in a transaction, so the outbox entry its ``post_save`` writes is
    committed with the change even in autocommit mode; ``saved()`` runs in it too."""

    def save(self, *args: Any, **kwargs: Any) -> None:
        model = cast("type[models.Model]", type(self))
        using = kwargs.get("using") or router.db_for_write(model, instance=self)
        with transaction.atomic(using=using, savepoint=False):
            # mypy cannot see that Model.save follows this mixin in the MRO.
            super().save(*args, **kwargs)  # type: ignore[misc]
            self.saved()

    def saved(self) -> None:
        """Called after the row is written, in the same transaction."""


class SyncState(models.TextChoices):
    PENDING = "pending", _("Pending push")
    SYNCED = "synced", _("Synced")
    FAILED = "failed", _("Failed")
    #: A local change no request can carry (``sync_error`` says what).
    NOT_SENT = "not_sent", _("Not sent")


#: Fields only the remote side writes: a plain ``save()`` never writes them back.
REMOTE_STATE_FIELDS = {"remote_id", "remote_created", "remote_updated", "remote_updated_ours"}
REMOTE_STATE_FIELDS |= {"remote_user_created", "remote_user_updated", "remote_data"}
REMOTE_STATE_FIELDS |= {"sync_state", "sync_error", "last_attempt_at", "last_synced_at"}


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
        plain = not (self._state.adding or args or is_from_remote() or kwargs.get("force_insert"))
        if plain and kwargs.get("update_fields") is None:
            kwargs["update_fields"] = [
                f.name
                for f in self._meta.concrete_fields
                if not f.primary_key and f.name not in REMOTE_STATE_FIELDS
            ]
        super().save(*args, **kwargs)
