"""Fixtures of the admin tests: recorded enqueues, a superuser and limited staff clients."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import transaction
from django.test import Client


@pytest.fixture(autouse=True)
def recorded_enqueues(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Enqueued outbox pushes are recorded instead of sent to a broker."""
    from billing_integration.outbox import tasks

    calls: list[int] = []
    monkeypatch.setattr(tasks, "enqueue", lambda pk, countdown=None: calls.append(pk) or True)
    return calls


@pytest.fixture
def superuser(db) -> Any:
    return get_user_model().objects.create_superuser("root", "root@example.com", "pw")


@pytest.fixture
def admin_client(superuser) -> Client:
    client = Client()
    client.force_login(superuser)
    return client


def staff_with(*codenames: str) -> Any:
    user = get_user_model().objects.create_user(
        f"staff-{uuid.uuid4().hex[:6]}", "staff@example.com", "pw", is_staff=True
    )
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="billing_integration", codename__in=codenames
        )
    )
    return user


@pytest.fixture
def viewer_client(db) -> Client:
    """A staff user with only the view permission on products."""
    client = Client()
    client.force_login(staff_with("view_product"))
    return client


def make_product(
    name: str = "Pro", *, remote: bool = False, status: str = "draft", amount: str = "10000"
) -> Any:
    from billing_integration.models import BillingCycle, Price, Product
    from billing_integration.outbox import from_remote

    with transaction.atomic(), from_remote():
        product = Product.objects.create(
            name=name,
            status=status,
            selected_currencies=[1],
            remote_id=uuid.uuid4() if remote else None,
            sync_state="synced" if remote else "pending",
            # pushed: the service acknowledged its cycle (the answer to the push records it)
            confirmed_cycles={"months-1": {"1": str(Decimal(amount))}} if remote else {},
        )
        cycle = BillingCycle.objects.create(product=product, unit="months", frequency=1)
        Price.objects.create(cycle=cycle, currency_id=1, amount=Decimal(amount))
    return product


def make_subscription(product: Any, status: str = "published") -> Any:
    from billing_integration.models import Customer, Subscription
    from billing_integration.outbox import from_remote

    with from_remote():
        customer = Customer.objects.create(
            remote_id=uuid.uuid4(), identifier=f"c-{uuid.uuid4().hex[:6]}", sync_state="synced"
        )
        return Subscription.objects.create(
            remote_id=uuid.uuid4(),
            product=product,
            customer=customer,
            status=status,
            product_remote_id=product.remote_id,
            customer_remote_id=customer.remote_id,
            selected_billing_cycle="months-1",
            selected_currency="XOF",
            sync_state="synced",
        )


def product_form_data(product: Any = None, **overrides: Any) -> dict[str, Any]:
    """The POST of the product change (or add) form, with the current cycles and prices."""
    from billing_integration.admin.products import format_prices

    data: dict[str, Any] = {
        "name": product.name if product else "",
        "description": product.description if product else "",
        "product_type": product.product_type if product else "subscription",
        "status": product.status if product else "draft",
        "selected_currencies": [str(c) for c in (product.selected_currencies if product else [])],
        "root_prices-TOTAL_FORMS": "0",
        "root_prices-INITIAL_FORMS": "0",
        "root_prices-MIN_NUM_FORMS": "0",
        "root_prices-MAX_NUM_FORMS": "1000",
        "_save": "Save",
    }
    cycles = list(product.cycles.all()) if product else []
    data.update(
        {
            "cycles-TOTAL_FORMS": str(len(cycles)),
            "cycles-INITIAL_FORMS": str(len(cycles)),
            "cycles-MIN_NUM_FORMS": "0",
            "cycles-MAX_NUM_FORMS": "1000",
        }
    )
    for i, cycle in enumerate(cycles):
        data.update(
            {
                f"cycles-{i}-id": str(cycle.pk),
                f"cycles-{i}-product": str(product.pk),
                f"cycles-{i}-unit": cycle.unit,
                f"cycles-{i}-frequency": str(cycle.frequency),
                f"cycles-{i}-prices": format_prices(list(cycle.prices.all())),
            }
        )
    features = list(product.declared_features.all()) if product else []
    data.update(
        {
            "declared_features-TOTAL_FORMS": str(len(features)),
            "declared_features-INITIAL_FORMS": str(len(features)),
            "declared_features-MIN_NUM_FORMS": "0",
            "declared_features-MAX_NUM_FORMS": "1000",
        }
    )
    for i, feature in enumerate(features):
        data.update(
            {
                f"declared_features-{i}-id": str(feature.pk),
                f"declared_features-{i}-product": str(product.pk),
                f"declared_features-{i}-key": feature.key,
                f"declared_features-{i}-limit": "" if feature.limit is None else str(feature.limit),
            }
        )
    data.update(overrides)
    return data
