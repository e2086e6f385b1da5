"""Admin of mirrored customers, subscriptions and checkout sessions; shared admin helpers."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.admin.views.main import ERROR_FLAG
from django.db import DataError, models, router, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext_lazy

from .. import currencies, display
from ..exceptions import BillingError
from ..models import CheckoutSession, Customer, Subscription, SyncState, active_q, unknown_status_q
from ..outbox.retry import retry_failed_pushes

logger = logging.getLogger("billing_integration.admin")

if TYPE_CHECKING:
    from ..sync.pull import PullCounts  # imported where a pull runs (as the actions do)

    # generic in the stubs, not subscriptable at run time
    DjangoModelAdmin = admin.ModelAdmin[Any]
    TabularInline = admin.TabularInline[Any, Any]
    ModelForm = forms.ModelForm[Any]
    BaseInlineFormSet = forms.BaseInlineFormSet[Any, Any, Any]
else:
    DjangoModelAdmin, TabularInline = admin.ModelAdmin, admin.TabularInline
    ModelForm, BaseInlineFormSet = forms.ModelForm, forms.BaseInlineFormSet


class ModelAdmin(DjangoModelAdmin):
    """The base of the app's admins: its list answers a crafted parameter that would fail with a
    500 as Django answers any bad one, with a redirect to ``?e=1`` (see docs/admin.md)."""

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if request.method == "POST":  # an action's error is not hidden as ?e=1
            return super().changelist_view(request, extra_context)
        error = HttpResponseRedirect(f"{request.path}?{ERROR_FLAG}=1")
        if any("\x00" in value for _, values in request.GET.lists() for value in values):
            return error  # PostgreSQL refuses a NUL in text
        try:
            # A savepoint: a value the database refused leaves the request's transaction usable.
            with transaction.atomic(using=router.db_for_read(self.model)):
                return super().changelist_view(request, extra_context)
        # DataError: a value the database refuses; OverflowError: a date part past what
        # datetime() takes; ValueError: a year past 9999 (Django's datetime(10000, 1, 1)).
        except (DataError, OverflowError, ValueError) as exc:
            logger.warning("admin list %s refused: %s", request.path, type(exc).__name__)
            if set(request.GET) == {ERROR_FLAG}:  # a bug, not a parameter: no loop of redirects
                raise
            return error

    def page(self, request: HttpRequest, template: str, **context: Any) -> TemplateResponse:
        """A page of this admin's own views: ``template`` with the admin's context."""
        request.current_app = self.admin_site.name
        context = {**self.admin_site.each_context(request), "opts": self.opts, **context}
        return TemplateResponse(request, template, context)


#: Colours of the badges (sync states, event states, record statuses).
BADGE_COLOURS = {
    SyncState.SYNCED: "#2e7d32",
    SyncState.PENDING: "#9a6700",
    SyncState.FAILED: "#c62828",
    SyncState.NOT_SENT: "#d84315",
    "declared": "#9a6700",
    "no-cycles": "#c62828",
    "processed": "#2e7d32",
    "received": "#9a6700",
    "ignored": "#616161",
    "unrecognised": "#9a6700",
    "rejected": "#6a1b9a",
    "unknown-status": "#c62828",
}

NOT_MIRRORED_LABEL = _("not mirrored here")

#: The remote-state fields of every ``RemoteObject``, shown read-only.
REMOTE_STATE_READONLY = (
    "sync_badge",
    "sync_error_text",
    "remote_id",
    "remote_created",
    "remote_updated",
    "last_attempt_at",
    "last_synced_at",
)


def state_badge(value: str, label: str | None = None) -> SafeString:
    return format_html(
        '<span class="billing-badge billing-badge-{}" style="background:{};color:#fff;'
        'padding:1px 6px;border-radius:8px;font-size:11px;white-space:nowrap">{}</span>',
        value or "none",
        BADGE_COLOURS.get(value, "#616161"),
        label or value or "-",
    )


@admin.display(description=_("state"), ordering="state")
def state_label(self: Any, obj: Any) -> SafeString:
    """A row's ``state`` as a badge (an admin's ``state_label = state_label``)."""
    return state_badge(obj.state, str(obj.get_state_display()))


def admin_link(
    obj: models.Model | None, label: Any = None, missing: Any = None
) -> SafeString | str:
    """A link to the admin change page of ``obj`` (plain text if it has no admin); without
    ``obj``, ``missing`` (e.g. the remote id it is known by) or "-"."""
    if obj is None:
        return str(missing or "-")
    label = label if label is not None else display.object_label(obj)
    try:
        url = reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])
    except NoReverseMatch:
        return str(label)
    return format_html('<a href="{}">{}</a>', url, label)


def admin_links(objects: Iterable[models.Model]) -> SafeString | str:
    items = [(admin_link(o),) for o in objects]
    return format_html_join(mark_safe("<br>"), "{}", items) if items else "-"


def changelist_link(model: type[models.Model], label: Any, **params: Any) -> SafeString:
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return format_html('<a href="{}?{}">{}</a>', url, query, label)


#: A pull's counts in its message: the first three always, the others when not 0.
PULL_COUNTS = (
    ("created", ngettext_lazy("%(n)d created", "%(n)d created", "n")),
    ("updated", ngettext_lazy("%(n)d updated", "%(n)d updated", "n")),
    ("unchanged", ngettext_lazy("%(n)d unchanged", "%(n)d unchanged", "n")),
    (
        "skipped",
        ngettext_lazy(
            "%(n)d skipped (local changes pending)", "%(n)d skipped (local changes pending)", "n"
        ),
    ),
    (
        "stale",
        ngettext_lazy(
            "%(n)d stale (older than the stored state)",
            "%(n)d stale (older than the stored state)",
            "n",
        ),
    ),
    ("errors", ngettext_lazy("%(n)d not applied (bad data)", "%(n)d not applied (bad data)", "n")),
)


def pull_summary(counts: PullCounts) -> str:
    """What a pull did, for a message: "0 created, 2 updated, 5 unchanged", then the rows
    skipped, stale or not applied when there are some."""
    numbers = [(getattr(counts, name), text) for name, text in PULL_COUNTS]
    return ", ".join(str(text % {"n": n}) for i, (n, text) in enumerate(numbers) if n or i < 3)


class SyncStateAdminMixin(ModelAdmin):
    """Sync state badge, last error and the retry action for admins of ``RemoteObject`` models."""

    @admin.display(description=_("sync"), ordering="sync_state")
    def sync_badge(self, obj: Any) -> SafeString:
        return state_badge(obj.sync_state, obj.get_sync_state_display())

    @admin.display(description=_("last sync error"))
    def sync_error_text(self, obj: Any) -> SafeString | str:
        if not obj.sync_error:
            return "-"
        return format_html(
            '<pre style="white-space:pre-wrap;color:#c62828;margin:0">{}</pre>', obj.sync_error
        )

    @admin.display(description=_("last error"))
    def sync_error_short(self, obj: Any) -> str:
        error = obj.sync_error or ""
        return (error[:80] + "…") if len(error) > 80 else error

    def pull_now(self, request: HttpRequest, pull: Any, done: Any) -> bool:
        """Run ``pull()`` and say how it went (``done`` takes ``pull_summary`` of its counts
        as ``counts``)."""
        try:
            counts = pull()
        except BillingError as exc:
            self.message_user(request, _("Pull failed: %s") % exc, messages.ERROR)
            return False
        self.message_user(request, done % {"counts": pull_summary(counts)}, messages.SUCCESS)
        return True

    @admin.action(description=_("Retry failed push"), permissions=["change"])
    def retry_failed_push(self, request: HttpRequest, queryset: models.QuerySet[Any]) -> None:
        count = retry_failed_pushes(queryset)
        if not count:
            text = _("Nothing re-queued: none of the selected rows has a failed push.")
            self.message_user(request, text, messages.WARNING)
            return
        self.message_user(request, _("%d failed push(es) re-queued.") % count, messages.SUCCESS)


class NoDeleteMixin(ModelAdmin):
    """The service has no delete operation: nothing mirrored is deleted from the admin (nor
    offered: Django drops "Delete selected" without the delete permission)."""

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyAdminMixin(NoDeleteMixin):
    """No add, change or delete: every field of the fieldsets is read-only."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return flatten_fieldsets(self.get_fieldsets(request, obj))


