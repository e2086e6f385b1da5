"""``Report``: a proxy of ``Subscription`` that only exists to give the reporting dashboard
an entry on the admin index (its changelist is the dashboard) and its own view permission
(``billing_integration.view_report``). It adds no table."""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _

from .subscriptions import Subscription

__all__ = ["Report"]


class Report(Subscription):
    class Meta:
        proxy = True
        verbose_name = _("report")
        verbose_name_plural = _("reports")
        default_permissions = ("view",)
