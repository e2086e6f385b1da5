"""Which billing service the local mirror belongs to: ``ServiceBinding``, one row per database.

The remote ids, remote JSON and sync states of the mirrored rows are only meaningful at the
service that issued them. The binding records that service (base URL, realm, client id; never
the secret) the first time the app talks to a service with local state, and
``billing_integration.service`` refuses pushes, pulls and checkouts while the settings point
elsewhere. See ``docs/mirror.md`` ("Which service the mirror belongs to").
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

__all__ = ["ServiceBinding"]


class ServiceBinding(models.Model):
    """The service the mirror in this database belongs to (a single row).

    ``singleton`` is always True and unique, so two processes recording the binding at once
    cannot both insert a row: the second gets an ``IntegrityError`` and reads the first's.
    """

    singleton = models.BooleanField(default=True, editable=False)
    base_url = models.CharField(
        _("base URL"), max_length=500, help_text=_("Normalised: scheme, host, port and path.")
    )
    realm = models.CharField(_("realm"), max_length=200)
    client_id = models.CharField(_("client id"), max_length=255)
    recorded_at = models.DateTimeField(_("recorded at"))
    #: Earlier bindings, oldest first: ``{"base_url", "realm", "client_id", "recorded_at",
    #: "until", "action"}`` (``action``: ``relink`` or ``reset``).
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
