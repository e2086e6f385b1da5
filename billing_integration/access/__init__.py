"""Access checks: who has an active subscription."""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.views import redirect_to_login
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.http.response import HttpResponseBase
from django.urls import NoReverseMatch, reverse
from django.utils.module_loading import import_string
from django.views import View

from ..conf import billing_settings
from ..models import Customer, Product, ProductType, Subscription
from ..models.subscriptions import (
    CANCELED_STATUSES,
    active_q,
    in_grace_period,
    is_known_status,
    renewing_statuses,
    unknown_status_q,
)

__all__ = [
    "FeatureRequiredMixin",
    "HasActiveSubscription",
    "HasFeature",
    "SubscriptionRequiredMixin",
    "active_subscriptions",
    "feature_limit",
    "feature_required",
    "features_for",
    "features_of",
    "get_subscriber",
    "grace_period_subscriptions",
    "has_feature",
    "held_plan",
    "in_grace_period",
    "lapsed_in_the_way",
    "lapsed_may_renew",
    "live_subscriptions",
    "may_renew",
    "on_grace_period",
    "on_trial",
    "plan_in_the_way",
    "plan_may_renew",
    "plan_to_replace",
    "products_with_feature",
    "refused_feature",
    "renews_in_place",
    "resolve_product",
    "subscribed",
    "subscription_required",
    "subscription_required_url",
    "trial_subscriptions",
]

ProductRef = Product | int | str | uuid.UUID | None
ViewFunc = Callable[..., HttpResponse]


def get_subscriber(request: HttpRequest) -> Any | None:
    """The subscriber of ``request``: ``BILLING['SUBSCRIBER_RESOLVER'](request)`` if set,
    else ``request.user``; ``None`` for anonymous and inactive users (or when the resolver
    finds none)."""
    user = getattr(request, "user", None)
    if not _is_account(user):
        return None
    resolver = billing_settings.SUBSCRIBER_RESOLVER
    if resolver:
        func = import_string(resolver) if isinstance(resolver, str) else resolver
        return func(request)
    return user


def _product_lookup(product: int | str | uuid.UUID) -> Q | None:
    """The products a primary key, a remote id (UUID) or a name refers to (a name: every
    product of that name); ``None``: none."""
    if isinstance(product, uuid.UUID):
        return Q(remote_id=product)
    if isinstance(product, bool):  # an int to Python, but no primary key
        return None
    if isinstance(product, int) or (
        isinstance(product, str) and product.isascii() and product.isdigit()
    ):
        try:
            return Q(pk=int(product))
        except ValueError:  # more digits than Python reads (4,300): no primary key
            return None
    text = str(product).strip()
    try:
        return Q(remote_id=uuid.UUID(text))
    except ValueError:  # no name holds a NUL (PostgreSQL refuses one in a query)
        return Q(name=text) if "\x00" not in text else None


def resolve_product(product: ProductRef) -> Product | None:
    """A ``Product`` from an instance, a primary key, a remote id (UUID) or a name."""
    if product is None or isinstance(product, Product):
        return product
    lookup = _product_lookup(product)
    return None if lookup is None else Product.objects.filter(lookup).first()


def _is_account(obj: Any) -> bool:
    """A saved instance, neither anonymous nor inactive (``is_active`` false: as Django's
    permissions and DRF's authentication, a deactivated account is refused)."""
    if obj is None or getattr(obj, "pk", None) is None:
        return False
    flags = ("is_authenticated", "is_active")
    return all(getattr(obj, flag, True) is not False for flag in flags)


def _is_subscriber(subscriber: Any) -> bool:
    """``_is_account``, of ``BILLING['SUBSCRIBER_MODEL']``: any other saved instance (a user
    where the subscriber is a team) raises ``TypeError``, before any row or call."""
    if not _is_account(subscriber):
        return False
    expected = Customer._meta.get_field("subscriber").related_model
    if not isinstance(subscriber, expected):
        raise TypeError(
            f"A subscriber must be an instance of BILLING['SUBSCRIBER_MODEL'] "
            f"({expected._meta.label!r}), not {type(subscriber).__name__}: "
            "pass get_subscriber(request)."
        )
    return True


def active_subscriptions(subscriber: Any, product: ProductRef = None) -> QuerySet[Subscription]:
    """The subscriber's active subscriptions (optionally to one product; a name: to any
    product of that name, such as an archived one and the one that took its name)."""
    if not _is_subscriber(subscriber):
        return Subscription.objects.none()
    qs = Subscription.objects.active().for_subscriber(subscriber)
    if isinstance(product, Product):
        qs = qs.for_product(product)
    elif product is not None:
        lookup = _product_lookup(product)
        if lookup is None:
            return Subscription.objects.none()
        qs = qs.filter(product__in=Product.objects.filter(lookup))
    return qs.select_related("product")


def subscribed(subscriber: Any, product: ProductRef = None) -> bool:
    """Whether ``subscriber`` has an active subscription (to ``product`` if given)."""
    return active_subscriptions(subscriber, product).exists()


