"""The example project gates ``/reports/`` by the feature ``reports`` (declared on the seeded
Pro and Team products), not by a product name."""

from __future__ import annotations

import io
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from billing_integration.models import Product, ProductFeature

from .conftest import subscribe

pytestmark = pytest.mark.django_db


def seed() -> None:
    call_command("billing_demo_seed", stdout=io.StringIO())


def test_the_seed_declares_features_and_adds_missing_ones_on_reruns():
    seed()
    pro = Product.objects.get(name="Pro")
    assert sorted(pro.declared_features.values_list("key", "limit")) == [
        ("members", None),
        ("reports", None),
        ("seats", 5),
    ]
    ProductFeature.objects.filter(product=pro, key="reports").delete()
    seed()
    seed()
    assert pro.declared_features.filter(key="reports").count() == 1
    assert ProductFeature.objects.count() == 2 + 3 + 4  # Starter, Pro, Team


def test_reports_requires_the_feature(client):
    seed()
    demo = get_user_model().objects.get(username="demo")
    anonymous = client.get("/reports/")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")
    client.force_login(demo)
    refused = client.get("/reports/")
    assert refused.status_code == 302
    assert refused["Location"] == "/pricing/?next=%2Freports%2F&feature=reports"

    subscribe(demo, Product.objects.get(name="Starter"))
    assert client.get("/reports/").status_code == 302  # subscribed, but Starter lacks reports

    subscribe(demo, Product.objects.get(name="Pro"))
    page = client.get("/reports/").content.decode()
    assert 'id="reports"' in page and "Seats: 5" in page  # the largest of 1 and 5
    assert 'id="feature-sso"' not in page

    subscribe(demo, Product.objects.get(name="Team"))
    page = client.get("/reports/").content.decode()
    assert 'id="feature-sso"' in page and "API access: included" in page


def test_pricing_names_the_missing_feature_and_the_plans_with_it(client):
    seed()
    demo = get_user_model().objects.get(username="demo")
    client.force_login(demo)

    page = client.get("/reports/", follow=True).content.decode()  # no plan at all
    assert 'id="feature-required"' in page and 'id="subscription-required"' not in page
    assert "This page needs a plan with the feature “reports”." in page
    assert "The members area needs an active subscription" not in page
    plans = re.findall(r'<strong class="feature-plan">([^<]*)</strong>', page)
    assert plans == ["Pro", "Team"]  # Starter lacks it

    subscribe(demo, Product.objects.get(name="Starter"))
    response = client.get("/reports/", follow=True)
    assert response.redirect_chain == [("/pricing/?next=%2Freports%2F&feature=reports", 302)]
    page = response.content.decode()
    assert "Your plan does not include the feature “reports” that this page needs." in page
    assert re.findall(r'<strong class="feature-plan">([^<]*)</strong>', page) == ["Pro", "Team"]
    assert "The members area needs an active subscription" not in page

    page = client.get("/pricing/?next=%2Freports%2F&feature=%3Cb%3Eunknown").content.decode()
    assert "No plan includes it yet." in page and "<b>unknown" not in page  # escaped


def test_the_members_page_still_asks_for_a_subscription(client):
    seed()
    client.force_login(get_user_model().objects.get(username="demo"))
    page = client.get("/members/", follow=True).content.decode()
    assert "The members area needs an active subscription" in page
    assert 'id="feature-required"' not in page