class PageAdmin(ReadOnlyAdminMixin):
    """A page of its own over a proxy model (Health, Reports): its changelist view only, so
    an object's change or history URL is a 404."""

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [path("", self.admin_site.admin_view(self.changelist_view), name=name)]


@admin.register(Customer)
class CustomerAdmin(NoDeleteMixin, SyncStateAdminMixin, ModelAdmin):
    list_display = (
        "display_name",
        "identifier",
        "email",
        "subscriber_link",
        "status",
        "sync_badge",
        "remote_id",
        "sync_error_short",
    )
    list_filter = ("sync_state", "status")
    search_fields = ("identifier", "email", "first_name", "last_name", "remote_id")
    list_select_related = ("subscriber",)
    raw_id_fields = ("subscriber",)
    actions = ("sync_now", "retry_failed_push")
    remote_owned = ("address_line_1", "address_line_2", "phone", "status")
    #: Frozen once pushed: the service offers no customer update.
    creation_fields = ("subscriber", "identifier", "first_name", "last_name", "email")
    related_readonly = ("subscriptions_links", "checkout_sessions_links")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets: list[Any] = [
            (None, {"fields": self.creation_fields}),
            (_("Set by the billing service"), {"fields": self.remote_owned}),
        ]
        if obj is not None:
            fieldsets.append((_("Related"), {"fields": self.related_readonly}))
            fieldsets.append((_("Synchronisation"), {"fields": REMOTE_STATE_READONLY}))
        return fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        fields: tuple[str, ...] = self.remote_owned + self.related_readonly + REMOTE_STATE_READONLY
        if obj is not None and obj.remote_id is not None:
            fields = self.creation_fields + fields
        return fields

    def save_model(self, request: HttpRequest, obj: Customer, form: Any, change: bool) -> None:
        """An unchanged customer is not saved (a pushed one has nothing to change: the service
        has no customer update)."""
        if change and not form.has_changed():
            return
        super().save_model(request, obj, form, change)

    @admin.display(description=_("customer"), ordering="last_name")
    def display_name(self, obj: Customer) -> str:
        """Its name, else its subscriber's (never ``auth.user:4``)."""
        return display.customer_label(obj)

    @admin.display(description=_("subscriber"))
    def subscriber_link(self, obj: Customer) -> SafeString | str:
        return admin_link(obj.subscriber, display.customer_label(obj))

    @admin.display(description=_("subscriptions"))
    def subscriptions_links(self, obj: Customer) -> SafeString | str:
        return admin_links(obj.subscriptions.select_related("product", "customer"))

    @admin.display(description=_("checkout sessions"))
    def checkout_sessions_links(self, obj: Customer) -> SafeString | str:
        return admin_links(obj.checkout_sessions.all())

    @admin.action(
        description=_("Sync now (pull customers from the service)"), permissions=["change"]
    )
    def sync_now(self, request: HttpRequest, queryset: models.QuerySet[Customer]) -> None:
        from ..sync.pull import pull_customers

        self.pull_now(request, pull_customers, _("Customers pulled: %(counts)s."))


