"""Entitlements: access by feature (``sso``, ``api``, ``seats`` = 5), not by product name."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse

from ..mapping.products import feature_key, features_from_remote, larger_limit
from ..models import Product
from . import ViewFunc, _guard, _GuardMixin, _refusal, active_subscriptions, get_subscriber

#: The longest feature key ``refused_feature`` reads from a query string.
MAX_FEATURE_KEY = 100

#: The attribute holding the memoised features on a request and on its subscriber instance.
CACHE_ATTR = "_billing_features"


class Features(dict[str, int | None]):
    """``{key: limit or None}`` of one subscriber (a ``dict``; the type marks a cache entry).
    ``user``: on a request, the ``request.user`` they were computed for."""

    user: Any = None


def _compute(subscriber: Any) -> Features:
    """One query: the active subscriptions' products with their declared features (a row per
    declared feature, the product's service JSON alongside)."""
    rows = (
        active_subscriptions(subscriber)
        .filter(product__isnull=False)
        .values_list(
            "product_id",
            "product__remote_data",
            "product__declared_features__key",
            "product__declared_features__limit",
        )
    )
    products: dict[int, tuple[Any, dict[str, int | None]]] = {}
    for product_id, remote_data, key, limit in rows:
        _remote, declared = products.setdefault(product_id, (remote_data, {}))
        if key:
            declared[feature_key(key)] = limit
    result = Features()
    for remote_data, declared in products.values():
        for key, limit in _product_features(remote_data, declared).items():
            result[key] = larger_limit(result[key], limit) if key in result else limit
    return result


def _product_features(remote_data: Any, declared: dict[str, int | None]) -> dict[str, int | None]:
    """One product's features: the service's, with the declarations here winning per key."""
    return {**features_from_remote(remote_data), **declared}


def products_with_feature(feature: Any) -> list[Product]:
    """The subscription products on sale (published, and not refused by the service:
    ``Product.objects.on_sale()``) that include ``feature`` (the service's ``features`` array or
    a declaration here), by name: the plans to offer a subscriber who lacks it."""
    key = feature_key(feature)
    if not key:
        return []
    products = (
        Product.objects.on_sale()
        .subscriptions()
        .prefetch_related("declared_features")
        .order_by("name", "pk")
    )
    return [
        product
        for product in products
        if key
        in _product_features(
            product.remote_data,
            {feature_key(f.key): f.limit for f in product.declared_features.all()},
        )
    ]


def refused_feature(request: HttpRequest) -> dict[str, Any] | None:
    """On the page a feature check sent the request to (``?feature=<key>``): ``{"feature": key,
    "products": products_with_feature(key)}``; None without a usable ``feature`` parameter."""
    key = feature_key(request.GET.get("feature"))
    if not key or len(key) > MAX_FEATURE_KEY:
        return None
    return {"feature": key, "products": products_with_feature(key)}


def _bound(obj: Any) -> Features | None:
    cached = getattr(obj, CACHE_ATTR, None)
    return cached if isinstance(cached, Features) else None


def features_of(subscriber: Any, *, memoise: bool = False) -> Features:
    """The features of ``subscriber``: ``{key: limit or None}``; empty for ``None``/anonymous."""
    cached = _bound(subscriber)
    if cached is not None:
        return cached
    features = _compute(subscriber)
    if memoise and subscriber is not None:
        _bind(subscriber, features)
    return features


def _bind(obj: Any, features: Features) -> None:
    # An object that takes no attributes simply gets no cache.
    with contextlib.suppress(AttributeError, TypeError):
        setattr(obj, CACHE_ATTR, features)


def features_for(request: Any) -> Features:
    """The features of the request's subscriber (``get_subscriber``), memoised on the request
    (for its ``user``: a login or logout since computes them again) and on the subscriber
    instance: one query per request however many checks."""
    user = getattr(request, "user", None)
    cached = _bound(request)
    if cached is not None and cached.user is user:
        return cached
    subscriber = get_subscriber(request)
    features = features_of(subscriber)
    if subscriber is not None:
        _bind(subscriber, features)
    entry = Features(features)
    entry.user = user
    _bind(request, entry)
    return entry


def is_request(obj: Any) -> bool:
    """An ``HttpRequest`` or a DRF ``Request`` (which wraps one)."""
    return isinstance(obj, HttpRequest) or isinstance(getattr(obj, "_request", None), HttpRequest)


def _features(subject: Any) -> Features:
    return features_for(subject) if is_request(subject) else features_of(subject)


def has_feature(subject: Any, feature: str) -> bool:
    """Whether ``subject`` (a subscriber, or a request: its subscriber, cached) has
    ``feature`` through an active subscription. An empty or non-string key gives False."""
    key = feature_key(feature)
    return bool(key) and key in _features(subject)


def feature_limit(subject: Any, feature: str) -> int | None:
    """The number of ``feature`` for ``subject`` (the largest across its active
    subscriptions); ``None`` when it lacks the feature or has it without a number."""
    key = feature_key(feature)
    return _features(subject).get(key) if key else None


def _required(feature: Any) -> str:
    key = feature_key(feature)
    if not key:
        raise ImproperlyConfigured(f"A required feature must be a non-empty name, not {feature!r}.")
    return key


def feature_required(
    feature: str, *, redirect_url: str | None = None
) -> Callable[[ViewFunc], ViewFunc]:
    """View decorator: login required, then ``feature`` through an active subscription."""
    if callable(feature):
        raise TypeError('feature_required needs a feature name: @feature_required("sso").')
    key = _required(feature)
    return _guard(lambda request: _refusal(request, redirect_url, feature=key))


class FeatureRequiredMixin(_GuardMixin):
    """Class-based-view mixin: login required, then ``required_feature``."""

    required_feature: str | None = None
    feature_redirect_url: str | None = None

    def get_required_feature(self) -> str | None:
        return self.required_feature

    def billing_refusal(self, request: HttpRequest) -> HttpResponse | None:
        key = _required(self.get_required_feature())
        return _refusal(request, self.feature_redirect_url, feature=key)
