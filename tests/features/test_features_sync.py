"""Features and the service: the pull keeps the service's features (read by has_feature);
features declared here are never pushed (no outbox entry, the sync state unchanged, no
request reaches the service), in the model and through the admin."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from billing_integration.access import feature_limit, has_feature
from billing_integration.models import OutboxEntry, Product, ProductFeature
from billing_integration.outbox.push import push_entry

from ..admin.conftest import product_form_data
from .conftest import subscribe

pytestmark = pytest.mark.django_db(transaction=True)

BLUEPRINT = {
    "billing_type": "flat-rate",
    "billing_cycles": [
        {"cycle": "months", "frequency": 1, "prices": [{"currency": 1, "amount": 7000}]}
    ],
}


def create_on_service(name: str, features: list[Any]) -> dict[str, Any]:
    """A published product created directly on the sandbox (not through this app)."""
    from billing_integration.client import get_client

    return get_client().create_product(
        {
            "name": name,
            "description": "",
            "status": "published",
            "selected_currencies": ["1"],
            "subscription_blueprint": BLUEPRINT,
            "features": features,
        }
    )


def pull() -> None:
    call_command("billing_sync", "products", "--no-progress", stdout=io.StringIO())


def push_open() -> list[str]:
    return [push_entry(pk).status for pk in OutboxEntry.objects.open().values_list("pk", flat=True)]


def test_the_pull_keeps_the_services_features(billing_sandbox, user):
    remote = create_on_service("Team plan", ["sso", {"name": "seats", "value": 5}, {"x": 1}])
    assert billing_sandbox.object("product", remote["id"])["features"][0] == "sso"
    pull()
    product = Product.objects.get(remote_id=remote["id"])
    assert product.remote_data["features"] == ["sso", {"name": "seats", "value": 5}, {"x": 1}]
    assert OutboxEntry.objects.count() == 0

    subscribe(user, product)
    assert has_feature(user, "sso") and feature_limit(user, "seats") == 5
    assert not has_feature(user, "api")
    # a feature declared here adds to the service's, and wins for its own key
    ProductFeature.objects.create(product=product, key="seats", limit=2)
    ProductFeature.objects.create(product=product, key="API")
    assert feature_limit(user, "seats") == 2 and has_feature(user, "api")
    pull()  # pulling again keeps both
    assert has_feature(user, "sso") and feature_limit(user, "seats") == 2


def test_saving_features_pushes_nothing(billing_sandbox):
    product = Product.objects.create(name="Pro", status="published", selected_currencies=[1])
    from billing_integration.models import BillingCycle, Price

    cycle = BillingCycle.objects.create(product=product, unit="months", frequency=1)
    Price.objects.create(cycle=cycle, currency_id=1, amount=7000)
    assert push_open() == ["done"]
    product.refresh_from_db()
    assert product.sync_state == "synced" and product.remote_id is not None
    posted = billing_sandbox.requests("create_product")[-1]["body"]
    assert "features" not in posted  # the interface's POST body has no features
    billing_sandbox.clear_requests()
    entries = OutboxEntry.objects.count()
    before = Product.objects.values("sync_state", "sync_error", "updated_at").get(pk=product.pk)

    feature = ProductFeature.objects.create(product=product, key="sso")
    ProductFeature.objects.create(product=product, key="seats", limit=5)
    feature.key = "api"
    feature.save()
    ProductFeature.objects.filter(key="seats").update(limit=6)
    feature.delete()

    assert OutboxEntry.objects.count() == entries
    assert (
        Product.objects.values("sync_state", "sync_error", "updated_at").get(pk=product.pk)
        == before
    )
    assert push_open() == []
    assert [r["operation"] for r in billing_sandbox.requests()] == []


def test_the_admin_saves_features_without_pushing(billing_sandbox):
    remote = create_on_service("Team plan", ["sso"])
    pull()
    product = Product.objects.get(remote_id=remote["id"])
    admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(admin)
    url = reverse("admin:billing_integration_product_change", args=[product.pk])

    html = client.get(url).content.decode()
    assert "the service&#x27;s API has no way to receive features" in html
    assert 'name="declared_features-TOTAL_FORMS"' in html
    billing_sandbox.clear_requests()

    data = product_form_data(
        product,
        **{
            "declared_features-TOTAL_FORMS": "2",
            "declared_features-0-key": "Members",
            "declared_features-1-key": "seats",
            "declared_features-1-limit": "5",
        },
    )
    response = client.post(url, data)
    assert response.status_code == 302, response.content.decode()[:3000]
    assert sorted(product.declared_features.values_list("key", "limit")) == [
        ("members", None),
        ("seats", 5),
    ]
    assert OutboxEntry.objects.count() == 0
    product.refresh_from_db()
    assert product.sync_state == "synced"

    # editing and removing one: still nothing
    product = Product.objects.get(pk=product.pk)
    data = product_form_data(product)
    data["declared_features-1-limit"] = "9"
    data["declared_features-0-DELETE"] = "on"
    assert client.post(url, data).status_code == 302
    assert list(product.declared_features.values_list("key", "limit")) == [("seats", 9)]
    assert OutboxEntry.objects.count() == 0
    assert push_open() == []
    assert billing_sandbox.requests("update_product") == []

    # a change of the product itself is still pushed (and carries no features)
    data = product_form_data(product, description="Now with SSO")
    assert client.post(url, data).status_code == 302
    assert push_open() == ["done"]
    (patch,) = billing_sandbox.requests("update_product")
    assert patch["body"] == {"description": "Now with SSO"}
