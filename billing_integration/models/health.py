"""``Heartbeat``: when each periodic job last ran (a row: every process sees it); ``Health``,
its proxy behind the admin's Health page."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

__all__ = ["Health", "Heartbeat"]


class Heartbeat(models.Model):
    """The last run of one periodic job (``beat:drain_outbox``, ``pull:customers``...)."""

    name = models.CharField(_("name"), max_length=100, unique=True)
    at = models.DateTimeField(_("last run"))

    class Meta:
        verbose_name = _("heartbeat")
        verbose_name_plural = _("heartbeats")

    def __str__(self) -> str:
        return f"{self.name} at {self.at.isoformat()}"


class Health(Heartbeat):
    class Meta:
        proxy = True
        verbose_name = _("health")
        verbose_name_plural = _("health")
        default_permissions = ("view",)
