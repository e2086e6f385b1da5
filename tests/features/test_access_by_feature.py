"""Access by feature: has_feature / feature_limit over a table of subscriptions, through every
form (function, decorator, mixin, template filter and tag, DRF permission), and one query per
request however many checks."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.template import engines
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing_integration.access import (
    feature_limit,
    feature_required,
    features_for,
    features_of,
    has_feature,
    products_with_feature,
    refused_feature,
)
from billing_integration.models import Product, ProductFeature

from .conftest import make_product, subscribe

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.features.urls")]

KEYS = ("sso", "seats", "api", "reports", "members")
PAST = -timedelta(minutes=1)
AHEAD = timedelta(days=3)


def products() -> dict:
    return {
        # the service's features only (as pulled: kept in remote_data)
        "service": make_product("Service", service=["sso", {"name": "seats", "value": 3}]),
        # declared here only
        "local": make_product("Local", declared={"api": None, "seats": 5}),
        # both: the declaration here wins for "seats" (2 over the service's 10)
        "both": make_product(
            "Both",
            service=[{"key": "seats", "limit": 10}, {"code": "reports"}],
            declared={"seats": 2, "sso": None},
        ),
    }


def ends(delta: timedelta | None) -> dict:
    return {} if delta is None else {"cycle_end_date": timezone.now() + delta}


# (subscriptions: [(product, fields)], expected features)
TABLE = {
    "none": ([], {}),
    "service only": ([("service", {})], {"sso": None, "seats": 3}),
    "local only": ([("local", {})], {"api": None, "seats": 5}),
    "both, local wins": ([("both", {})], {"seats": 2, "reports": None, "sso": None}),
    "several: largest limit": (
        [("service", {}), ("local", {}), ("both", {})],
        {"sso": None, "seats": 5, "api": None, "reports": None},
    ),
    "no cycle end": ([("local", {"cycle_end_date": None})], {"api": None, "seats": 5}),
    "lapsed": ([("local", ends(PAST))], {}),
    "lapsed, in trial": (
        [("local", {**ends(PAST), "trial_end_date": timezone.now() + AHEAD})],
        {"api": None, "seats": 5},
    ),
    # the grace period (ACCESS_AFTER_CANCEL "period_end", the default): until the cycle end
    "canceled, in its paid period": (
        [("service", {"status": "canceled"})],
        {"sso": None, "seats": 3},
    ),
    "canceled, paid period over": ([("service", {"status": "canceled", **ends(PAST)})], {}),
    "unknown status": ([("service", {"status": "past_due"})], {}),
    "no status": ([("local", {"status": ""})], {}),
    "paused": ([("local", {"status": "paused"})], {}),
    "active and canceled": (
        [("service", {}), ("local", {"status": "canceled", **ends(PAST)})],
        {"sso": None, "seats": 3},
    ),
}


def test_a_canceled_subscription_grants_no_feature_when_a_cancel_ends_access_at_once(
    user, settings
):
    settings.BILLING = {**settings.BILLING, "ACCESS_AFTER_CANCEL": "immediately"}
    subscribe(user, products()["service"], status="canceled")
    assert features_of(user) == {} and not has_feature(user, "sso")


@pytest.fixture
def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("case", list(TABLE))
def test_every_form_follows_the_table(case, user, logged_in, settings):
    settings.BILLING = {**settings.BILLING, "PRICING_URL": "/plans/"}
    catalogue = products()
    subscriptions, expected = TABLE[case]
    for name, fields in subscriptions:
        subscribe(user, catalogue[name], **fields)

    assert features_of(user) == expected
    for key in KEYS:
        granted = key in expected
        limit = expected.get(key)
        assert has_feature(user, key) is granted, key
        assert feature_limit(user, key) == limit, key
        assert has_feature(user, key.upper()) is granted  # keys compare lower-cased

        # the decorator and the mixin: through, or to PRICING_URL with ?next=
        # and the missing feature
        for prefix in ("decorator", "mixin"):
            response = logged_in.get(f"/{prefix}/{key}/")
            if granted:
                assert response.status_code == 200, (prefix, key)
            else:
                assert response.status_code == 302, (prefix, key)
                assert response["Location"] == f"/plans/?next=%2F{prefix}%2F{key}%2F&feature={key}"
        # the DRF permission
        assert logged_in.get(f"/api/{key}/").status_code == (200 if granted else 403), key
        # the template filters and the tag
        html = logged_in.get(f"/template/{key}/").content.decode()
        word = "yes" if granted else "no"
        assert html == f"filter={word};request={word};tag={word};limit={limit}", key


def test_anonymous_and_no_subscriber(user, client):
    make_product("Service", service=["sso"])
    assert not has_feature(None, "sso") and not has_feature(AnonymousUser(), "sso")
    assert feature_limit(None, "sso") is None
    response = client.get("/decorator/sso/")
    assert response.status_code == 302 and response["Location"].startswith("/login/?next=")
    response = client.get("/sso-mixin/")
    assert response.status_code == 302 and response["Location"].startswith("/login/?next=")
    assert client.get("/api/sso/").status_code in (401, 403)
    html = client.get("/template/sso/").content.decode()
    assert html == "filter=no;request=no;tag=no;limit=None"


def test_redirect_url_and_the_named_forms(user, logged_in):
    catalogue = products()
    response = logged_in.get("/sso/")
    assert response.status_code == 302
    assert response["Location"] == "/upgrade/?next=%2Fsso%2F&feature=sso"
    assert logged_in.get("/sso-mixin/").status_code == 302
    assert logged_in.get("/api-sso/").status_code == 403
    subscribe(user, catalogue["service"])
    assert logged_in.get("/sso/").content == b"sso"
    assert logged_in.get("/sso-mixin/").status_code == 200
    assert logged_in.get("/api-sso/").status_code == 200


def test_a_missing_or_empty_feature_is_a_configuration_error(user, logged_in):
    with pytest.raises(ImproperlyConfigured):
        feature_required("")
    with pytest.raises(TypeError):
        feature_required(lambda request: None)  # bare @feature_required
    with pytest.raises(ImproperlyConfigured):
        logged_in.get("/api-none/")
    assert not has_feature(user, "") and not has_feature(user, None)  # type: ignore[arg-type]


def test_a_limit_without_a_number_elsewhere_keeps_the_number(user):
    subscribe(user, make_product("A", service=["seats"]))
    assert has_feature(user, "seats") and feature_limit(user, "seats") is None
    subscribe(user, make_product("B", declared={"seats": 4}))
    assert feature_limit(user, "seats") == 4


def test_the_subscriber_resolver_is_followed(settings, user):
    team = get_user_model().objects.create_user("team-account")
    subscribe(team, make_product("Team plan", declared={"sso": None}))
    settings.BILLING = {
        **settings.BILLING,
        "SUBSCRIBER_RESOLVER": "tests.features.test_access_by_feature.team_of",
    }
    request = RequestFactory().get("/")
    request.user = user
    assert not has_feature(user, "sso")
    assert has_feature(request, "sso") and features_for(request) == {"sso": None}


def team_of(request):
    return get_user_model().objects.get(username="team-account")


def test_the_request_cache_follows_a_login_and_a_logout(user):
    """The request's memoised features are its user's: a login or a logout in the request
    (``request.user`` replaced) is not answered with the previous user's features."""
    from django.contrib.auth import login, logout
    from django.contrib.sessions.backends.db import SessionStore

    subscribe(user, make_product("Local", declared={"sso": None, "seats": 5}))
    request = RequestFactory().get("/")
    request.session = SessionStore()
    request.user = user
    assert has_feature(request, "sso") and feature_limit(request, "seats") == 5
    logout(request)
    assert not has_feature(request, "sso") and feature_limit(request, "seats") is None
    assert features_for(request) == {}
    login(request, get_user_model().objects.get(pk=user.pk))
    assert has_feature(request, "sso") and feature_limit(request, "seats") == 5


