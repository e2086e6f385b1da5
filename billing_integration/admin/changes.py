"""Admin of the change requests (the staff's list, with "done on the service") and of the
switched-off guesses (delete a row to try the guess again)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..checkout import changes
from ..models import ChangeRequest, SwitchedOffGuess
from .mirror import ModelAdmin, NoDeleteMixin, admin_link, state_label


@admin.register(ChangeRequest)
class ChangeRequestAdmin(NoDeleteMixin, ModelAdmin):
    list_display = [
        "created_at",
        "customer_link",
        "kind",
        "summary",
        "via",
        "state_label",
        "staff_done_at",
        "confirmed_at",
    ]
    list_filter = ["state", "kind", "via"]
    search_fields = ["customer__email", "customer__identifier", "subscription__remote_id"]
    list_select_related = ["customer", "subscription__product", "target_product"]
    actions = ["mark_done"]
    readonly_fields = (
        "customer_link",
        "subscription_link",
        "kind",
        "summary",
        "via",
        "state_label",
        "created_at",
        "staff_done_at",
        "confirmed_at",
    )
    fields = readonly_fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("customer"), ordering="customer")
    def customer_link(self, obj: ChangeRequest) -> SafeString | str:
        return admin_link(obj.customer, str(obj.customer))

    @admin.display(description=_("subscription"))
    def subscription_link(self, obj: ChangeRequest) -> SafeString | str:
        return admin_link(obj.subscription, str(obj.subscription.remote_id))

    @admin.display(description=_("what"))
    def summary(self, obj: ChangeRequest) -> str:
        return changes.describe(obj)

    state_label = state_label

    @admin.action(description=_("Done on the service"), permissions=["change"])
    def mark_done(self, request: HttpRequest, queryset: QuerySet[ChangeRequest]) -> None:
        count = changes.mark_done_by_staff(queryset)
        if not count:
            nothing = _(
                "Nothing marked: none of the selected requests is pending and not yet done."
            )
            self.message_user(request, nothing, messages.WARNING)
            return
        text = ngettext(
            "%(count)d request marked done on the service; it is shown done once the "
            "service shows it (an event or the next pull).",
            "%(count)d requests marked done on the service; they are shown done once the "
            "service shows them (an event or the next pull).",
            count,
        )
        self.message_user(request, text % {"count": count}, messages.SUCCESS)


@admin.register(SwitchedOffGuess)
class SwitchedOffGuessAdmin(ModelAdmin):
    list_display = ["name", "status", "operation", "at"]
    readonly_fields = ("name", "status", "operation", "at")
    fields = readonly_fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
