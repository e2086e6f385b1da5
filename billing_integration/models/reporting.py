"""``Report``: a proxy of ``Subscription`` behind the admin reporting dashboard."""

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
