"""``ServiceBinding``: which billing service the mirror in this database belongs to."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

__all__ = ["ServiceBinding"]


class ServiceBinding(models.Model):
    """The single row (``singleton`` is unique) naming the mirror's service."""

    singleton = models.BooleanField(default=True, editable=False)
    base_url = models.CharField(
        _("base URL"), max_length=500, help_text=_("Normalised: scheme, host, port and path.")
    )
    realm = models.CharField(_("realm"), max_length=200)
    client_id = models.CharField(_("client id"), max_length=255)
    recorded_at = models.DateTimeField(_("recorded at"))
    #: Earlier bindings, oldest first.
    history = models.JSONField(default=list, blank=True)

    class Meta:
        verbose_name = _("service binding")
        verbose_name_plural = _("service binding")
        constraints = [
            models.UniqueConstraint(fields=["singleton"], name="billing_one_service_binding"),
            models.CheckConstraint(
                condition=Q(singleton=True), name="billing_service_binding_singleton"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.base_url} (realm {self.realm!r}, client id {self.client_id!r})"
