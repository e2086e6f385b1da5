"""Access checks: who has an active subscription.

    from billing_integration.access import (
        subscribed, active_subscriptions, subscription_required, SubscriptionRequiredMixin,
        HasActiveSubscription, get_subscriber,
    )

    subscribed(request.user)                      # any active subscription
    subscribed(request.user, product)             # to this product (instance, pk, remote id, name)

    @subscription_required                        # or @subscription_required(product="Pro plan")
    def members(request): ...

    class Members(SubscriptionRequiredMixin, TemplateView):
        subscription_product = "Pro plan"         # optional

The *active* rule is ``Subscription.objects.active()`` (``billing_integration/models/
subscriptions.py``): the status is in the allow-list ``BILLING['ACTIVE_STATUSES']`` (default
``published``; any other status, an unknown one included, grants no access), and either the
cycle has no end date, the cycle end is in the future, or the trial end is in the future.
Nothing here re-implements it.

The *subscriber* of a request is ``request.user`` unless ``BILLING['SUBSCRIBER_RESOLVER']``
names a ``callable(request) -> subscriber | None`` (a team or an organisation model).
Anonymous users have no subscriber. Non-subscribers are sent to
``BILLING['SUBSCRIPTION_REQUIRED_URL']`` (a URL name or a path) with ``?next=<path>``;
anonymous users are sent to the login page first.

One plan at a time (``held_plan``): the recurring products of one ``plan_group`` are
alternatives, and a subscriber holds at most one of them; an ``add_on`` is held beside a
plan. ``held_plan(subscriber, product)`` is the active subscription to another plan of the
product's group, the one that makes buying ``product`` a second plan beside a first that
may still renew. Checkout (view, ``start_checkout``, DRF) and the checkout button use it.

Access by feature (``has_feature``, ``feature_limit``, ``feature_required``,
``FeatureRequiredMixin``, ``HasFeature``, ``products_with_feature``, ``refused_feature``): see
``access/features.py``.
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.views import redirect_to_login
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import NoReverseMatch, reverse
from django.utils.module_loading import import_string

from ..conf import billing_settings
from ..models import Product, ProductType, Subscription

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
    "has_feature",
    "held_plan",
    "products_with_feature",
    "refused_feature",
    "resolve_product",
    "subscribed",
    "subscription_required",
    "subscription_required_url",
]

ProductRef = Product | int | str | uuid.UUID | None


# --- subscriber and product ---------------------------------------------------------------------
def get_subscriber(request: HttpRequest) -> Any | None:
    """The subscriber of ``request``: ``BILLING['SUBSCRIBER_RESOLVER'](request)`` if set,
    else ``request.user``; ``None`` for anonymous users (or when the resolver finds none)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    resolver = billing_settings.SUBSCRIBER_RESOLVER
    if resolver:
        func = import_string(resolver) if isinstance(resolver, str) else resolver
        return func(request)
    return user


def resolve_product(product: ProductRef) -> Product | None:
    """A ``Product`` from an instance, a primary key, a remote id (UUID) or a name.

    Returns ``None`` when nothing matches (``product=None`` also gives ``None``).
    """
    if product is None or isinstance(product, Product):
        return product
    if isinstance(product, uuid.UUID):
        return Product.objects.filter(remote_id=product).first()
    if isinstance(product, int) or (
        isinstance(product, str) and product.isascii() and product.isdigit()
    ):
        return Product.objects.filter(pk=int(product)).first()
    text = str(product).strip()
    try:
        return Product.objects.filter(remote_id=uuid.UUID(text)).first()
    except ValueError:
        return Product.objects.filter(name=text).first()


def _is_subscriber(subscriber: Any) -> bool:
    if subscriber is None or getattr(subscriber, "pk", None) is None:
        return False
    return getattr(subscriber, "is_authenticated", True) is not False


# --- the checks ---------------------------------------------------------------------------------
def active_subscriptions(subscriber: Any, product: ProductRef = None) -> QuerySet[Subscription]:
    """The subscriber's active subscriptions (optionally to one product)."""
    if not _is_subscriber(subscriber):
        return Subscription.objects.none()
    qs = Subscription.objects.active().for_subscriber(subscriber)
    if product is not None:
        resolved = resolve_product(product)
        if resolved is None:
            return Subscription.objects.none()
        qs = qs.for_product(resolved)
    return qs.select_related("product")


def subscribed(subscriber: Any, product: ProductRef = None) -> bool:
    """Whether ``subscriber`` has an active subscription (to ``product`` if given).

    ``subscriber`` is a subscriber instance (a user by default); ``None`` or an anonymous user
    gives ``False``. ``product`` may be a ``Product``, its pk, its remote id or its name; an
    unknown product gives ``False``.
    """
    return active_subscriptions(subscriber, product).exists()


def held_plan(subscriber: Any, product: ProductRef) -> Subscription | None:
    """The subscriber's active subscription to another plan of ``product``'s group, if any:
    buying ``product`` beside it would be a second plan. ``None`` for a one-time product, an
    add-on, an unknown product, or a subscriber holding no other plan of the group."""
    resolved = resolve_product(product)
    if resolved is None or not resolved.is_plan:
        return None
    return (
        active_subscriptions(subscriber)
        .filter(
            product__product_type=ProductType.SUBSCRIPTION,
            product__add_on=False,
            product__plan_group=resolved.plan_group,
        )
        .exclude(product=resolved)
        .order_by("-cycle_start_date", "-pk")
        .first()
    )


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


def _check(
    request: HttpRequest, product: ProductRef, redirect_url: str | None
) -> HttpResponse | None:
    """``None`` if the request may go on, else the redirect to send."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    if subscribed(get_subscriber(request), product):
        return None
    return HttpResponseRedirect(subscription_required_url(redirect_url, request.get_full_path()))


def subscription_required(
    view_func: Callable[..., HttpResponse] | None = None,
    *,
    product: ProductRef = None,
    redirect_url: str | None = None,
) -> Any:
    """View decorator: login required, then an active subscription (to ``product``).

    Use bare (``@subscription_required``) or with arguments
    (``@subscription_required(product="Pro plan", redirect_url="pricing")``).
    Anonymous users go to the login page; non-subscribers to ``redirect_url`` or
    ``BILLING['SUBSCRIPTION_REQUIRED_URL']`` with ``?next=<path>``.
    """

    def decorator(func: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @functools.wraps(func)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            refused = _check(request, product, redirect_url)
            if refused is not None:
                return refused
            return func(request, *args, **kwargs)

        return wrapper

    if view_func is not None and callable(view_func) and not isinstance(view_func, Product):
        return decorator(view_func)
    if view_func is not None:  # @subscription_required(product) positionally
        product = view_func
    return decorator


class SubscriptionRequiredMixin:
    """Class-based-view mixin: login required, then an active subscription.

    Set ``subscription_product`` (instance, pk, remote id or name) to require one product
    and ``subscription_redirect_url`` to override ``BILLING['SUBSCRIPTION_REQUIRED_URL']``;
    or override ``get_subscription_product()``.
    """

    subscription_product: ProductRef = None
    subscription_redirect_url: str | None = None

    def get_subscription_product(self) -> ProductRef:
        return self.subscription_product

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        refused = _check(request, self.get_subscription_product(), self.subscription_redirect_url)
        if refused is not None:
            return refused
        return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]


def __getattr__(name: str) -> Any:
    # The DRF permissions are imported lazily so this module works without DRF installed.
    if name == "HasActiveSubscription":
        from .permissions import HasActiveSubscription

        return HasActiveSubscription
    if name == "HasFeature":
        from .permissions import HasFeature

        return HasFeature
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