# --- queries ------------------------------------------------------------------------------------
def test_one_query_per_request_however_many_checks(user, django_assert_num_queries):
    catalogue = products()
    for product in catalogue.values():
        subscribe(user, product)
    from .urls import many_checks

    request = RequestFactory().get("/many/")
    request.user = get_user_model().objects.get(pk=user.pk)  # as the auth middleware loads it
    with django_assert_num_queries(1):
        response = many_checks(request)
    body = response.content.decode()
    assert body.startswith("[True, False, 5, 5]|")
    assert "filter=yes;request=yes;tag=yes;limit=5" in body
    assert "filter=yes;request=yes;tag=yes;limit=None" in body


def test_one_query_per_request_through_the_client(user, logged_in):
    for product in products().values():
        subscribe(user, product)

    def feature_queries(path: str) -> int:
        with CaptureQueriesContext(connection) as queries:
            assert logged_in.get(path).status_code == 200
        return sum("billing_integration_subscription" in q["sql"] for q in queries)

    assert feature_queries("/many/") == 1
    assert feature_queries("/api-many/") == 1  # two DRF permissions and the view's check
    assert feature_queries("/many/") == 1  # a new request: a fresh computation, once


def test_without_a_request_each_call_is_one_fresh_query(user, django_assert_num_queries):
    product = make_product("Local", declared={"api": None})
    with django_assert_num_queries(1):
        assert not has_feature(user, "api")
    subscribe(user, product)
    with django_assert_num_queries(1):
        assert has_feature(user, "api")  # not memoised: sees the new subscription
    ProductFeature.objects.filter(product=product).update(limit=7)
    assert feature_limit(user, "api") == 7


