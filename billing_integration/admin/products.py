"""Admin of products: cycles and prices inline, status and sync actions, pricing confirmation."""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import models, transaction
from django.db.models import Count
from django.forms.formsets import DELETION_FIELD_NAME
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from .. import currencies
from ..checkout.trials import MAX_TRIAL_DAYS
from ..exceptions import BillingConfigurationError
from ..mapping import products as product_map
from ..models import (
    LOCAL_FIELDS,
    BillingCycle,
    DeclaredCyclesNotSendable,
    Price,
    Product,
    ProductFeature,
    ProductStatus,
    Subscription,
    SyncState,
    active_q,
)
from ..models.products import MAX_PRICE_AMOUNT, PRICE_WHOLE_DIGITS
from .mirror import (
    REMOTE_STATE_READONLY,
    BaseInlineFormSet,
    ModelAdmin,
    ModelForm,
    NoDeleteMixin,
    SyncStateAdminMixin,
    TabularInline,
    admin_link,
    changelist_link,
    state_badge,
)

#: The POST flag that confirms a change of prices or cycles of a product with subscriptions.
CONFIRM_FIELD = "_confirm_pricing_change"
PRICE_CHANGE_WARNING = _(
    "Changes to prices and billing intervals may affect existing subscriptions."
)
#: The POST flag that confirms publishing again a product archived on the service.
REPUBLISH_FIELD = "_confirm_republish"
REPUBLISH_WARNING = _(
    "The service may refuse to publish an archived product again (it answers "
    "“invalid_transition”). Until the service confirms, the product stays off sale: the "
    "pricing page, the checkout button and checkout show it as archived, and this list "
    "says the service refused."
)
REPUBLISH_FORM_ERROR = _(
    "This product is archived on the service, which may refuse to publish it again. To "
    "try anyway, use the “Publish selected products” action on the product list: it says "
    "what happens first."
)
BACK_TO_DRAFT_FORM_ERROR = _(
    "This product is published or archived on the service: it cannot go back to draft there "
    "(the service refuses it). Archive it to take it off sale."
)
NO_CYCLE_ERROR = _(
    "A subscription product has at least one billing cycle: the service refuses one without."
)
ONE_TIME_PRICES_ERROR = _(
    "The service has no way to change the prices of a one-time product it has: they stay "
    "%(prices)s there. To sell at other prices, add a new product and archive this one."
)
NO_PRICE_ERROR = _("Give at least one price: the service refuses a price list without one.")
NO_CURRENCY_ERROR = _(
    "Tick at least one currency in “Currencies”: the service refuses a product sold in none."
)
NO_PRICE_PUBLISH_ERROR = _(
    "Not published, no price (the service refuses a new product without one; give it a "
    "price on its page first): %s."
)
NO_PRICE_ARCHIVE_ERROR = _(
    "Not archived, no price (the service refuses a new product without one; give it a "
    "price on its page first): %s."
)
ALREADY_ARCHIVED = _("Already archived, nothing sent: %s.")
PUBLISH_WAITING = _(
    "Already published, not confirmed by the service yet (its push is waiting); nothing "
    "sent again: %s."
)
UNKNOWN_CURRENCY_LABEL = _("id %(id)s (not in BILLING['CURRENCIES'])")
DECLARED_LABEL = _("declared here, not confirmed by the service")
NO_CYCLES_LABEL = _("no known cycles")
DECLARED_WARNING = _(
    "The billing cycles of “%(name)s” are declared here, not confirmed by the service: "
    "checkout offers them, but they are not sent (the service's blueprint of a product pulled "
    "from it is not known here). To make them its blueprint on the service, use “Send "
    "declared cycles to the service”."
)


#: Why prices differ from the service's, by the product's sync state (else not confirmed yet).
UNCONFIRMED_WHY: dict[str, Any] = {
    SyncState.FAILED: _("refused by the service"),
    SyncState.NOT_SENT: _("not sent (the service cannot receive it)"),
    SyncState.PENDING: _("not confirmed by the service yet"),
}


def unconfirmed_badge(product: Product, local: dict[int, Decimal], there: Any) -> Any:
    """A badge when the prices ``local`` differ from the service's, ``there`` (None: it does
    not hold them), else "-"."""
    if local == there:
        return "-"
    kind = product.sync_state if product.sync_state in UNCONFIRMED_WHY else str(SyncState.PENDING)
    where = (
        _("not sold there")
        if there is None
        else _("still %(prices)s there") % {"prices": format_amounts(there)}
    )
    return state_badge(
        kind, _("%(why)s: %(where)s") % {"why": UNCONFIRMED_WHY[kind], "where": where}
    )


class CycleBadgeMixin:
    @admin.display(description=_("on the service"))
    def cycle_badge(self, obj: BillingCycle) -> Any:
        """Declared (sold as declared), or not confirmed by the service yet (not sold; a
        changed price is sold at the service's)."""
        if obj.declared:
            return state_badge("declared", str(DECLARED_LABEL))
        if obj.pk is None:
            return "-"
        local = {price.currency_id: price.amount for price in obj.prices.all()}
        return unconfirmed_badge(obj.product, local, obj.product.confirmed_prices(obj))


