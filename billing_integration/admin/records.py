"""Admin of invoices, payments and refunds: read-only records known only from events."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from django.contrib import admin
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from .. import display
from ..models import Invoice, Payment, Refund, Subscription
from .events import pretty_json
from .mirror import (
    BADGE_COLOURS,
    ModelAdmin,
    ReadOnlyAdminMixin,
    admin_link,
    admin_links,
    customer_link,
    product_link,
    state_badge,
    subscription_link,
)

RECORD_FIELDS = ("remote_id", "status_badge", "amount_display", "currency")
COMMON_LIST = (*RECORD_FIELDS, "customer_link", "subscription_link")
COMMON_SEARCH = (
    "remote_id",
    "customer__identifier",
    "customer__email",
    "customer_remote_id",
    "subscription_remote_id",
)
COMMON_SELECT = (
    "customer__subscriber",
    "subscription__product",
    "subscription__customer__subscriber",
)
#: The badge colour of each record status.
STATUS_COLOURS = {
    "paid": "processed",
    "completed": "processed",
    "approved": "processed",
    "failed": "failed",
    "void": "ignored",
    "canceled": "ignored",
    "rejected": "failed",
    "uncollectable": "failed",
    "deleted": "ignored",
    "initiated": "received",
}


class RecordAdmin(ReadOnlyAdminMixin, ModelAdmin):
    """Shared read-only layout of the three records."""

    list_filter: ClassVar[tuple[str, ...]] = ("status", "currency")
    search_fields: ClassVar[tuple[str, ...]] = COMMON_SEARCH
    date_hierarchy = "remote_created"
    list_select_related: ClassVar[tuple[str, ...]] = COMMON_SELECT
    detail_fields: ClassVar[Sequence[str]] = ()
    link_fields: ClassVar[Sequence[str]] = ("customer_link", "subscription_link")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        return (
            (None, {"fields": (*RECORD_FIELDS, *self.detail_fields)}),
            (_("Related"), {"fields": self.link_fields}),
            (
                _("Remote"),
                {
                    "fields": (
                        "remote_created",
                        "remote_updated",
                        "customer_remote_id",
                        "subscription_remote_id",
                        "remote_data_pretty",
                    )
                },
            ),
        )

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: Any) -> SafeString:
        key = STATUS_COLOURS.get(obj.status, obj.status)
        return state_badge(key if key in BADGE_COLOURS else obj.status, obj.get_status_display())

    @admin.display(description=_("amount"), ordering="amount")
    def amount_display(self, obj: Any) -> str:
        """In the currency's minor units, per the active language (never ``5000.0000``)."""
        return display.format_money(obj.amount, obj.currency) or "-"

    @admin.display(description=_("customer"), ordering="customer__identifier")
    def customer_link(self, obj: Any) -> SafeString | str:
        return customer_link(obj.customer, obj.customer_remote_id)

    product_link = product_link

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """The page's records whose subscription was mirrored after their event get it in one
        query for the page."""
        changelist = super().get_changelist_instance(request)
        waiting = [
            r
            for r in changelist.result_list
            if r.subscription_id is None and r.subscription_remote_id
        ]
        found = Subscription.objects.select_related("product", "customer__subscriber").in_bulk(
            {r.subscription_remote_id for r in waiting}, field_name="remote_id"
        )
        for record in waiting:
            record.subscription = found.get(record.subscription_remote_id)
            record.subscription_looked_up = True
        return changelist

    @admin.display(description=_("subscription"))
    def subscription_link(self, obj: Any) -> SafeString | str:
        looked_up = getattr(obj, "subscription_looked_up", False)
        return subscription_link(
            obj.subscription, obj.subscription_remote_id, look_up=not looked_up
        )

    @admin.display(description=_("raw data"))
    def remote_data_pretty(self, obj: Any) -> SafeString:
        return pretty_json(obj.remote_data)


@admin.register(Invoice)
class InvoiceAdmin(RecordAdmin):
    list_display = (*COMMON_LIST, "product_link", "period_start", "period_end")
    list_select_related = (*COMMON_SELECT, "product")
    search_fields = (*COMMON_SEARCH, "product__name")
    detail_fields = ("period_start", "period_end")
    link_fields = ("customer_link", "subscription_link", "product_link", "payments_links")

    @admin.display(description=_("payments"))
    def payments_links(self, obj: Invoice) -> SafeString | str:
        return admin_links(Payment.objects.filter(invoice_remote_id=obj.remote_id))


@admin.register(Payment)
class PaymentAdmin(RecordAdmin):
    list_display = (*COMMON_LIST, "product_link", "failure_reason_display")
    list_filter = ("status", "currency", "failure_reason")
    list_select_related = (*COMMON_SELECT, "product")
    search_fields = (*COMMON_SEARCH, "invoice_remote_id", "product__name")
    detail_fields = ("failure_reason_display",)
    link_fields = (
        "customer_link",
        "subscription_link",
        "product_link",
        "invoice_link",
        "refunds_links",
    )

    @admin.display(description=_("failure reason"), ordering="failure_reason")
    def failure_reason_display(self, obj: Payment) -> str:
        return display.failure_reason_label(obj.failure_reason) or "-"

    @admin.display(description=_("invoice"))
    def invoice_link(self, obj: Payment) -> SafeString | str:
        return admin_link(obj.invoice, missing=obj.invoice_remote_id)

    @admin.display(description=_("refunds"))
    def refunds_links(self, obj: Payment) -> SafeString | str:
        return admin_links(obj.refunds.all())


@admin.register(Refund)
class RefundAdmin(RecordAdmin):
    list_display = (*COMMON_LIST, "payment_link", "reason")
    list_select_related = (*COMMON_SELECT, "payment")
    search_fields = (*COMMON_SEARCH, "payment_remote_id", "reason")
    detail_fields = ("reason",)
    link_fields = ("customer_link", "subscription_link", "payment_link")

    @admin.display(description=_("payment"))
    def payment_link(self, obj: Refund) -> SafeString | str:
        return admin_link(obj.payment, missing=obj.payment_remote_id)
