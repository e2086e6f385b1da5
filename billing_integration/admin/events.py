"""Admin of the event log: read-only deliveries, pretty-printed, "Replay" actions, and the
"Unrecognised events" page (by type, with a replay once they are mapped)."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets
from django.core.exceptions import PermissionDenied
from django.db import models
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..exceptions import redact
from ..models import EventState, WebhookEvent
from .mirror import ModelAdmin, state_label

#: Characters of a body shown as raw text (not JSON, or nested too deep to be parsed).
RAW_TEXT_LIMIT = 20_000
PRE = '<pre class="billing-json" style="white-space:pre-wrap">{}</pre>'
#: Events a replay's message names among those it did not apply (with why).
MAX_NAMED = 10


def pretty_json(value: Any) -> SafeString:
    """``value`` (JSON text or data) indented in a ``<pre>``, its secret-looking fields
    (token, secret, password) redacted. Text that is not JSON, or JSON nested too deep for the
    parser, is shown raw and cut after ``RAW_TEXT_LIMIT`` characters."""
    try:
        data = redact(json.loads(value) if isinstance(value, str) else value)
        text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False)
        # A lone surrogate (the JSON escape "\ud800") cannot be sent as UTF-8: shown escaped.
        return format_html(PRE, text.encode("utf-8", "backslashreplace").decode("utf-8"))
    except (ValueError, TypeError, RecursionError):
        pass
    try:
        text = value if isinstance(value, str) else repr(value)
    except RecursionError:
        text = str(_("(nested too deep to be shown)"))
    if len(text) <= RAW_TEXT_LIMIT:
        return format_html(PRE, text)
    more = _("… %(count)d more characters not shown.") % {"count": len(text) - RAW_TEXT_LIMIT}
    return format_html(PRE + "<p>{}</p>", text[:RAW_TEXT_LIMIT], more)


@admin.register(WebhookEvent)
class WebhookEventAdmin(ModelAdmin):
    list_display = (
        "event_id",
        "type",
        "raw_type",
        "state_badge",
        "outcome",
        "attempts",
        "object_id",
        "received_at",
        "occurred_at",
        "error_short",
    )
    list_filter = ("state", "type", "verified_by")
    date_hierarchy = "received_at"
    search_fields = ("=event_id", "=object_id", "raw_type")
    actions = ("replay", "replay_force")
    change_list_template = "admin/billing_integration/webhookevent/change_list.html"
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "event_id",
                    "type",
                    "raw_type",
                    "state_badge",
                    "outcome",
                    "attempts",
                    "object_id",
                    "verified_by",
                )
            },
        ),
        (_("Times"), {"fields": ("received_at", "occurred_at", "processed_at")}),
        (_("Error"), {"fields": ("error", "traceback_pre")}),
        (_("Delivery"), {"fields": ("body_pretty", "headers_pretty")}),
    )
    readonly_fields = flatten_fieldsets(fieldsets)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Not a delivery still to be applied (as the prune): deleting it would lose its event."""
        if obj is not None and obj.state == EventState.RECEIVED:
            return False
        return super().has_delete_permission(request, obj)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        # No save buttons: the change permission is for the actions.
        hidden = ("show_save", "show_save_and_continue", "show_save_and_add_another")
        extra = {**dict.fromkeys(hidden, False), **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The list, with the health report's line on refused deliveries when there are some:
        they are not stored, so the list alone would look healthy."""
        from ..health import FACTS, OK, diagnose

        (refused,) = diagnose(skip=[fact for fact in FACTS if fact != "refused"]).facts
        context = {
            "refused": refused if refused.status != OK else None,
            "health_url": reverse(f"{self.admin_site.name}:billing_integration_health_changelist")
            if request.user.has_perm("billing_integration.view_health")
            else None,
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    def get_urls(self) -> list[Any]:
        name = f"{self.opts.app_label}_{self.opts.model_name}_unrecognised"
        view = self.admin_site.admin_view(self.unrecognised_view)
        return [path("unrecognised/", view, name=name), *super().get_urls()]

    def unrecognised_view(self, request: HttpRequest) -> HttpResponse:
        """GET: the unrecognised events by type; POST: replay them all, oldest first."""
        from ..webhooks.unrecognised import replay_unrecognised, unrecognised_types

        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            if not self.has_change_permission(request):
                raise PermissionDenied
            counts = replay_unrecognised()
            summary = ", ".join(f"{state}: {n}" for state, n in sorted(counts.items()))
            if not counts:
                self.message_user(request, _("No unrecognised event to replay."), messages.INFO)
            else:
                level = messages.SUCCESS if set(counts) == {"processed"} else messages.WARNING
                self.message_user(request, _("Replayed: %s") % summary, level)
            return HttpResponseRedirect(request.path)
        found = unrecognised_types()
        rows = [{"type": row, "sample": pretty_json(row.sample)} for row in found]
        changelist = (
            f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_changelist"
        )
        return self.page(
            request,
            "admin/billing_integration/webhookevent/unrecognised.html",
            title=_("Unrecognised events"),
            rows=rows,
            total=sum(row.count for row in found),
            can_replay=self.has_change_permission(request),
            changelist_url=reverse(changelist) + "?state__exact=unrecognised",
        )

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Never write a delivery from the admin."""

    state_badge = state_label

    @admin.display(description=_("error"))
    def error_short(self, obj: WebhookEvent) -> str:
        return (obj.error[:80] + "…") if len(obj.error) > 80 else obj.error

    @admin.display(description=_("traceback"))
    def traceback_pre(self, obj: WebhookEvent) -> SafeString | str:
        return format_html("<pre>{}</pre>", obj.traceback) if obj.traceback else "-"

    @admin.display(description=_("raw body"))
    def body_pretty(self, obj: WebhookEvent) -> SafeString:
        return pretty_json(obj.body)

    @admin.display(description=_("headers (redacted)"))
    def headers_pretty(self, obj: WebhookEvent) -> SafeString:
        return pretty_json(obj.headers or {})

    def _replay(
        self, request: HttpRequest, queryset: models.QuerySet[WebhookEvent], force: bool
    ) -> None:
        from ..webhooks.processing import replay_events

        counts = replay_events(queryset, inline=True, force=force)
        if not counts:
            self.message_user(
                request,
                _("Nothing to replay (processed and rejected events are skipped)."),
                messages.WARNING,
            )
            return
        summary = ", ".join(f"{state}: {n}" for state, n in sorted(counts.items()))
        level = messages.WARNING if counts.get("failed") else messages.SUCCESS
        self.message_user(request, _("Replayed: %s") % summary, level)
        not_applied = queryset.filter(state__in=[EventState.FAILED, EventState.UNRECOGNISED])
        if counts.get(EventState.FAILED) or counts.get(EventState.UNRECOGNISED):
            shown = not_applied.order_by("received_at", "pk")[:MAX_NAMED]
            named = "; ".join(f"{e.event_id}: {' '.join(e.error.split())[:200]}" for e in shown)
            if (more := not_applied.count() - len(shown)) > 0:
                named += " " + _("(and %d more)") % more
            self.message_user(request, _("Not applied: %s") % named, messages.ERROR)

    @admin.action(description=_("Replay (events not processed yet)"), permissions=["change"])
    def replay(self, request: HttpRequest, queryset: models.QuerySet[WebhookEvent]) -> None:
        self._replay(request, queryset, force=False)

    @admin.action(
        description=_("Re-apply, processed ones too (older never overwrites newer)"),
        permissions=["change"],
    )
    def replay_force(self, request: HttpRequest, queryset: models.QuerySet[WebhookEvent]) -> None:
        self._replay(request, queryset, force=True)