def live_subscriptions(subscriber: Any, product: ProductRef = None) -> QuerySet[Subscription]:
    """The active subscriptions that are not canceled (a grace period is not a live plan: it
    does not renew, so buying beside it is no second plan)."""
    return active_subscriptions(subscriber, product).exclude(status__in=CANCELED_STATUSES)


def grace_period_subscriptions(subscriber: Any, product: ProductRef = None) -> list[Subscription]:
    """The subscriber's canceled subscriptions that still grant access (``in_grace_period``)."""
    rows = active_subscriptions(subscriber, product).filter(status__in=CANCELED_STATUSES)
    return [s for s in rows if in_grace_period(s.status, s.cycle_end_date)]


def on_grace_period(subscriber: Any, product: ProductRef = None) -> bool:
    """Whether ``subscriber``'s access (to ``product`` if given) rests on a canceled
    subscription whose paid period has not ended (``BILLING['ACCESS_AFTER_CANCEL']``), and on
    no live one."""
    if live_subscriptions(subscriber, product).exists():
        return False
    return bool(grace_period_subscriptions(subscriber, product))


def trial_subscriptions(subscriber: Any, product: ProductRef = None) -> list[Subscription]:
    """The subscriber's active subscriptions in trial (``trial_ends_at`` set), each to a product
    the subscriber holds no paid (out of trial) subscription to: converting ends the trial."""
    active = list(live_subscriptions(subscriber, product))
    paid = {s.product_id for s in active if s.trial_ends_at is None}
    return [s for s in active if s.trial_ends_at is not None and s.product_id not in paid]


def on_trial(subscriber: Any, product: ProductRef = None) -> bool:
    """Whether ``subscriber`` is in a free trial (of ``product`` if given), not yet converted."""
    return bool(trial_subscriptions(subscriber, product))


def held_plan(subscriber: Any, product: ProductRef) -> Subscription | None:
    """The subscriber's live subscription to another plan of ``product``'s group, if any: buying
    ``product`` beside it would be a second plan."""
    resolved = resolve_product(product)
    if resolved is None or not resolved.is_plan:
        return None
    return _other_plan(live_subscriptions(subscriber), resolved)


def _other_plan(rows: QuerySet[Subscription], plan: Product) -> Subscription | None:
    """The latest of ``rows`` that is of another plan of ``plan``'s group."""
    return (
        rows.filter(
            product__product_type=ProductType.SUBSCRIPTION,
            product__add_on=False,
            product__plan_group=plan.plan_group,
        )
        .exclude(product=plan)
        .order_by("-cycle_start_date", "-pk")
        .first()
    )


def plan_in_the_way(subscriptions: Iterable[Subscription], product: Product) -> bool:
    """``plan_to_replace`` over rows already read with their products: whether they hold
    another plan of ``product``'s group."""
    return product.is_plan and any(
        s.product is not None
        and s.product.is_plan
        and s.product.plan_group == product.plan_group
        and s.product_id != product.pk
        and (s.is_live or may_renew(s))
        for s in subscriptions
    )


def may_renew(subscription: Subscription) -> bool:
    """Whether ``subscription`` may still renew on the service (``auto_renew`` on, status
    active or ``paused``: the service may resume a paused one; or, the service's, a status the
    app does not know, such as ``past_due``: a payment it may retry), whether or not its paid
    period ended here (``_may_renew_q`` in SQL)."""
    status = subscription.status
    return subscription.auto_renew and (
        status in renewing_statuses()
        or (subscription.remote_id is not None and not is_known_status(status))
    )


def _may_renew_q() -> Q:
    """``may_renew`` as a ``Q``."""
    unknown = unknown_status_q() & Q(remote_id__isnull=False)
    return Q(auto_renew=True) & (Q(status__in=renewing_statuses()) | unknown)


def plan_may_renew(subscriber: Any, product: ProductRef) -> Subscription | None:
    """Another plan of ``product``'s group of the subscriber that may still renew (``may_renew``:
    ``auto_renew`` on, status active, paused or not known), even past its period end: a new
    subscription beside it could be billed twice."""
    resolved = resolve_product(product)
    if resolved is None or not resolved.is_plan or not _is_subscriber(subscriber):
        return None
    rows = Subscription.objects.for_subscriber(subscriber).select_related("product")
    return _other_plan(rows.filter(_may_renew_q()), resolved)


def plan_to_replace(subscriber: Any, product: ProductRef) -> Subscription | None:
    """The subscriber's other plan of ``product``'s group that a new subscription to
    ``product`` would double: the live one (``held_plan``), else one that may still renew
    (``plan_may_renew``). Checkout and trials refuse ``product`` beside it; a change of plan
    (``checkout.changes.change_plan``) moves it."""
    return held_plan(subscriber, product) or plan_may_renew(subscriber, product)


def _bought_once(product: Product) -> bool:
    return not product.is_one_time and not product.multiple_purchases


