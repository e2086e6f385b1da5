"""Fixtures of the entitlement tests: recorded enqueues, users, products with features."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from billing_integration.models import Customer, Product, ProductFeature, Subscription
from billing_integration.outbox import from_remote


@pytest.fixture(autouse=True)
def recorded_enqueues(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Enqueued outbox pushes are recorded instead of sent to a broker."""
    from billing_integration.outbox import tasks

    calls: list[int] = []
    monkeypatch.setattr(tasks, "enqueue", lambda pk, countdown=None: calls.append(pk) or True)
    return calls


@pytest.fixture
def user(db) -> Any:
    return get_user_model().objects.create_user("alice", "alice@example.com", "pw")


def make_product(name: str, service: list | None = None, declared: dict | None = None) -> Product:
    """A product as pulled (``service``: its ``features`` array in ``remote_data``) with
    ``declared`` features (``{key: limit}``) saved here."""
    with from_remote():
        product = Product.objects.create(
            name=name,
            status="published",
            selected_currencies=[1],
            remote_data=None if service is None else {"name": name, "features": service},
            sync_state="synced",
        )
    for key, limit in (declared or {}).items():
        ProductFeature.objects.create(product=product, key=key, limit=limit)
    return product


def subscribe(subscriber: Any, product: Product, **fields: Any) -> Subscription:
    now = timezone.now()
    values = {
        "status": "published",
        "cycle_start_date": now - timedelta(days=1),
        "cycle_end_date": now + timedelta(days=29),
    }
    values.update(fields)
    with from_remote():
        customer, _ = Customer.objects.get_or_create(
            subscriber=subscriber, defaults={"identifier": f"auth.user:{subscriber.pk}"}
        )
        return Subscription.objects.create(customer=customer, product=product, **values)
