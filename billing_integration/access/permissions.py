"""DRF permission: the request's subscriber has an active subscription."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission

from . import ProductRef, get_subscriber, subscribed

__all__ = ["HasActiveSubscription"]


class HasActiveSubscription(BasePermission):
    """Allow authenticated requests whose subscriber has an active subscription.

    Any product by default; set ``subscription_product`` on the view (instance, pk, remote
    id or name), or subclass this permission with ``product = ...``. Anonymous requests get
    DRF's "not authenticated" answer (401 or 403 depending on the authentication classes);
    authenticated non-subscribers get 403.
    """

    message = "An active subscription is required."
    code = "subscription_required"
    product: ProductRef = None

    def has_permission(self, request: Any, view: Any) -> bool:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return False
        product = getattr(view, "subscription_product", None) or self.product
        return subscribed(get_subscriber(request), product)