def is_deleted(formset: Any, form: Any) -> bool:
    return bool(formset.can_delete and form.cleaned_data.get(DELETION_FIELD_NAME))


def kept_forms(formset: Any) -> list[Any]:
    """The cleaned forms of ``formset`` that are not marked for deletion."""
    return [f for f in formset.forms if hasattr(f, "cleaned_data") and not is_deleted(formset, f)]


def filled_forms(formset: Any) -> list[Any]:
    """The kept forms of a row saved or to be saved (not an untouched blank row)."""
    return [f for f in kept_forms(formset) if f.instance.pk is not None or f.has_changed()]


def check_amount(amount: Decimal) -> Decimal:
    """``amount`` if the service and a ``Price`` take it, else ``ValidationError``: 0 or more,
    at most two decimals, below ``MAX_PRICE_AMOUNT``."""
    exponent = amount.as_tuple().exponent  # a str only for NaN and infinities
    if amount < 0 or not isinstance(exponent, int) or exponent < -2:
        raise ValidationError(
            _("%(a)s: amounts are positive, with at most two decimals."), params={"a": amount}
        )
    if amount >= MAX_PRICE_AMOUNT:  # more than the column holds
        raise ValidationError(
            _("%(a)s: amounts have at most %(n)d digits before the decimal point."),
            params={"a": amount, "n": PRICE_WHOLE_DIGITS},
        )
    return amount


def parse_prices(text: str, stored: Iterable[int] = ()) -> dict[int, Decimal]:
    """``"XOF 10000, USD 19.99"`` (also ``;``, ``XOF=10000``, ``1:10000``) as ``{id: amount}``;
    an id of ``stored`` (the prices' currencies already) is read even if the table lacks it."""
    kept = {str(cid) for cid in stored}
    prices: dict[int, Decimal] = {}
    for raw in re.split(r"[,;\n]+", text or ""):
        item = raw.strip()
        if not item:
            continue
        match = re.fullmatch(r"([A-Za-z]{3}|\d+)\s*[=:\s]\s*(-?[\d.]+)", item)
        if not match:
            raise ValidationError(
                _("“%(item)s” is not a price: write a currency and an amount, e.g. XOF 10000."),
                params={"item": item},
            )
        currency, amount_text = match.groups()
        try:
            cid = int(currency) if currency in kept else currencies.currency_id(currency)
        except BillingConfigurationError:
            if currencies.is_id(currency):  # its digits, not int(): it may be too long to read
                raise ValidationError(
                    _("Unknown currency id %(c)s."), params={"c": currency.lstrip("0") or "0"}
                ) from None
            raise ValidationError(_("Unknown currency %(c)s."), params={"c": currency}) from None
        try:
            amount = Decimal(amount_text)
        except InvalidOperation:
            raise ValidationError(
                _("“%(a)s” is not an amount."), params={"a": amount_text}
            ) from None
        check_amount(amount)
        if cid in prices:
            raise ValidationError(_("Currency %(c)s appears twice."), params={"c": currency})
        prices[cid] = amount
    return prices


def format_prices(prices: list[Price]) -> str:
    """The compact text of prices (inverse of ``parse_prices``)."""
    return format_amounts({p.currency_id: p.amount for p in prices})


def format_amounts(amounts: dict[int, Decimal]) -> str:
    """``format_prices`` of ``{currency id: amount}``."""
    names = currencies.known()
    return ", ".join(f"{names.get(cid, cid)} {amount}" for cid, amount in sorted(amounts.items()))


def currency_choices(stored: Iterable[int]) -> list[tuple[int, Any]]:
    """The currencies of ``BILLING['CURRENCIES']``, then the ``stored`` ids it lacks (pulled as
    received: offered too, else a save drops them)."""
    known = currencies.known()
    unknown = sorted(set(stored) - set(known))
    return [*sorted(known.items()), *((c, UNKNOWN_CURRENCY_LABEL % {"id": c}) for c in unknown)]


class CycleForm(ModelForm):
    """A billing cycle's unit and frequency (the service refuses a frequency below 1)."""

    class Meta:
        model = BillingCycle
        fields = ("unit", "frequency")

    def clean_frequency(self) -> int:
        frequency: int = self.cleaned_data["frequency"]
        if frequency < 1:
            raise ValidationError(_("The frequency is at least 1 (every 1 month, 2 months, …)."))
        return frequency

    def validate_unique(self) -> None:
        """A cycle is once per product: checked also where the product is no field of the form
        (the cycle's own page), else a duplicate was an IntegrityError."""
        super().validate_unique()
        if "product" not in self.fields and not self.errors:
            try:
                self.instance.validate_constraints()
            except ValidationError as exc:
                self.add_error(None, exc)