class AccessFilter(admin.SimpleListFilter):
    """Subscriptions by what the active rule makes of them now."""

    title = _("access")
    parameter_name = "access"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("active", _("grants access")),
            ("inactive", _("no access")),
            ("unknown", _("unknown status (no access)")),
        ]

    def queryset(
        self, request: HttpRequest, queryset: models.QuerySet[Any]
    ) -> models.QuerySet[Any]:
        if self.value() == "active":
            return queryset.filter(active_q())
        if self.value() == "inactive":
            return queryset.exclude(active_q())
        if self.value() == "unknown":
            return queryset.filter(unknown_status_q())
        return queryset


class StatusFilter(admin.SimpleListFilter):
    """Subscriptions by status label (with the raw value where two statuses share a label)."""

    title = _("status")
    parameter_name = "status"
    EMPTY = "-"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        values = Subscription.objects.order_by("status").values_list("status", flat=True).distinct()
        labels = {value: display.status_label(value) for value in values}
        uses = Counter(labels.values())
        choices = [
            (value or self.EMPTY, f"{label} ({value or '-'})" if uses[label] > 1 else label)
            for value, label in labels.items()
        ]
        return sorted(choices, key=lambda choice: str(choice[1]))

    def queryset(
        self, request: HttpRequest, queryset: models.QuerySet[Any]
    ) -> models.QuerySet[Any]:
        if (value := self.value()) is None:
            return queryset
        return queryset.filter(status="" if value == self.EMPTY else value)


