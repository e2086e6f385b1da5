"""Access checks: subscribed(), the decorator, the mixin, the DRF permission, template tags."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.template import engines
from django.test import RequestFactory
from django.utils import timezone

from billing_integration.access import (
    active_subscriptions,
    get_subscriber,
    subscribed,
    subscription_required_url,
)
from billing_integration.models import Customer, Product, Subscription
from billing_integration.outbox import from_remote
from tests.conftest import mark_pushed

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.checkout.urls")]

NOW = timezone.now


def local_product(name: str, status: str = "published") -> Product:
    with from_remote():
        return Product.objects.create(name=name, status=status, selected_currencies=[1])


def subscribe(subscriber, product, **fields) -> Subscription:
    defaults = {
        "status": "published",
        "cycle_start_date": NOW() - timedelta(days=1),
        "cycle_end_date": NOW() + timedelta(days=29),
    }
    defaults.update(fields)
    with from_remote():
        customer, _ = Customer.objects.get_or_create(
            subscriber=subscriber, defaults={"identifier": f"auth.user:{subscriber.pk}"}
        )
        return Subscription.objects.create(customer=customer, product=product, **defaults)


@pytest.fixture
def pro(db):
    return local_product("Pro plan")


@pytest.fixture
def basic(db):
    return local_product("Basic plan")


# --- subscribed() and the active rule ----------------------------------------------------
def test_subscribed_follows_the_active_rule(user, pro, basic, settings):
    assert not subscribed(user)
    sub = subscribe(user, basic)
    assert subscribed(user) and subscribed(user, basic) and subscribed(user, basic.pk)
    assert subscribed(user, "Basic plan") and subscribed(user, str(basic.pk))
    assert not subscribed(user, pro) and not subscribed(user, "Pro plan")
    assert not subscribed(user, "No such plan")
    assert list(active_subscriptions(user)) == [sub]

    # canceled: access until the cycle end (ACCESS_AFTER_CANCEL "period_end"), or none
    Subscription.objects.filter(pk=sub.pk).update(status="canceled")
    assert subscribed(user)  # its cycle ends in 29 days
    settings.BILLING = {**settings.BILLING, "ACCESS_AFTER_CANCEL": "immediately"}
    assert not subscribed(user)
    settings.BILLING = {**settings.BILLING, "ACCESS_AFTER_CANCEL": "period_end"}
    Subscription.objects.filter(pk=sub.pk).update(status="paused")
    assert not subscribed(user)
    # cycle ended, no trial
    Subscription.objects.filter(pk=sub.pk).update(
        status="published", cycle_end_date=NOW() - timedelta(minutes=1)
    )
    assert not subscribed(user)
    # cycle ended but still in trial
    Subscription.objects.filter(pk=sub.pk).update(trial_end_date=NOW() + timedelta(days=3))
    assert subscribed(user)
    # no cycle end at all
    Subscription.objects.filter(pk=sub.pk).update(cycle_end_date=None, trial_end_date=None)
    assert subscribed(user)


def test_unicode_digits_resolve_to_no_product(user, pro):
    from billing_integration.access import resolve_product

    subscribe(user, pro)
    assert resolve_product("²") is None and resolve_product("①") is None
    assert not subscribed(user, "²")
    assert resolve_product(str(pro.pk)) == pro
    too_long = "9" * 5000  # more digits than int() reads from text
    assert resolve_product(too_long) is None
    assert not subscribed(user, too_long)


def on_sale(product: Product) -> Product:
    """``product`` pushed (a remote id), with a monthly cycle priced in XOF and USD."""
    import uuid
    from decimal import Decimal

    from billing_integration.models import BillingCycle, Price

    with from_remote():
        Product.objects.filter(pk=product.pk).update(
            remote_id=uuid.uuid4(), selected_currencies=[1, 2]
        )
        cycle = BillingCycle.objects.create(product=product, unit="months", frequency=1)
        for currency_id in (1, 2):
            Price.objects.create(cycle=cycle, currency_id=currency_id, amount=Decimal("10"))
    product.refresh_from_db()
    mark_pushed(product)
    return product


def test_checkout_button_with_a_unicode_digit_currency(user, pro):
    html = render('{% billing_checkout_button product currency="²" %}', product=on_sale(pro))
    # the view would answer 400 (no such currency): not offered
    assert "<form" not in html and "Not available" in html


def test_subscribed_by_remote_id(user, pro):
    import uuid

    rid = uuid.uuid4()
    Product.objects.filter(pk=pro.pk).update(remote_id=rid)
    subscribe(user, pro)
    assert subscribed(user, rid) and subscribed(user, str(rid))


def test_a_boolean_names_no_product(user):
    """``True`` is no primary key: it named product 1 (``isinstance(True, int)``)."""
    with from_remote():
        first = Product.objects.create(pk=1, name="First", selected_currencies=[1])
    subscribe(user, first)
    assert subscribed(user, first) and subscribed(user, 1)
    assert not subscribed(user, True) and not subscribed(user, False)


def test_a_name_means_every_product_of_that_name(client, user, pro):
    """An archived product keeps its subscriptions (the interface), and a new product may take
    its name: access by name holds for the subscribers of either, on every path."""
    Product.objects.filter(pk=pro.pk).update(status="archived")
    successor = local_product("Pro plan")
    subscribe(user, successor)
    old_subscriber = get_user_model().objects.create_user("early")
    subscribe(old_subscriber, pro)
    for subscriber in (user, old_subscriber):
        assert subscribed(subscriber, "Pro plan") and subscribed(subscriber, " Pro plan ")
    assert not subscribed(user, pro) and subscribed(user, successor)
    assert list(active_subscriptions(user, "Pro plan")) == list(active_subscriptions(user))
    client.force_login(user)
    assert client.get("/pro/").status_code == 200
    assert client.get("/pro-cbv/").status_code == 200
    assert client.get("/api/pro/").status_code == 200
    html = engines["django"].from_string(
        "{% load billing %}{% if user|subscribed_to:'Pro plan' %}yes{% endif %}"
    )
    assert html.render({"user": user}) == "yes"
    assert not subscribed(get_user_model().objects.create_user("nobody"), "Pro plan")


def test_no_subscriber(user, pro):
    subscribe(user, pro)
    assert not subscribed(None)
    assert not subscribed(AnonymousUser())
    other = get_user_model().objects.create_user("carol")
    assert not subscribed(other)


def test_subscriber_resolver(settings, user, pro):
    team = get_user_model().objects.create_user("team-account")
    subscribe(team, pro)
    request = RequestFactory().get("/")
    request.user = user
    assert get_subscriber(request) == user and not subscribed(get_subscriber(request))
    settings.BILLING = {
        **settings.BILLING,
        "SUBSCRIBER_RESOLVER": "tests.checkout.test_access.team_of",
    }
    assert get_subscriber(request) == team and subscribed(get_subscriber(request))
    request.user = AnonymousUser()
    assert get_subscriber(request) is None


def team_of(request):
    return get_user_model().objects.get(username="team-account")


def test_subscription_required_url(settings):
    settings.BILLING = {**settings.BILLING, "PRICING_URL": None}
    assert subscription_required_url() == "/"
    settings.BILLING = {**settings.BILLING, "PRICING_URL": "pricing"}
    assert subscription_required_url(next_path="/members/") == "/pricing/?next=%2Fmembers%2F"
    settings.BILLING = {**settings.BILLING, "PRICING_URL": "/plans/?ref=x"}
    assert subscription_required_url(next_path="/m/") == "/plans/?ref=x&next=%2Fm%2F"


# --- decorator and mixin ---------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/members/", "/members-cbv/"])
def test_anonymous_goes_to_login(client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"] == f"/login/?next={path}"


@pytest.mark.parametrize("path", ["/members/", "/members-cbv/", "/pro/", "/pro-cbv/"])
def test_non_subscriber_goes_to_the_configured_page(client, user, settings, path, pro):
    settings.BILLING = {**settings.BILLING, "PRICING_URL": "pricing"}
    client.force_login(user)
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"] == f"/pricing/?next={path.replace('/', '%2F')}"


def test_per_view_redirect_url(client, user, pro):
    client.force_login(user)
    response = client.get("/pro-upgrade/")
    assert response["Location"] == "/upgrade/?next=%2Fpro-upgrade%2F"


def test_subscriber_gets_in(client, user, pro, basic):
    subscribe(user, basic)
    client.force_login(user)
    assert client.get("/members/").content == b"members only"
    assert client.get("/members-cbv/").content == b"members cbv"
    # a subscription to another product does not open the Pro pages
    assert client.get("/pro/").status_code == 302
    assert client.get("/pro-cbv/").status_code == 302
    subscribe(user, pro)
    assert client.get("/pro/").content == b"pro only"
    assert client.get("/pro-cbv/").content == b"pro cbv"


def test_expired_subscriber_is_sent_away(client, user, pro):
    subscribe(user, pro, cycle_end_date=NOW() - timedelta(days=1))
    client.force_login(user)
    assert client.get("/members/").status_code == 302


# --- DRF permission ----------------------------------------------------------------------------
def test_permission(client, user, pro, basic):
    assert client.get("/api/members/").status_code == 403  # anonymous (session auth first)
    client.force_login(user)
    response = client.get("/api/members/")
    assert response.status_code == 403
    assert response.json()["detail"] == "An active subscription is required."
    subscribe(user, basic)
    assert client.get("/api/members/").json() == {"ok": True}
    assert client.get("/api/pro/").status_code == 403
    subscribe(user, pro)
    assert client.get("/api/pro/").status_code == 200


def test_permission_with_basic_auth(client, user, pro):
    import base64

    subscribe(user, pro)
    auth = "Basic " + base64.b64encode(b"alice:pw-for-tests").decode()
    assert client.get("/api/members/", HTTP_AUTHORIZATION=auth).status_code == 200
    bad = "Basic " + base64.b64encode(b"alice:wrong").decode()
    assert client.get("/api/members/", HTTP_AUTHORIZATION=bad).status_code in (401, 403)


# --- template tags -------------------------------------------------------------------------------
def render(text: str, **context) -> str:
    return engines["django"].from_string("{% load billing %}" + text).render(context).strip()


def test_filters(user, pro, basic):
    tpl = (
        "{% if user|subscribed_to:product %}yes{% else %}no{% endif %}"
        "{% if user|subscribed_to:None %}Y{% else %}N{% endif %}"
        "{% if user|is_subscriber %}1{% else %}0{% endif %}"
    )
    assert render(tpl, user=user, product=pro) == "noN0"
    subscribe(user, basic)
    assert render(tpl, user=user, product=pro) == "noY1"
    assert render(tpl, user=user, product=basic) == "yesY1"
    assert render(tpl, user=AnonymousUser(), product=basic) == "noN0"


def test_is_subscribed_and_if_subscribed_use_the_request(user, pro, basic):
    request = RequestFactory().get("/")
    request.user = user
    tpl = (
        "{% is_subscribed product as ok %}{{ ok }}|{% is_subscribed as any %}{{ any }}|"
        "{% if_subscribed product %}in{% else %}out{% endif_subscribed %}|"
        "{% if_subscribed %}in{% endif_subscribed %}"
    )
    assert render(tpl, request=request, product=pro) == "False|False|out|"
    subscribe(user, basic)
    assert render(tpl, request=request, product=pro) == "False|True|out|in"
    subscribe(user, pro)
    assert render(tpl, request=request, product=pro) == "True|True|in|in"
    request.user = AnonymousUser()
    assert render(tpl, request=request, product=pro) == "False|False|out|"


def test_checkout_button_renders_a_post_form_with_csrf(client, user, pro):
    from django.middleware.csrf import get_token

    request = RequestFactory().get("/")
    request.user = user
    token = get_token(request)
    engine = engines["django"]
    html = engine.from_string(
        '{% load billing %}{% billing_checkout_button product cycle="months-1" currency="XOF" '
        'label="Go Pro" next="/members/" %}'
    ).render({"product": on_sale(pro)}, request=request)
    assert '<form method="post" action="/billing/checkout/"' in html
    assert 'name="csrfmiddlewaretoken"' in html and token  # token rendered from the request
    assert f'name="product" value="{pro.pk}"' in html
    assert 'name="cycle" value="months-1"' in html
    assert 'name="currency" value="XOF"' in html
    assert 'name="next" value="/members/"' in html
    assert ">Go Pro</button>" in html

    by_id = engine.from_string(
        "{% load billing %}{% billing_checkout_button product currency=2 %}"
    ).render({"product": pro}, request=request)
    assert 'name="currency" value="USD"' in by_id and ">Subscribe</button>" in by_id


def test_checkout_button_for_unpublished_product(user):
    draft = local_product("Soon", status="draft")
    html = render("{% billing_checkout_button product %}", product=draft)
    assert "<form" not in html and "Not available" in html
    assert "<form" not in render("{% billing_checkout_button 999 %}")


# --- an inactive user ------------------------------------------------------------------------
def test_an_inactive_user_is_no_subscriber_on_any_path(client, user, pro, settings):
    """A deactivated account's subscription opens nothing: Django's permissions and DRF's
    authentication refuse an inactive user too, and a backend that lets one log in
    (``AllowAllUsersModelBackend``) must not make the decorator and the mixin disagree with
    the DRF permission."""
    settings.AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.AllowAllUsersModelBackend"]
    subscribe(user, pro)
    client.force_login(user)
    assert client.get("/members/").status_code == 200
    user.is_active = False
    user.save()
    assert not subscribed(user) and not active_subscriptions(user).exists()
    request = RequestFactory().get("/")
    request.user = user
    assert get_subscriber(request) is None
    for path in ("/members/", "/members-cbv/", "/pro/", "/pro-cbv/"):
        assert client.get(path).status_code == 302, path
    assert client.get("/api/members/").status_code == 403