class BillingCycleForm(CycleForm):
    prices = forms.CharField(
        label=_("prices"),
        required=False,
        widget=forms.TextInput(attrs={"size": 30, "placeholder": "XOF 10000, USD 19.99"}),
        help_text=_("Currency and amount, comma-separated, e.g. “XOF 10000, USD 19.99”."),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.was_new = self.instance.pk is None
        if not self.was_new:
            self.fields["prices"].initial = format_prices(list(self.instance.prices.all()))

    def clean_prices(self) -> dict[int, Decimal]:
        stored = [] if self.was_new else [p.currency_id for p in self.instance.prices.all()]
        if prices := parse_prices(self.cleaned_data.get("prices") or "", stored):
            return prices
        raise ValidationError(NO_PRICE_ERROR)

    def save(self, commit: bool = True) -> BillingCycle:
        """Also makes the cycle's prices those of the field, writing only the rows that differ."""
        cycle: BillingCycle = super().save(commit=commit)
        if not commit or ("prices" not in self.changed_data and not self.was_new):
            return cycle
        wanted: dict[int, Decimal] = self.cleaned_data.get("prices") or {}
        existing = {p.currency_id: p for p in cycle.prices.all()}
        for cid, price in existing.items():
            if cid not in wanted:
                price.delete()
            elif price.amount != wanted[cid]:
                price.amount = wanted[cid]
                price.save()
        for cid, amount in wanted.items():
            if cid not in existing:
                Price.objects.create(cycle=cycle, currency_id=cid, amount=amount)
        return cycle


class PriceFormSet(BaseInlineFormSet):
    """Price rows: one per currency (as ``parse_prices``), else the price is ambiguous."""

    def clean(self) -> None:
        super().clean()
        seen: set[int] = set()
        for form in kept_forms(self):
            cid = form.cleaned_data.get("currency_id")
            if cid in seen:
                raise ValidationError(
                    _("Currency %(c)s appears twice."), params={"c": currencies.label(cid)}
                )
            if cid is not None:
                seen.add(cid)


class CyclePriceFormSet(PriceFormSet):
    """A cycle's price rows: at least one."""

    def clean(self) -> None:
        super().clean()
        if not filled_forms(self):
            raise ValidationError(NO_PRICE_ERROR)


class NeverSentRowsFormSet(BaseInlineFormSet):
    """The rows of a product's prices: refused where a product of the other type would never
    send them; else none at all where the service would receive none (``empty_message``), and
    no currency, ticked or priced, is none."""

    refuse_for_one_time: bool
    message: Any
    empty_message: Any

    def clean(self) -> None:
        super().clean()
        product, rows = self.instance, filled_forms(self)
        if product.is_one_time == self.refuse_for_one_time:
            if rows:
                raise ValidationError(self.message)
            return
        if not rows and self.sends_rows(product):
            raise ValidationError(self.empty_message)
        if not product.selected_currencies and not any(map(self.priced, rows)):
            raise ValidationError(NO_CURRENCY_ERROR)

    def sends_rows(self, product: Product) -> bool:
        return product.remote_id is None

    def priced(self, form: Any) -> bool:
        """Whether ``form`` prices in a currency."""
        return form.cleaned_data.get("currency_id") is not None


class CycleFormSet(NeverSentRowsFormSet):
    refuse_for_one_time = True
    message = _(
        "A one-time product has no billing cycles (none would be sent): put its "
        "price in “Prices”, or remove the cycles."
    )
    empty_message = NO_CYCLE_ERROR

    def sends_rows(self, product: Product) -> bool:
        return product.remote_id is None or product.blueprint_known

    def priced(self, form: Any) -> bool:
        return bool(form.cleaned_data.get("prices"))


class RootPriceFormSet(NeverSentRowsFormSet, PriceFormSet):
    """A one-time product's price rows; changed, they must be the prices the service holds
    once it has the product (PATCH takes no ``prices``)."""

    refuse_for_one_time = False
    message = _(
        "A subscription product's prices go on its billing cycles (root prices "
        "would not be sent): remove them here."
    )
    empty_message = NO_PRICE_ERROR

    def clean(self) -> None:
        super().clean()
        product = self.instance
        if not product.is_one_time or product.remote_id is None or not self.has_changed():
            return
        # Held as the service's last answer states them; an answer without root prices
        # leaves the prices here the ones sold, free to change.
        remote = product.remote_data if isinstance(product.remote_data, dict) else {}
        held = product.confirmed_prices() if isinstance(remote.get("prices"), list) else None
        rows = filled_forms(self)
        wanted = {f.cleaned_data.get("currency_id"): f.cleaned_data.get("amount") for f in rows}
        if held is not None and wanted != held:
            raise ValidationError(ONE_TIME_PRICES_ERROR % {"prices": format_amounts(held)})


class BillingCycleInline(CycleBadgeMixin, TabularInline):
    model = BillingCycle
    form = BillingCycleForm
    formset = CycleFormSet
    fields = ("unit", "frequency", "prices", "cycle_badge")
    readonly_fields = ("cycle_badge",)
    extra = 1
    show_change_link = True
    verbose_name = _("billing cycle")
    verbose_name_plural = _("billing cycles (subscription products)")

    def get_queryset(self, request: HttpRequest) -> models.QuerySet[BillingCycle]:
        return super().get_queryset(request).select_related("product").prefetch_related("prices")

    @admin.display(description=_("prices"))
    def prices(self, obj: BillingCycle) -> str:
        return format_prices(list(obj.prices.all())) or "-"

    def get_extra(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> int:
        return 0 if obj is not None and (obj.is_one_time or obj.cycles.exists()) else 1


class PriceInlineForm(ModelForm):
    currency_id = forms.TypedChoiceField(label=_("currency"), coerce=int)

    class Meta:
        model = Price
        fields = ("currency_id", "amount")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        stored = self.instance.currency_id
        field = cast(forms.ChoiceField, self.fields["currency_id"])
        field.choices = [("", "---------"), *currency_choices([] if stored is None else [stored])]

    def clean_amount(self) -> Decimal | None:
        """As in ``parse_prices`` (the service refuses an amount below 0)."""
        amount: Decimal | None = self.cleaned_data.get("amount")
        return None if amount is None else check_amount(amount)


class CyclePriceInline(TabularInline):
    model = Price
    fk_name = "cycle"
    form = PriceInlineForm
    formset: type[PriceFormSet] = CyclePriceFormSet
    fields = ["currency_id", "amount"]
    extra = 1


class RootPriceInline(CyclePriceInline):
    fk_name = "product"
    formset = RootPriceFormSet
    fields = ["currency_id", "amount", "price_badge"]
    readonly_fields = ("price_badge",)
    extra = 0
    verbose_name = _("price")
    verbose_name_plural = _("prices (one-time products)")

    def get_queryset(self, request: HttpRequest) -> models.QuerySet[Price]:
        return super().get_queryset(request).select_related("product")

    @admin.display(description=_("on the service"))
    def price_badge(self, obj: Price) -> Any:
        """Whether the service has this price (its last answer's root ``prices``)."""
        if obj.product is None or obj.pk is None:
            return "-"
        held = (obj.product.confirmed_prices() or {}).get(obj.currency_id)
        there = None if held is None else {obj.currency_id: held}
        return unconfirmed_badge(obj.product, {obj.currency_id: obj.amount}, there)


class ProductFeatureForm(ModelForm):
    class Meta:
        model = ProductFeature
        fields = ("key", "limit")

    def clean_key(self) -> str:
        """Lower-cased as stored, so that the formset finds a key given twice in two cases."""
        return str(self.cleaned_data["key"]).lower()


class ProductFeatureInline(TabularInline):
    """Features declared here (read by ``access.has_feature``); never pushed."""

    model = ProductFeature
    form = ProductFeatureForm
    fields = ("key", "limit")
    extra = 0
    verbose_name = _("feature")
    verbose_name_plural = _(
        "features (kept here; the service's API has no way to receive features)"
    )


class ProductForm(ModelForm):
    selected_currencies = forms.TypedMultipleChoiceField(
        label=_("Currencies"),
        coerce=int,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text=_("Currencies the product is sold in. Currencies of its prices are added."),
    )

    class Meta:
        model = Product
        fields = (
            "name",
            "description",
            "product_type",
            "status",
            "selected_currencies",
            "add_on",
            "plan_group",
            "multiple_purchases",
            "trial_days",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        stored = [int(c) for c in self.instance.selected_currencies or []]
        if self.instance.pk is not None:
            self.initial["selected_currencies"] = stored
        field = cast(forms.ChoiceField, self.fields["selected_currencies"])
        field.choices = currency_choices(stored)

    def clean_trial_days(self) -> int | None:
        """At most ``MAX_TRIAL_DAYS``, the longest trial ``start_trial`` starts."""
        days: int | None = self.cleaned_data.get("trial_days")
        if days is not None and days > MAX_TRIAL_DAYS:
            raise ValidationError(
                _("A free trial lasts at most %(days)s days."), params={"days": MAX_TRIAL_DAYS}
            )
        return days

    def clean_status(self) -> str:
        """A product the service knows: archived (there, or here and not refused there), it is
        published again only by the action; published or archived there, it never goes back
        to draft. (``self.instance`` is still the stored row here: the form's values reach it
        after the fields are cleaned.)"""
        status: str = self.cleaned_data["status"]
        stored = self.instance
        if stored.pk is None or stored.remote_id is None:
            return status
        if status == ProductStatus.PUBLISHED and stored.confirmed_status == ProductStatus.ARCHIVED:
            raise ValidationError(REPUBLISH_FORM_ERROR)
        if status == ProductStatus.DRAFT and stored.confirmed_status != ProductStatus.DRAFT:
            raise ValidationError(BACK_TO_DRAFT_FORM_ERROR)
        return status


def formset_changes(formset: Any) -> list[str]:
    """Human descriptions of what a valid cycle or price formset would change."""
    changes: list[str] = []
    for form in formset.forms:
        deleted = is_deleted(formset, form)
        instance = form.instance
        if deleted and instance.pk:
            changes.append(_("remove %s") % instance)
        elif deleted or not form.has_changed():
            continue
        elif instance.pk is None:
            shown = ("unit", "frequency", "currency_id", "amount")
            label = ", ".join(f"{k}={v}" for k, v in form.cleaned_data.items() if k in shown)
            changes.append(_("add %s") % label)
        else:
            changes.append(
                _("change %(obj)s (%(fields)s)")
                % {"obj": instance, "fields": ", ".join(form.changed_data)}
            )
    return changes


class PricingConfirmationAdmin(ModelAdmin):
    """Confirms a change of cycles or prices of a product with subscriptions (``CONFIRM_FIELD``)."""

    def pricing_changes(self, request: HttpRequest, obj: Any) -> tuple[Product, list[str]]:
        """The product concerned and the changes the valid POST would make (none if invalid)."""
        form = self.get_form(request, obj, change=True)(request.POST, request.FILES, instance=obj)
        formsets = []
        for formset_class, inline in self.get_formsets_with_inlines(request, obj):
            prefix = formset_class.get_default_prefix()
            formsets.append(formset_class(**self.get_formset_kwargs(request, obj, inline, prefix)))
        product = obj if isinstance(obj, Product) else obj.product
        if not (form.is_valid() and all(fs.is_valid() for fs in formsets)):
            return product, []
        priced = [fs for fs in formsets if fs.model in (BillingCycle, Price)]
        changes = [change for fs in priced for change in formset_changes(fs)]
        if isinstance(obj, BillingCycle) and form.has_changed():
            changes.insert(0, _("change cycle %s") % obj)
        return product, changes

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if request.method == "POST" and object_id and CONFIRM_FIELD not in request.POST:
            response = self.pricing_confirmation(request, object_id)
            if response is not None:
                return response
        return super().changeform_view(request, object_id, form_url, extra_context)

    def pricing_confirmation(self, request: HttpRequest, object_id: str) -> HttpResponse | None:
        obj = self.get_object(request, unquote(object_id))
        if obj is None or not self.has_change_permission(request, obj):
            return None
        product, changes = self.pricing_changes(request, obj)
        total = product.subscriptions.count() if changes else 0
        if not total or (not product.is_one_time and not product.blueprint_known):
            return None  # declared cycles reach no subscription (sending them asks instead)
        return self.page(
            request,
            "admin/billing_integration/product/confirm_pricing_change.html",
            title=_("Confirm the change of prices or billing cycles"),
            object=product,
            opts=Product._meta,
            changes=changes,
            subscription_count=total,
            active_count=Subscription.objects.for_product(product).active().count(),
            warning=PRICE_CHANGE_WARNING,
            post_items=[
                (key, value)
                for key, values in request.POST.lists()
                if key != "csrfmiddlewaretoken"
                for value in values
            ],
            confirm_field=CONFIRM_FIELD,
            change_url=request.path,
        )


class CyclesListFilter(admin.SimpleListFilter):
    """Subscription products that cannot be sold (no cycle), or whose cycles are declared."""

    title = _("billing cycles")
    parameter_name = "cycles"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("none", NO_CYCLES_LABEL), ("declared", DECLARED_LABEL)]

    def queryset(
        self, request: HttpRequest, queryset: models.QuerySet[Product]
    ) -> models.QuerySet[Product]:
        if self.value() == "none":
            return queryset.filter(pk__in=Product.objects.without_cycles().values("pk"))
        if self.value() == "declared":
            return queryset.filter(pk__in=Product.objects.with_declared_cycles().values("pk"))
        return queryset


@admin.register(Product)
class ProductAdmin(NoDeleteMixin, SyncStateAdminMixin, PricingConfirmationAdmin):
    form = ProductForm
    inlines = (BillingCycleInline, RootPriceInline, ProductFeatureInline)
    list_display = (
        "name",
        "product_type",
        "cycles_column",
        "status_column",
        "sync_badge",
        "remote_id",
        "subscriber_count",
        "sync_error_short",
    )
    list_filter = ("status", "product_type", "sync_state", CyclesListFilter)
    search_fields = ("name", "description", "remote_id")
    actions = ("publish", "archive", "sync_now", "retry_failed_push", "send_declared_cycles")
    change_form_template = "admin/billing_integration/product/change_form.html"
    readonly_fields = (*REMOTE_STATE_READONLY, "cycles_column", "subscriptions_link")
    fieldsets = (
        (
            None,
            {"fields": ("name", "description", "product_type", "status", "selected_currencies")},
        ),
        (
            _("One plan at a time"),
            {
                "fields": ("add_on", "plan_group", "multiple_purchases", "trial_days"),
                "description": _(
                    "A subscriber holds one recurring plan of a group at a time: checkout "
                    "refuses a second plan beside a first that may still renew. Mark an "
                    "add-on, or put the product in another group, to sell it beside a plan."
                ),
            },
        ),
        (_("Synchronisation"), {"fields": readonly_fields}),
    )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """The type, once the service has the product: no request changes it there. The status
        on the add form of a user who may not change products: a draft (publishing and
        archiving take the change permission)."""
        if obj is not None and obj.remote_id is not None:
            return (*self.readonly_fields, "product_type")
        if obj is None and not self.has_change_permission(request):
            return (*self.readonly_fields, "status")
        return self.readonly_fields

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """No synchronisation state on the add form (nothing is saved yet)."""
        return self.fieldsets if obj is not None else self.fieldsets[:-1]

    def get_object_or_404(self, request: HttpRequest, object_id: str) -> Product:
        obj: Product | None = self.get_object(request, unquote(object_id))
        if obj is None:
            raise Http404(_("No product with the key “%s”.") % object_id)
        if not self.has_change_permission(request, obj):
            raise PermissionDenied
        return obj

    def get_queryset(self, request: HttpRequest) -> models.QuerySet[Product]:
        """Counted for the list's columns (the change page's object comes from here too)."""
        products: models.QuerySet[Product] = super().get_queryset(request)
        return products.annotate(
            _subscriber_count=Count(
                "subscriptions", filter=active_q(prefix="subscriptions__"), distinct=True
            ),
            _cycle_count=Count("cycles", distinct=True),
            _declared_count=Count("cycles", filter=models.Q(cycles__declared=True), distinct=True),
        )

    @admin.display(description=_("status"), ordering="status")
    def status_column(self, obj: Product) -> Any:
        """The status, and the service's when it refused a change of it or has not confirmed
        it yet (what is sold)."""
        if obj.confirmed_status == obj.status:
            return obj.get_status_display()
        there = {"status": ProductStatus(obj.confirmed_status).label}
        if obj.sync_state == SyncState.FAILED:
            kind, note = "failed", _("refused by the service: still %(status)s there")
        else:
            kind, note = "pending", _("not confirmed by the service yet: still %(status)s there")
        return format_html("{} {}", obj.get_status_display(), state_badge(kind, note % there))

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if request.method == "GET":
            obj = self.get_object(request, unquote(object_id))
            if (
                obj is not None
                and obj.sync_state == SyncState.FAILED
                and obj.confirmed_status != obj.status
            ):
                self.message_user(request, refused_message(obj), messages.WARNING)
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description=_("billing cycles"))
    def cycles_column(self, obj: Product) -> Any:
        """Flags a subscription product with no known cycle, and one with declared cycles."""
        if obj.is_one_time:
            return "-"
        total, declared = obj._cycle_count, obj._declared_count  # type: ignore[attr-defined]
        if not total:
            return state_badge("no-cycles", str(NO_CYCLES_LABEL))
        if declared:
            return state_badge(
                "declared", _("%(n)d declared here, not confirmed by the service") % {"n": declared}
            )
        return str(total)

    @admin.display(description=_("subscriptions"), ordering="_subscriber_count")
    def subscriber_count(self, obj: Product) -> Any:
        count = obj._subscriber_count  # type: ignore[attr-defined]
        return changelist_link(Subscription, count, product__id__exact=obj.pk) if count else 0

    @admin.display(description=_("subscriptions"))
    def subscriptions_link(self, obj: Product) -> Any:
        label = _("%d subscription(s)") % obj.subscriptions.count()
        return changelist_link(Subscription, label, product__id__exact=obj.pk)

    def object_url(self, name: str, obj: Product) -> str:
        """The URL of one of this admin's pages of ``obj`` ("change", "archive", ...)."""
        opts = self.opts
        return reverse(f"admin:{opts.app_label}_{opts.model_name}_{name}", args=[obj.pk])

    def get_urls(self) -> list[Any]:
        pre = f"{self.opts.app_label}_{self.opts.model_name}_"
        archive = self.admin_site.admin_view(self.archive_view)
        send = self.admin_site.admin_view(self.send_declared_cycles_view)
        return [
            path("<path:object_id>/archive/", archive, name=f"{pre}archive"),
            path("<path:object_id>/send-declared-cycles/", send, name=f"{pre}send_declared_cycles"),
            *super().get_urls(),
        ]

    def push_declared_cycles(self, request: HttpRequest, product: Product, level: int) -> bool:
        """Send ``product``'s declared cycles and log it, or say (at ``level``) why not."""
        from ..outbox.signals import send_declared_cycles

        try:
            send_declared_cycles(product)
        except DeclaredCyclesNotSendable as exc:
            self.message_user(request, str(exc), level)
            return False
        self.log_change(request, product, [{"changed": {"fields": ["billing cycles"]}}])
        return True

    def send_declared_cycles_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: what would be sent (it replaces the service's blueprint); POST: send it."""
        obj = self.get_object_or_404(request, object_id)
        change_url = self.object_url("change", obj)
        if request.method == "POST":
            if self.push_declared_cycles(request, obj, messages.ERROR):
                self.message_user(
                    request,
                    _("The declared cycles of “%s” are being sent to the service.") % obj,
                    messages.SUCCESS,
                )
            return HttpResponseRedirect(change_url)
        return self.page(
            request,
            "admin/billing_integration/product/send_declared_cycles.html",
            title=_("Send the declared cycles of %s") % obj,
            object=obj,
            change_url=change_url,
            cycles=list(obj.cycles.prefetch_related("prices")),
            subscription_count=obj.subscriptions.count(),
            warning=PRICE_CHANGE_WARNING,
        )

    def archive_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: a confirmation page (back to the change page if archived); POST: archive the
        product (pushed like any change)."""
        obj = self.get_object_or_404(request, object_id)
        change_url = self.object_url("change", obj)
        if request.method == "POST":
            self.set_status(request, Product.objects.filter(pk=obj.pk), ProductStatus.ARCHIVED)
            return HttpResponseRedirect(change_url)
        if obj.status == ProductStatus.ARCHIVED:  # the change page says if the service refused
            if obj.confirmed_status == ProductStatus.ARCHIVED:
                self.message_user(request, ALREADY_ARCHIVED % obj.name, messages.INFO)
            return HttpResponseRedirect(change_url)
        return self.page(
            request,
            "admin/billing_integration/product/archive_confirmation.html",
            title=_("Archive %s") % obj,
            object=obj,
            change_url=change_url,
            subscription_count=obj.subscriptions.count(),
        )

    def set_status(
        self, request: HttpRequest, queryset: models.QuerySet[Product], status: str
    ) -> None:
        archiving = status == ProductStatus.ARCHIVED
        # The service refuses to create a product with no price (in any status).
        new = queryset.filter(remote_id__isnull=True).exclude(status=status)
        unpriced = new.exclude(cycles__prices__isnull=False).exclude(root_prices__isnull=False)
        if names := sorted(unpriced.values_list("name", flat=True)):
            refused = NO_PRICE_ARCHIVE_ERROR if archiving else NO_PRICE_PUBLISH_ERROR
            self.message_user(request, refused % ", ".join(names), messages.ERROR)
            queryset = queryset.exclude(pk__in=unpriced.values("pk"))
        pks = list(queryset.values_list("pk", flat=True))
        with transaction.atomic():
            # Locked in primary-key order, the order a pull locks them in.
            rows = Product.objects.filter(pk__in=pks).exclude(status=status).order_by("pk")
            rows = rows.select_for_update()
            for product in rows:
                product.archive() if archiving else product.publish()
                self.log_change(request, product, [{"changed": {"fields": ["status"]}}])
        if rows:
            done = (
                _("%d product(s) archived; the change is being pushed.")
                if archiving
                else _("%d product(s) published; the change is being pushed.")
            )
            self.message_user(request, done % len(rows), messages.SUCCESS)
        changed = {product.pk for product in rows}
        unchanged = [p for p in queryset.order_by("name") if p.pk not in changed]
        unconfirmed = [p for p in unchanged if p.confirmed_status != status]
        for product in unconfirmed:  # in this status here, but the service refused it: say so
            if product.sync_state == SyncState.FAILED:
                self.message_user(request, refused_message(product), messages.WARNING)
        # Else its push is waiting (only a publication is, see Product.confirmed_status).
        if waiting := [p.name for p in unconfirmed if p.sync_state != SyncState.FAILED]:
            self.message_user(request, PUBLISH_WAITING % ", ".join(waiting), messages.INFO)
        if already := [p.name for p in unchanged if p.confirmed_status == status]:
            left = ALREADY_ARCHIVED if archiving else _("Already published, nothing sent: %s.")
            self.message_user(request, left % ", ".join(already), messages.INFO)

    @admin.action(description=_("Publish selected products"), permissions=["change"])
    def publish(
        self, request: HttpRequest, queryset: models.QuerySet[Product]
    ) -> HttpResponse | None:
        """Publish; a product archived on the service (or here, not refused there) asks for
        confirmation first."""
        known = queryset.filter(status=ProductStatus.ARCHIVED, remote_id__isnull=False)
        archived = [p for p in known if p.confirmed_status == ProductStatus.ARCHIVED]
        if archived and not request.POST.get(REPUBLISH_FIELD):
            return self.page(
                request,
                "admin/billing_integration/product/republish_confirmation.html",
                title=_("Publish archived products again?"),
                archived=archived,
                selected=queryset.values_list("pk", flat=True),
                action_checkbox_name=helpers.ACTION_CHECKBOX_NAME,
                confirm_field=REPUBLISH_FIELD,
                warning=REPUBLISH_WARNING,
            )
        self.set_status(request, queryset, ProductStatus.PUBLISHED)
        if archived:
            self.message_user(request, REPUBLISH_WARNING, messages.WARNING)
        return None

    @admin.action(description=_("Archive selected products"), permissions=["change"])
    def archive(self, request: HttpRequest, queryset: models.QuerySet[Product]) -> None:
        self.set_status(request, queryset, ProductStatus.ARCHIVED)

    @admin.action(
        description=_("Sync now (pull products from the service)"), permissions=["change"]
    )
    def sync_now(self, request: HttpRequest, queryset: models.QuerySet[Product]) -> None:
        from ..sync.pull import products_without_cycles, pull_products

        if not self.pull_now(request, pull_products, _("Products pulled: %(counts)s.")):
            return
        if unsellable := products_without_cycles():
            self.message_user(
                request,
                _(
                    "%(n)d product(s) on the service have no known billing cycles, so checkout "
                    "refuses them: %(names)s. Declare their cycles on each product's page "
                    "(filter “billing cycles: no known cycles”)."
                )
                % {"n": len(unsellable), "names": ", ".join(p.name for p in unsellable[:20])},
                messages.WARNING,
            )

    @admin.action(description=_("Send declared cycles to the service"), permissions=["change"])
    def send_declared_cycles(
        self, request: HttpRequest, queryset: models.QuerySet[Product]
    ) -> None:
        """Push the declared cycles of the selected products as their blueprints."""
        declared = queryset.filter(pk__in=Product.objects.with_declared_cycles().values("pk"))
        sent = [
            product.name
            for product in declared
            if self.push_declared_cycles(request, product, messages.WARNING)
        ]
        if sent:
            message = _("Declared cycles being sent for: %s.") % ", ".join(sent)
            self.message_user(request, message, messages.SUCCESS)
        elif not declared.exists():  # else each refusal was said above
            none = _("None of the selected products has declared cycles.")
            self.message_user(request, none, messages.WARNING)

    def save_model(self, request: HttpRequest, obj: Product, form: Any, change: bool) -> None:
        """An unchanged product is not saved; a change of ``LOCAL_FIELDS`` only is not pushed."""
        if change and not form.has_changed():
            return
        if change and set(form.changed_data) <= LOCAL_FIELDS:
            obj.save(update_fields=[*form.changed_data, "updated_at"])
            return
        super().save_model(request, obj, form, change)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """Adds the prices' currencies to the product, and says when the change is not sent."""
        super().save_related(request, form, formsets, change)
        product = form.instance
        product.add_priced_currencies()
        if product.remote_id is None:
            return
        cycles_saved = any(fs.model is BillingCycle and fs.has_changed() for fs in formsets)
        if cycles_saved and product.cycles.filter(declared=True).exists():
            self.message_user(request, DECLARED_WARNING % {"name": product}, messages.WARNING)
        if note := product_map.not_carried(product):
            self.message_user(request, f"{note} {_('The local change is kept.')}", messages.WARNING)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> Any:
        if obj is not None:
            may_change = self.has_change_permission(request, obj)
            context["archive_url"] = self.object_url("archive", obj)
            context["can_archive"] = obj.status != ProductStatus.ARCHIVED and may_change
            context["send_declared_url"] = self.object_url("send_declared_cycles", obj)
            context["can_send_declared"] = (
                obj.remote_id is not None
                and may_change
                and obj.cycles.filter(declared=True).exists()
            )
        return super().render_change_form(request, context, add, change, form_url, obj)


def refused_message(product: Product) -> str:
    """What the admin says of a product whose status change the service refused."""
    return _(
        "The service refused to make “%(name)s” %(status)s: it is still %(confirmed)s there, "
        "and it is sold as such (checkout and the pricing page show it as %(confirmed)s)."
    ) % {
        "name": product.name,
        "status": product.get_status_display().lower(),
        "confirmed": ProductStatus(product.confirmed_status).label.lower(),
    }


@admin.register(BillingCycle)
class BillingCycleAdmin(CycleBadgeMixin, PricingConfirmationAdmin):
    form = CycleForm
    fields = ("product_link", "unit", "frequency", "cycle_badge")
    readonly_fields = ("product_link", "cycle_badge")
    inlines = (CyclePriceInline,)
    list_select_related = ("product",)

    def get_model_perms(self, request: HttpRequest) -> dict[str, bool]:
        return {}  # reached from the product page only, not listed on the index

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # cycles are added on the product page

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # removed on the product page (with the subscriptions confirmation)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Also the product's change permission: a cycle's change pushes its product."""
        product_admin = self.admin_site.get_model_admin(Product)
        product = obj.product if obj is not None else None
        if not super().has_change_permission(request, obj):
            return False
        return product_admin.has_change_permission(request, product)

    @admin.display(description=_("product"))
    def product_link(self, obj: BillingCycle) -> Any:
        return admin_link(obj.product)

    def save_model(self, request: HttpRequest, obj: BillingCycle, form: Any, change: bool) -> None:
        """An unchanged cycle is not saved: a save pushes the product's whole blueprint."""
        if change and not form.has_changed():
            return
        super().save_model(request, obj, form, change)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        cycle = form.instance
        if cycle.declared and (form.has_changed() or any(fs.has_changed() for fs in formsets)):
            self.message_user(request, DECLARED_WARNING % {"name": cycle.product}, messages.WARNING)