@admin.display(description=_("product"), ordering="product__name")
def product_link(self: Any, obj: Any) -> SafeString | str:
    return admin_link(obj.product, missing=obj.product_remote_id)


def customer_link(customer: Customer | None, remote_id: Any = None) -> SafeString | str:
    return admin_link(customer, display.customer_label(customer), remote_id)


def subscription_label(subscription: Subscription) -> str:
    """The product and the customer's name: "Pro for Ada Lovelace" (never ``auth.user:4``)."""
    product = subscription.product.name if subscription.product else subscription.product_remote_id
    customer = display.customer_label(subscription.customer) or subscription.customer_remote_id
    return _("%(product)s for %(customer)s") % {"product": product, "customer": customer or "-"}


def subscription_link(
    subscription: Subscription | None, remote_id: Any = None, *, look_up: bool = True
) -> SafeString | str:
    if subscription is None and remote_id and look_up:
        subscription = (
            Subscription.objects.filter(remote_id=remote_id)
            .select_related("product", "customer__subscriber")
            .first()
        )
    if subscription is None and remote_id:
        return format_html('{} <span class="help">({})</span>', remote_id, NOT_MIRRORED_LABEL)
    if subscription is None:
        return "-"
    return admin_link(subscription, subscription_label(subscription))


class SessionAdmin(ReadOnlyAdminMixin, SyncStateAdminMixin, ModelAdmin):
    """What subscriptions and checkout sessions share: a customer, a product and a cycle."""

    list_select_related = ("customer__subscriber", "product")
    date_hierarchy = "created_at"

    @admin.display(description=_("billing cycle"), ordering="selected_billing_cycle")
    def cycle_display(self, obj: Subscription | CheckoutSession) -> str:
        return display.cycle_label(obj.selected_billing_cycle)


@admin.register(Subscription)
class SubscriptionAdmin(SessionAdmin):
    list_display = (
        "subscription_label",
        "customer_link",
        "product_link",
        "status_display",
        "cycle_display",
        "selected_currency",
        "auto_renew",
        "next_billing_date",
        "last_payment_status",
        "sync_badge",
        "remote_id",
    )
    list_filter = (AccessFilter, StatusFilter, "sync_state", "last_payment_status", "auto_renew")
    search_fields = (
        "remote_id",
        "customer__identifier",
        "customer__email",
        "product__name",
        "customer_remote_id",
        "product_remote_id",
    )
    fieldsets = (
        (None, {"fields": ("customer_link", "product_link", "status_display", "auto_renew")}),
        (
            _("Cycle"),
            {
                "fields": (
                    "cycle_display",
                    "selected_currency",
                    "cycle_start_date",
                    "cycle_end_date",
                    "next_billing_date",
                    "trial_end_date",
                    "last_payment_status",
                    "discount_coupon",
                )
            },
        ),
        (_("Records"), {"fields": ("payments_links", "invoices_links", "refunds_links")}),
        (
            _("Synchronisation"),
            {"fields": (*REMOTE_STATE_READONLY, "customer_remote_id", "product_remote_id")},
        ),
    )

    @admin.display(description=_("status"), ordering="status")
    def status_display(self, obj: Subscription) -> SafeString:
        """The status, with a red "no access" marker when it is unknown."""
        if not obj.has_unknown_status:
            return format_html(
                '<span style="color:{}" title="{}">{}</span>',
                "#2e7d32" if obj.is_active else "#616161",
                obj.status,
                display.status_label(obj),
            )
        label = _("unknown status — no access") if obj.status else _("no status — no access")
        return format_html("{} {}", obj.status, state_badge("unknown-status", str(label)))

    @admin.display(description=_("subscription"))
    def subscription_label(self, obj: Subscription) -> str:
        return subscription_label(obj)

    @admin.display(description=_("customer"), ordering="customer__identifier")
    def customer_link(self, obj: Subscription) -> SafeString | str:
        return customer_link(obj.customer, obj.customer_remote_id)

    product_link = product_link

    @admin.display(description=_("payments"))
    def payments_links(self, obj: Subscription) -> SafeString | str:
        return admin_links(obj.payments.all())

    @admin.display(description=_("invoices"))
    def invoices_links(self, obj: Subscription) -> SafeString | str:
        return admin_links(obj.invoices.all())

    @admin.display(description=_("refunds"))
    def refunds_links(self, obj: Subscription) -> SafeString | str:
        return admin_links(obj.refunds.all())


