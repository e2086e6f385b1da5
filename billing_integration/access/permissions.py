"""DRF permissions: the request's subscriber has an active subscription, or a feature."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext_lazy as _
from rest_framework.permissions import BasePermission

from . import ProductRef, get_subscriber, subscribed
from .features import has_feature


class HasActiveSubscription(BasePermission):
    """Allow authenticated requests whose subscriber has an active subscription."""

    message = _("An active subscription is required.")
    code = "subscription_required"
    product: ProductRef = None

    def has_permission(self, request: Any, view: Any) -> bool:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return False
        product = getattr(view, "subscription_product", None) or self.product
        return subscribed(get_subscriber(request), product)


class HasFeature(BasePermission):
    """Allow authenticated requests whose subscriber has a feature (``access.has_feature``, through
    the request's cache)."""

    message = _("This feature is not included in your subscription.")
    code = "feature_required"
    feature: str | None = None

    def __new__(cls, feature: str | None = None, *args: Any, **kwargs: Any) -> Any:
        if feature is not None:
            # HasFeature("sso") gives a class: DRF instantiates permission_classes itself.
            return type(f"HasFeature_{feature}", (cls,), {"feature": feature})
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def has_permission(self, request: Any, view: Any) -> bool:
        feature = self.feature or getattr(view, "required_feature", None)
        if not feature:
            raise ImproperlyConfigured(
                f"{type(view).__name__} uses HasFeature without a feature: "
                'use HasFeature("name") or set required_feature on the view.'
            )
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return False
        return has_feature(request, feature)
