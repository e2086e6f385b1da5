"""Products, their billing cycles, prices and declared features (a product is never deleted)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db import models
from django.db.models.deletion import ProtectedError
from django.utils.translation import gettext_lazy as _

from ..context import is_from_remote
from ..currencies import is_id, label, whole
from ..exceptions import BillingError
from .base import AtomicSaveMixin, RemoteObject, SyncState

__all__ = ["LOCAL_FIELDS", "BillingCycle", "CycleUnit", "DeclaredCyclesNotSendable", "Price"]
__all__ += ["Product", "ProductDeletionRefused", "ProductFeature", "ProductStatus", "ProductType"]

#: Fields kept here only (the service has none such): a save of only these is not pushed.
LOCAL_FIELDS = frozenset({"add_on", "plan_group", "multiple_purchases", "trial_days"})

DELETE_MESSAGE = (
    "Billing products are never deleted: the billing service keeps their history and has "
    "no delete operation. Archive the product instead (status = 'archived')."
)


class ProductDeletionRefused(BillingError, ProtectedError):
    def __init__(self, objects: Any = ()) -> None:
        ProtectedError.__init__(self, DELETE_MESSAGE, objects)


class DeclaredCyclesNotSendable(BillingError):
    """``send_declared_cycles`` was asked for a product with no declared cycles to send."""


class ProductStatus(models.TextChoices):
    DRAFT = "draft", _("Draft")
    PUBLISHED = "published", _("Published")
    ARCHIVED = "archived", _("Archived")


class ProductType(models.TextChoices):
    SUBSCRIPTION = "subscription", _("Subscription (recurring)")
    ONE_TIME = "one_time", _("One-time")


class CycleUnit(models.TextChoices):
    MONTHS = "months", _("Months")
    YEARS = "years", _("Years")


class ProductQuerySet(models.QuerySet["Product"]):
    def published(self) -> ProductQuerySet:
        return self.filter(status=ProductStatus.PUBLISHED)

    def on_sale(self) -> ProductQuerySet:
        """Published products the service is known to sell (``confirmed_status``)."""
        refused = models.Q(
            # the service's status as the mapping reads it: any case, spaces around
            remote_data__status__iregex=r"^\s*(draft|archived)\s*$",
        )
        return self.published().exclude(pk__in=self.filter(refused).values("pk"))

    def subscriptions(self) -> ProductQuerySet:
        return self.filter(product_type=ProductType.SUBSCRIPTION)

    def without_cycles(self) -> ProductQuerySet:
        """Subscription products with no billing cycle (checkout refuses them)."""
        return self.subscriptions().filter(cycles__isnull=True)

    def with_declared_cycles(self) -> ProductQuerySet:
        return self.filter(cycles__declared=True).distinct()

    def archive(self) -> int:
        """Archive every product of the queryset, one save each (so each is pushed)."""
        products = list(self.exclude(status=ProductStatus.ARCHIVED))
        for product in products:
            product.archive()
        return len(products)

    def delete(self) -> Any:
        raise ProductDeletionRefused(list(self[:10]))

    delete.__dict__["queryset_only"] = True  # not on the manager, like QuerySet.delete


class Product(RemoteObject):
    name = models.CharField(_("name"), max_length=255)
    description = models.TextField(_("description"), blank=True, default="")
    status = models.CharField(
        _("status"), max_length=16, choices=ProductStatus.choices, default=ProductStatus.DRAFT
    )
    product_type = models.CharField(
        _("type"), max_length=16, choices=ProductType.choices, default=ProductType.SUBSCRIPTION
    )
    selected_currencies = models.JSONField(
        _("currencies"), default=list, blank=True, help_text=_("Integer currency ids.")
    )
    billing_type = models.CharField(max_length=32, default="flat-rate")
    confirmed_cycles = models.JSONField(
        _("billing cycles confirmed by the service"),
        null=True,
        default=None,
        blank=True,
        editable=False,
        help_text=_(
            "The billing cycles and prices of the last blueprint the service acknowledged "
            '(a 2xx answer to the push that carried it), e.g. {"months-1": {"1": '
            '"5000.00"}}: checkout sells these. Empty until a push records it: the cycles '
            "of a product made pushed without one (an import) are sold as they are here."
        ),
    )
    blueprint_known = models.BooleanField(
        _("billing cycles known to match the service"),
        default=True,
        editable=False,
        help_text=_(
            "False for a subscription product pulled from the service (its answers carry a "
            "blueprint id only): cycles saved here are declared, not pushed, until they are "
            "sent on purpose."
        ),
    )
    add_on = models.BooleanField(
        _("add-on"),
        default=False,
        help_text=_(
            "An add-on is held beside a plan: buying it never counts as a second plan. "
            "Kept here only."
        ),
    )
    plan_group = models.CharField(
        _("plan group"),
        max_length=64,
        blank=True,
        default="",
        help_text=_(
            "The recurring products of one group are alternatives: a subscriber holds at "
            "most one of them at a time. Empty: the main group of plans. Kept here only."
        ),
    )
    multiple_purchases = models.BooleanField(
        _("multiple purchases"),
        default=False,
        help_text=_("May be bought again while held. Kept here only."),
    )
    trial_days = models.PositiveSmallIntegerField(
        _("free trial days"),
        null=True,
        blank=True,
        help_text=_(
            "Days of the free trial the trial button offers; empty: no trial button. Kept "
            "here only."
        ),
    )

    objects = ProductQuerySet.as_manager()

    class Meta:
        ordering = ["name", "pk"]
        verbose_name = _("product")
        verbose_name_plural = _("products")

    def __str__(self) -> str:
        return self.name

    @property
    def is_one_time(self) -> bool:
        return self.product_type == ProductType.ONE_TIME

    @property
    def is_plan(self) -> bool:
        """A recurring product that is not an add-on."""
        return not self.is_one_time and not self.add_on

    @property
    def confirmed_status(self) -> str:
        """The status to sell by: the service's (``remote_data``) if the last push failed, or
        while a publication is not confirmed yet (the service still says draft or archived)."""
        confirmed = self.remote_data.get("status") if isinstance(self.remote_data, dict) else None
        confirmed = confirmed.strip().lower() if isinstance(confirmed, str) else None
        unconfirmed = self.sync_state == SyncState.FAILED or self.status == ProductStatus.PUBLISHED
        if unconfirmed and confirmed in ProductStatus.values:
            return str(confirmed)
        return self.status

    def confirmed_prices(self, cycle: BillingCycle | None = None) -> dict[int, Decimal] | None:
        """``{currency id: amount}`` of ``cycle`` (None: a one-time product's root prices) as
        the service holds them; None when it is not known to hold them. A cycle's are those
        of the last blueprint the service acknowledged (``confirmed_cycles``), a declared
        cycle's its own (declared to describe the service's), a one-time product's the root
        ``prices`` of the service's last answer (``remote_data``). Where nothing was recorded
        (``confirmed_cycles`` null: no push from here, a remote id set by an import; an
        answer without root ``prices``), the prices here."""
        if cycle is None:
            remote = self.remote_data if isinstance(self.remote_data, dict) else {}
            if not self.is_one_time:
                return None
            if not isinstance(remote.get("prices"), list):
                return {price.currency_id: price.amount for price in self.root_prices.all()}
            try:
                return dict(root_prices_from_remote(remote))
            except (TypeError, ValueError, ArithmeticError):
                return None
        if cycle.declared or self.confirmed_cycles is None:
            return {price.currency_id: price.amount for price in cycle.prices.all()}
        held = self.confirmed_cycles.get(cycle.code)
        return None if held is None else {int(c): Decimal(a) for c, a in held.items()}

    def sold_prices(self, cycle: BillingCycle | None = None) -> dict[int, Decimal]:
        """What checkout sells of ``cycle`` (None: a one-time product): ``{currency id:
        amount}`` of the currencies priced here whose price the service confirmed, at the
        service's amount (the one its hosted page charges)."""
        confirmed = self.confirmed_prices(cycle) or {}
        prices = self.root_prices.all() if cycle is None else cycle.prices.all()
        return {
            p.currency_id: confirmed[p.currency_id] for p in prices if p.currency_id in confirmed
        }

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise ProductDeletionRefused([self])

    def archive(self) -> None:
        """Retire the product (instead of deleting it); pushed like any change."""
        self.status = ProductStatus.ARCHIVED
        self.save(update_fields=["status", "updated_at"])

    def publish(self) -> None:
        self.status = ProductStatus.PUBLISHED
        self.save(update_fields=["status", "updated_at"])

    def save(self, *args: Any, **kwargs: Any) -> None:
        """A save of ``selected_currencies`` keeps the currencies of the product's prices."""
        fields = kwargs.get("update_fields")
        if (
            not self._state.adding
            and self.pk is not None
            and (fields is None or "selected_currencies" in fields)
            and not is_from_remote()  # the service's answer states its own currencies
        ):
            self.selected_currencies = _with(self.selected_currencies, self.priced_currencies())
        super().save(*args, **kwargs)

    def priced_currencies(self) -> set[int]:
        return set(
            Price.objects.filter(models.Q(product=self) | models.Q(cycle__product=self))
            .values_list("currency_id", flat=True)
            .distinct()
        )

    def add_priced_currencies(self) -> bool:
        """Add the priced currencies to the stored ``selected_currencies``; True if changed."""
        row = Product.objects.filter(pk=self.pk).values_list("selected_currencies", flat=True)
        stored = _with(row.first(), set())
        self.selected_currencies = wanted = _with(stored, self.priced_currencies())
        if wanted == stored:
            return False
        super().save(update_fields=["selected_currencies", "updated_at"])
        return True


