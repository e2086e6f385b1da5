"""Pages of the example SaaS: home, pricing, members-only, sign-up (the account page is the
app's billing page, ``billing_integration.account``).

Thin on purpose: everything billing goes through the app's public names (the template tag
``billing_checkout_button``, the ``subscription_required`` decorator, the models).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import login
from django.contrib.auth.forms import UserCreationForm
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme

from billing_integration import currencies
from billing_integration.access import (
    active_subscriptions,
    feature_limit,
    feature_required,
    refused_feature,
    subscription_required,
)
from billing_integration.models import BillingCycle, Price, Product


def _currency(currency_id: int) -> str:
    return currencies.label(currency_id)


def home(request: HttpRequest) -> HttpResponse:
    subscribed = request.user.is_authenticated and active_subscriptions(request.user).exists()
    return render(request, "example/home.html", {"subscribed": subscribed})


def pricing(request: HttpRequest) -> HttpResponse:
    """Subscription products on sale (published, as far as the service is known to sell them);
    one checkout button per cycle and currency. Sent here by a feature check (``?feature=``),
    it names the missing feature and the plans with it."""
    products = (
        Product.objects.on_sale()
        .subscriptions()
        .prefetch_related(
            Prefetch(
                "cycles",
                queryset=BillingCycle.objects.order_by("unit", "frequency").prefetch_related(
                    Prefetch("prices", queryset=Price.objects.order_by("currency_id"))
                ),
            )
        )
    )
    plans: list[dict[str, Any]] = []
    for product in products:
        # the prices the service confirmed (its hosted page charges them), no other
        options = [
            {"cycle": cycle, "amount": amount, "currency": _currency(currency_id)}
            for cycle in product.cycles.all()
            for currency_id, amount in product.sold_prices(cycle).items()
        ]
        plans.append({"product": product, "options": options})
    current: set[int] = set()
    if request.user.is_authenticated:
        current = set(active_subscriptions(request.user).values_list("product_id", flat=True))
    return render(
        request,
        "example/pricing.html",
        {
            "plans": plans,
            "current": current,
            "refused": bool(request.GET.get("next")),
            # sent here by a feature check: which feature is missing, which plans include it
            "missing": refused_feature(request),
        },
    )


@subscription_required(redirect_url="pricing")  # anonymous users go to the login page first
def members(request: HttpRequest) -> HttpResponse:
    subscriptions = active_subscriptions(request.user).select_related("product")
    return render(request, "example/members.html", {"subscriptions": subscriptions})


@feature_required("reports", redirect_url="pricing")  # by feature, not by product name
def reports(request: HttpRequest) -> HttpResponse:
    """Reports: plans that include the ``reports`` feature (Pro and Team in the demo)."""
    return render(request, "example/reports.html", {"seats": feature_limit(request, "seats")})


def signup(request: HttpRequest) -> HttpResponse:
    """Create an account with Django's ``UserCreationForm``, log in, go on."""
    next_url = request.POST.get("next") or request.GET.get("next") or ""
    if not url_has_allowed_host_and_scheme(
        next_url, {request.get_host()}, require_https=request.is_secure()
    ):
        next_url = ""
    if request.user.is_authenticated:
        return redirect(next_url or "pricing")
    form = UserCreationForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return redirect(next_url or "pricing")
    return render(request, "registration/signup.html", {"form": form, "next": next_url})
