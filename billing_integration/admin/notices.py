"""Admin of the notice emails: read-only, one row per notice (an event's, or a subscription's:
a trial ending, a cancellation or pause a pull found)."""

from __future__ import annotations

from django.contrib import admin
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import Notice
from .mirror import ModelAdmin, ReadOnlyAdminMixin, admin_link, state_label


@admin.register(Notice)
class NoticeAdmin(ReadOnlyAdminMixin, ModelAdmin):
    list_display = [
        "kind",
        "recipient",
        "state_label",
        "sent_at",
        "attempts",
        "event_link",
        "subscription_link",
    ]
    list_filter = ["kind", "state"]
    search_fields = ["recipient", "event__event_id"]
    date_hierarchy = "created_at"
    list_select_related = ["event", "subscription"]
    fields = [
        "kind",
        "recipient",
        "state_label",
        "sent_at",
        "attempts",
        "error",
        "event_link",
        "subscription_link",
        "created_at",
    ]

    state_label = state_label

    @admin.display(description=_("event"))
    def event_link(self, obj: Notice) -> SafeString | str:
        if obj.event is None:  # a subscription's notice has none
            return "-" if obj.subscription_id else str(_("(pruned from the event log)"))
        return admin_link(obj.event, obj.event.event_id)

    @admin.display(description=_("subscription"))
    def subscription_link(self, obj: Notice) -> SafeString | str:
        return admin_link(obj.subscription)