CHECKOUT_STATUS_HELP = _(
    "The service offers no way to read a checkout session back, so its status stays the one "
    "the service answered when it was created; an open session past its expiry shows as "
    "expired. The outcome of a checkout arrives by events and pulls: the customer's "
    "subscription and payments."
)


def expired_q() -> models.Q:
    """Open sessions past their expiry, which the list shows as "expired"."""
    return models.Q(status="open", completed_at__isnull=True, expires_at__lte=timezone.now())


class CheckoutStatusFilter(admin.SimpleListFilter):
    """Sessions by the status the column shows: "expired" rather than "open" past expiry."""

    title = _("status")
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        stored = CheckoutSession.objects.exclude(status__in=["", "expired"]).order_by("status")
        values = stored.values_list("status", flat=True).distinct()
        return [*((value, value) for value in values), ("expired", _("expired"))]

    def queryset(
        self, request: HttpRequest, queryset: models.QuerySet[Any]
    ) -> models.QuerySet[Any]:
        if (value := self.value()) is None:
            return queryset
        if value == "expired":
            return queryset.filter(expired_q() | models.Q(status=value))
        return queryset.filter(status=value).exclude(expired_q())


@admin.register(CheckoutSession)
class CheckoutSessionAdmin(SessionAdmin):
    list_display = (
        "session_label",
        "customer_link",
        "product_link",
        "status_display",
        "cycle_display",
        "currency_display",
        "expires_at",
        "completed_at",
        "sync_badge",
    )
    list_filter = (CheckoutStatusFilter, "sync_state", "action")
    search_fields = ("remote_id", "customer__identifier", "customer__email", "product__name")
    fieldsets = (
        (
            None,
            {
                "fields": ("customer_link", "product_link", "status_display", "action"),
                "description": CHECKOUT_STATUS_HELP,
            },
        ),
        (
            _("Details"),
            {
                "fields": (
                    "selected_billing_cycle",
                    "currency_display",
                    "expires_at",
                    "completed_at",
                    "returned_at",
                    "upgrade_to",
                    "downgrade_to",
                )
            },
        ),
        (_("Synchronisation"), {"fields": REMOTE_STATE_READONLY}),
    )

    def get_queryset(self, request: HttpRequest) -> models.QuerySet[CheckoutSession]:
        """Each session with ``expired`` (``expired_q``), as the status filter reads it."""
        expired = models.ExpressionWrapper(expired_q(), output_field=models.BooleanField())
        return super().get_queryset(request).annotate(expired=expired)

    @admin.display(description=_("checkout session"), ordering="created_at")
    def session_label(self, obj: CheckoutSession) -> str:
        return _("checkout %s") % (obj.remote_id or obj.pk)

    @admin.display(description=_("status"), ordering="status")
    def status_display(self, obj: Any) -> SafeString | str:
        """The status the service answered at creation; "expired" once past its expiry."""
        label = _("expired") if obj.expired else (obj.status or "-")
        return format_html('<span title="{}">{}</span>', CHECKOUT_STATUS_HELP, label)

    @admin.display(description=_("currency"), ordering="selected_currency")
    def currency_display(self, obj: CheckoutSession) -> str:
        return currencies.label(obj.selected_currency) or "-"

    @admin.display(description=_("customer"), ordering="customer__identifier")
    def customer_link(self, obj: CheckoutSession) -> SafeString | str:
        return customer_link(obj.customer)

    @admin.display(description=_("product"), ordering="product__name")
    def product_link(self, obj: CheckoutSession) -> SafeString | str:
        return admin_link(obj.product)
