"""Admin: the Health page (Admin → Billing → Health)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext as _

from ..health import FAIL, OK, Thresholds, diagnose
from ..models import Health
from .mirror import ModelAdmin, PageAdmin, state_badge

#: Badge colours (``state_badge``) and labels of the fact statuses.
STATUS_BADGES = {OK: ("processed", "OK"), "warning": ("received", "WARN"), FAIL: ("failed", "FAIL")}


@admin.register(Health)
class HealthAdmin(PageAdmin, ModelAdmin):
    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        thresholds = Thresholds()
        report = diagnose(thresholds)
        facts = [
            {"fact": fact, "badge": state_badge(*STATUS_BADGES[fact.status])}
            for fact in report.facts
        ]
        context = {
            "title": _("Billing health"),
            "report": report,
            "facts": facts,
            "thresholds": thresholds,
            **(extra_context or {}),
        }
        return self.page(request, "admin/billing_integration/health/health.html", **context)