def root_prices_from_remote(data: dict[str, Any]) -> list[tuple[int, Decimal]]:
    """``(currency_id, amount)`` of a product resource's root-level prices (one-time
    products); [] when null; ``ValueError`` for a currency that is no id (``1.5``, ``true``)."""
    return [
        (_currency_id(p["currency"]), Decimal(str(p["amount"])).quantize(Decimal("0.01")))
        for p in (data.get("prices") or [])
        if isinstance(p, dict) and "currency" in p and "amount" in p
    ]


def _currency_id(value: Any) -> int:
    """A price's currency id (an integer, its digits, ``1.0``), else ``ValueError``."""
    value = whole(value)
    if not is_id(value):
        raise ValueError(f"not a currency id: {str(value)[:40]!r}")
    return int(value)


def _with(currencies: Any, more: set[int]) -> list[int]:
    """``currencies`` (ids, maybe as strings) with those of ``more``, sorted."""
    ids = {int(c) for c in currencies or [] if is_id(c)}
    return sorted(ids | {int(c) for c in more})


class BillingCycle(AtomicSaveMixin, models.Model):
    product = models.ForeignKey(Product, on_delete=models.CASCADE, related_name="cycles")
    unit = models.CharField(max_length=8, choices=CycleUnit.choices, default=CycleUnit.MONTHS)
    frequency = models.PositiveIntegerField(default=1)
    declared = models.BooleanField(
        _("declared here, not confirmed by the service"),
        default=False,
        editable=False,
        help_text=_(
            "A cycle of a product pulled from the service, declared here so that it can be "
            "sold; not pushed until “Send declared cycles to the service”."
        ),
    )

    class Meta:
        ordering = ["product", "unit", "frequency", "pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["product", "unit", "frequency"], name="billing_cycle_unique_per_product"
            )
        ]

    def __str__(self) -> str:
        return self.code

    def save(self, *args: Any, **kwargs: Any) -> None:
        """A local save for a product whose blueprint is not known here is ``declared``."""
        if not self.declared and not is_from_remote() and self.product_id is not None:
            product = self.product
            if not product.blueprint_known and not product.is_one_time:
                self.declared = True
                if kwargs.get("update_fields") is not None:
                    kwargs["update_fields"] = {*kwargs["update_fields"], "declared"}
        super().save(*args, **kwargs)

    @property
    def code(self) -> str:
        """The wire form, e.g. ``months-1``."""
        return f"{self.unit}-{self.frequency}"


