"""``python manage.py billing_demo_seed``: the demo's users and products (idempotent).

Creates (only what is missing):

- the superuser ``admin`` / ``admin`` and the user ``demo`` / ``demo`` — demo logins, never
  use them anywhere else;
- published subscription products with monthly and yearly cycles priced in two currencies;
- the features of each product (declared here, never pushed): ``members`` for all,
  ``reports`` from Pro up (the ``/reports/`` page requires it), ``seats`` with a number.

Products are created through the models, so the outbox pushes them to the billing service
(the Celery worker does, once it runs). Running the command again changes nothing.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from billing_integration.currencies import currency_id
from billing_integration.models import BillingCycle, Price, Product, ProductFeature

#: (login, password, superuser)
DEMO_USERS = [("admin", "admin", True), ("demo", "demo", False)]

#: name -> (description, {cycle code: {currency code: amount}})
DEMO_PRODUCTS: dict[str, tuple[str, dict[str, dict[str, str]]]] = {
    "Starter": (
        "For individuals: the members area, one seat.",
        {"months-1": {"XOF": "5000", "USD": "9"}, "years-1": {"XOF": "50000", "USD": "90"}},
    ),
    "Pro": (
        "For small teams: everything in Starter, five seats.",
        {"months-1": {"XOF": "15000", "USD": "25"}, "years-1": {"XOF": "150000", "USD": "250"}},
    ),
    "Team": (
        "For companies: everything in Pro, unlimited seats, yearly only.",
        {"years-1": {"XOF": "450000", "EUR": "690"}},
    ),
}


#: name -> {feature: limit or None}, declared on the products (missing ones added on re-runs)
DEMO_FEATURES: dict[str, dict[str, int | None]] = {
    "Starter": {"members": None, "seats": 1},
    "Pro": {"members": None, "reports": None, "seats": 5},
    "Team": {"members": None, "reports": None, "sso": None, "api": None},
}


#: name -> days of the free trial its trial button offers (Product.trial_days)
DEMO_TRIALS: dict[str, int] = {"Pro": 14}


def seed_features(product: Product) -> None:
    """Declare the demo features ``product`` lacks (kept here: features are never pushed)."""
    for key, limit in DEMO_FEATURES.get(product.name, {}).items():
        ProductFeature.objects.get_or_create(product=product, key=key, defaults={"limit": limit})


def seed_users() -> list[tuple[str, str, bool]]:
    """Create the demo users that are missing; return (login, password, created)."""
    User = get_user_model()
    out = []
    for username, password, superuser in DEMO_USERS:
        user = User.objects.filter(username=username).first()
        created = user is None
        if created:
            if superuser:
                user = User.objects.create_superuser(username, f"{username}@example.com", password)
            else:
                user = User.objects.create_user(
                    username, f"{username}@example.com", password, first_name=username.title()
                )
        out.append((username, password, created))
    return out


def seed_products() -> list[tuple[Product, bool]]:
    """Create the demo products that are missing (published, with cycles and prices)."""
    out = []
    for name, (description, cycles) in DEMO_PRODUCTS.items():
        product = Product.objects.filter(name=name).first()
        if product is not None:
            seed_features(product)
            if product.trial_days is None and name in DEMO_TRIALS:
                product.trial_days = DEMO_TRIALS[name]
                product.save(update_fields=["trial_days"])  # kept here: nothing is pushed
            out.append((product, False))
            continue
        currencies = sorted({currency_id(code) for prices in cycles.values() for code in prices})
        with transaction.atomic():  # one outbox entry, pushed once the whole product exists
            product = Product.objects.create(
                name=name,
                description=description,
                status="published",
                product_type="subscription",
                selected_currencies=currencies,
                trial_days=DEMO_TRIALS.get(name),
            )
            for code, prices in cycles.items():
                unit, frequency = code.rsplit("-", 1)
                cycle = BillingCycle.objects.create(
                    product=product, unit=unit, frequency=int(frequency)
                )
                for currency, amount in prices.items():
                    Price.objects.create(
                        cycle=cycle,
                        currency_id=currency_id(currency),
                        amount=Decimal(amount),
                    )
            seed_features(product)
        out.append((product, True))
    return out


class Command(BaseCommand):
    help = "Create the demo users (admin/admin, demo/demo) and demo products (idempotent)."

    def handle(self, *args: Any, **options: Any) -> None:
        for username, password, created in seed_users():
            state = "created" if created else "exists"
            self.stdout.write(f"user {username} / {password} ({state})")
        for product, created in seed_products():
            state = "created" if created else "exists"
            cycles = ", ".join(
                f"{c.code}: " + " / ".join(str(p) for p in c.prices.all())
                for c in product.cycles.all()
            )
            self.stdout.write(f"product {product.name} [{product.status}] {cycles} ({state})")