def lapsed_may_renew(subscriber: Any, product: ProductRef) -> Subscription | None:
    """The subscriber's own subscription to ``product`` (recurring, bought once: not
    ``multiple_purchases``) whose access ended here while it may still renew on the service
    (``may_renew``: a failed payment the service may try again, or a pause it may end). A
    new subscription to ``product`` beside it could be billed twice: checkout and trials
    refuse it until its renewal stops. A live one is the product held (``live_subscriptions``)."""
    resolved = resolve_product(product)
    if resolved is None or not _bought_once(resolved) or not _is_subscriber(subscriber):
        return None
    return (
        Subscription.objects.for_subscriber(subscriber)
        .filter(_may_renew_q(), product=resolved)
        .exclude(active_q())
        .order_by("-cycle_start_date", "-pk")
        .first()
    )


def lapsed_in_the_way(subscriptions: Iterable[Subscription], product: Product) -> bool:
    """``lapsed_may_renew`` over rows already read: whether one of them is a subscription to
    ``product`` that lapsed while it may still renew."""
    return _bought_once(product) and any(
        s.product_id == product.pk and not s.is_active and may_renew(s) for s in subscriptions
    )


def renews_in_place(subscriptions: Iterable[Subscription], subscription: Subscription) -> bool:
    """Whether another of ``subscriptions`` (read with their products) may renew
    (``may_renew``) in ``subscription``'s place: one of its product (bought once), such as a
    trial's conversion, or another plan of its group (``plan_in_the_way``), such as a change
    of plan's. Resuming ``subscription`` beside it would bill both."""
    product = subscription.product
    if product is None:
        return False
    others = [s for s in subscriptions if s.pk != subscription.pk and may_renew(s)]
    same = _bought_once(product) and any(s.product_id == product.pk for s in others)
    return same or plan_in_the_way(others, product)


def subscription_required_url(
    redirect_url: str | None = None, next_path: str | None = None, feature: str | None = None
) -> str:
    """Where to send a non-subscriber: ``redirect_url`` or ``BILLING['PRICING_URL']`` (a URL
    name or a path), with ``?next=`` and, when a feature is missing, ``&feature=``."""
    target = redirect_url or billing_settings.PRICING_URL or "/"
    if "/" not in target:
        with contextlib.suppress(NoReverseMatch):
            target = reverse(target)
    query = {name: value for name, value in (("next", next_path), ("feature", feature)) if value}
    if query:
        sep = "&" if "?" in target else "?"
        target = f"{target}{sep}{urlencode(query)}"
    return target


def _refusal(
    request: HttpRequest,
    redirect_url: str | None,
    product: ProductRef = None,
    feature: str | None = None,
) -> HttpResponse | None:
    """``None`` if the request may go on, else the redirect: the login page for anonymous users,
    then the pricing page (``subscription_required_url``)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    if has_feature(request, feature) if feature else subscribed(get_subscriber(request), product):
        return None
    path = request.get_full_path()
    return HttpResponseRedirect(subscription_required_url(redirect_url, path, feature=feature))


def _guard(refusal: Callable[[HttpRequest], HttpResponse | None]) -> Callable[[ViewFunc], ViewFunc]:
    """A view decorator that answers ``refusal(request)`` unless it is ``None``."""

    def decorator(func: ViewFunc) -> ViewFunc:
        @functools.wraps(func)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            refused = refusal(request)
            return refused if refused is not None else func(request, *args, **kwargs)

        return wrapper

    return decorator


class _GuardMixin(View):
    def billing_refusal(self, request: HttpRequest) -> HttpResponse | None:
        raise NotImplementedError

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        refused = self.billing_refusal(request)
        return refused if refused is not None else super().dispatch(request, *args, **kwargs)


def subscription_required(
    view_func: ViewFunc | None = None,
    *,
    product: ProductRef = None,
    redirect_url: str | None = None,
) -> Any:
    """View decorator: login required, then an active subscription (to ``product``)."""
    if view_func is not None and (isinstance(view_func, Product) or not callable(view_func)):
        product, view_func = view_func, None  # @subscription_required(product) positionally
    decorator = _guard(lambda request: _refusal(request, redirect_url, product=product))
    return decorator(view_func) if view_func is not None else decorator


class SubscriptionRequiredMixin(_GuardMixin):
    """Class-based-view mixin: login required, then an active subscription."""

    subscription_product: ProductRef = None
    subscription_redirect_url: str | None = None

    def get_subscription_product(self) -> ProductRef:
        return self.subscription_product

    def billing_refusal(self, request: HttpRequest) -> HttpResponse | None:
        product = self.get_subscription_product()
        return _refusal(request, self.subscription_redirect_url, product=product)


def __getattr__(name: str) -> Any:
    # The DRF permissions are imported lazily so this module works without DRF installed.
    if name in ("HasActiveSubscription", "HasFeature"):
        from . import permissions

        return getattr(permissions, name)
    raise AttributeError(name)


# Access by feature; imported last: it builds on the names above.
from .features import (  # noqa: E402
    FeatureRequiredMixin,
    feature_limit,
    feature_required,
    features_for,
    features_of,
    has_feature,
    products_with_feature,
    refused_feature,
)