def test_the_template_filter_memoises_on_the_subscriber(user, django_assert_num_queries):
    subscribe(user, make_product("Local", declared={"api": None, "seats": 5}))
    fresh = get_user_model().objects.get(pk=user.pk)
    template = engines["django"].from_string(
        "{% load billing %}{{ u|has_feature:'api' }} {{ u|has_feature:'sso' }} "
        "{{ u|feature_limit:'seats' }} {% if_feature 'api' %}yes{% endif_feature %}"
    )
    with django_assert_num_queries(1):
        assert template.render({"u": fresh, "user": fresh}) == "True False 5 yes"


# --- issue 23: a refusal names the missing feature and the plans that include it --------------
def test_the_plans_that_include_a_feature(db):
    products()
    make_product("Withdrawn", service=[{"name": "reports", "enabled": False}])
    draft = make_product("Draft", declared={"reports": None})
    Product.objects.filter(pk=draft.pk).update(status="draft")

    def names(key):
        return [p.name for p in products_with_feature(key)]

    assert names("reports") == ["Both"]  # the service's array; not withdrawn, not a draft
    assert names(" SSO ") == ["Both", "Service"]  # declared here, or the service's
    assert names("seats") == ["Both", "Local", "Service"]
    assert names("nothing") == [] and names("") == [] and names(None) == []


def test_the_plans_that_include_a_feature_are_on_sale(db):
    # Published here, but the service refused the publication (it still says archived): not
    # on sale (checkout answers 409 product_archived), so no plan to offer.
    refused = make_product("Refused", declared={"reports": None})
    Product.objects.filter(pk=refused.pk).update(
        sync_state="failed", remote_data={"status": "archived", "features": []}
    )
    make_product("Team", declared={"reports": None})

    assert [p.name for p in products_with_feature("reports")] == ["Team"]


def test_refused_feature_reads_the_redirect_back(db, rf):
    products()
    assert refused_feature(rf.get("/pricing/", {"next": "/x/"})) is None
    assert refused_feature(rf.get("/pricing/", {"feature": "  "})) is None
    assert refused_feature(rf.get("/pricing/", {"feature": "x" * 101})) is None
    found = refused_feature(rf.get("/pricing/", {"next": "/x/", "feature": "Reports"}))
    assert found["feature"] == "reports"
    assert [p.name for p in found["products"]] == ["Both"]