#: The digits of a ``Price`` amount before its decimal point (14 digits, 2 of them decimals):
#: an amount it stores is below ``MAX_PRICE_AMOUNT``.
PRICE_WHOLE_DIGITS = 12
MAX_PRICE_AMOUNT = Decimal(10) ** PRICE_WHOLE_DIGITS


class Price(AtomicSaveMixin, models.Model):
    """A price in one currency, either of a billing cycle or (one-time) of the product."""

    cycle = models.ForeignKey(
        BillingCycle, on_delete=models.CASCADE, related_name="prices", null=True, blank=True
    )
    product = models.ForeignKey(
        Product, on_delete=models.CASCADE, related_name="root_prices", null=True, blank=True
    )
    currency_id = models.PositiveIntegerField(help_text=_("The service's integer currency id."))
    amount = models.DecimalField(
        max_digits=PRICE_WHOLE_DIGITS + 2, decimal_places=2, default=Decimal("0")
    )

    class Meta:
        ordering = ["currency_id", "pk"]
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(cycle__isnull=False, product__isnull=True)
                    | models.Q(cycle__isnull=True, product__isnull=False)
                ),
                name="billing_price_cycle_xor_product",
            )
        ]

    def __str__(self) -> str:
        return f"{self.amount} {label(self.currency_id)}"

    def saved(self) -> None:
        """A local price in a new currency adds it to the product's ``selected_currencies``."""
        owner = self.product or (self.cycle.product if self.cycle else None)
        if is_from_remote() or owner is None:
            return
        if int(self.currency_id) not in _with(owner.selected_currencies, set()):
            owner.add_priced_currencies()


class ProductFeature(models.Model):
    """A feature of a product declared here (kept here only), e.g. ``seats`` limited to 5."""

    product = models.ForeignKey(Product, on_delete=models.CASCADE, related_name="declared_features")
    key = models.SlugField(
        _("feature"), max_length=64, help_text=_("A short name, e.g. “sso”, “api”, “seats”.")
    )
    limit = models.PositiveIntegerField(
        _("limit"),
        null=True,
        blank=True,
        help_text=_("Optional number (e.g. 5 seats); empty for a feature without a number."),
    )

    class Meta:
        ordering = ["product", "key", "pk"]
        verbose_name = _("feature")
        verbose_name_plural = _("features")
        constraints = [
            models.UniqueConstraint(
                fields=["product", "key"], name="billing_product_feature_unique_per_product"
            )
        ]

    def __str__(self) -> str:
        return self.key if self.limit is None else f"{self.key}:{self.limit}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.clean()
        super().save(*args, **kwargs)

    def clean(self) -> None:
        self.key = (self.key or "").strip().lower()
