"""The trial and checkout buttons are offered exactly when a click is accepted: each case
renders the button on a page, then posts what it carries (or, with no button, what it would
have carried) to its view."""

from __future__ import annotations

import re

import pytest
from django.template import engines
from django.test import RequestFactory

from billing_integration.models import BillingCycle, Price, Product

from .conftest import make_product

pytestmark = pytest.mark.django_db(transaction=True)


def _trial(days: int = 14, **fields) -> Product:
    product = make_product("Trial plan")
    Product.objects.filter(pk=product.pk).update(trial_days=days, **fields)
    product.refresh_from_db()
    return product


def _no_cycles() -> Product:
    product = _trial()
    BillingCycle.objects.filter(product=product).delete()
    return product


def _not_pushed() -> Product:
    product = make_product("Local plan", push=False)
    Product.objects.filter(pk=product.pk).update(trial_days=14)
    product.refresh_from_db()
    return product


def _no_price() -> Product:
    product = _trial()
    Price.objects.filter(cycle__product=product).delete()
    return product


TRIAL_CASES = {
    "on sale": (lambda: _trial(), "months-1", "XOF"),
    "cycles not confirmed (pulled)": (lambda: _trial(blueprint_known=False), "months-1", "XOF"),
    "no cycle at all": (_no_cycles, "", ""),
    "more trial days than start_trial accepts": (lambda: _trial(days=400), "months-1", "XOF"),
    "not pushed yet": (_not_pushed, "months-1", "XOF"),
    "no price in the currency": (lambda: _trial(), "years-1", "USD"),
    "no price at all": (_no_price, "", ""),
    "a cycle it does not have": (lambda: _trial(), "weeks-1", "XOF"),
    "not on sale": (lambda: _trial(status="draft"), "months-1", "XOF"),
}

CHECKOUT_CASES = {
    "on sale": (lambda: make_product(), "months-1", "XOF"),
    "not pushed yet": (lambda: make_product(push=False), "months-1", "XOF"),
    "no price in the currency": (lambda: make_product(), "years-1", "USD"),
    "no price at all": (_no_price, "", ""),
    "a cycle it does not have": (lambda: make_product(), "weeks-1", "XOF"),
    "not on sale": (lambda: make_product(status="draft"), "months-1", "XOF"),
}


def _render(tag: str, product: Product, user, cycle: str, currency: str) -> str:
    request = RequestFactory().get("/pricing/")
    request.user = user
    return (
        engines["django"]
        .from_string(f"{{% load billing %}}{{% {tag} product cycle=cycle currency=currency %}}")
        .render({"product": product, "cycle": cycle, "currency": currency}, request=request)
    )


def _posted(html: str, form_class: str) -> dict[str, str] | None:
    """The hidden fields of the button's form, or None without one."""
    form = re.search(rf'<form[^>]*class="{form_class}[^"]*">(.*?)</form>', html, re.S)
    if form is None:
        return None
    fields = re.findall(r'name="(\w+)" value="([^"]*)"', form.group(1))
    return {k: v for k, v in fields if k != "csrfmiddlewaretoken"}


def _offered_iff_accepted(logged_in, user, tag, form_class, url, case) -> None:
    make, cycle, currency = case
    product = make()
    posted = _posted(_render(tag, product, user, cycle, currency), form_class)
    offered = posted is not None
    data = posted or {"product": str(product.pk), "cycle": cycle, "currency": currency}
    response = logged_in.post(url, data)
    accepted = response.status_code == 302
    assert offered == accepted, (offered, response.status_code, response.content[:300])


@pytest.mark.parametrize("case", TRIAL_CASES.values(), ids=TRIAL_CASES.keys())
def test_the_trial_button_is_shown_iff_a_click_starts_the_trial(
    billing_sandbox, logged_in, user, case
) -> None:
    _offered_iff_accepted(logged_in, user, "billing_trial_button", "billing-trial-form",
                          "/billing/trial/", case)  # fmt: skip


@pytest.mark.parametrize("case", CHECKOUT_CASES.values(), ids=CHECKOUT_CASES.keys())
def test_the_checkout_button_is_shown_iff_a_click_starts_the_checkout(
    billing_sandbox, logged_in, user, case
) -> None:
    _offered_iff_accepted(logged_in, user, "billing_checkout_button", "billing-checkout-form",
                          "/billing/checkout/", case)  # fmt: skip


def _shown_iff_accepted(client, user, tag, form_class, url, product) -> None:
    posted = _posted(_render(tag, product, user, "months-1", "XOF"), form_class)
    data = posted or {"product": str(product.pk), "cycle": "months-1", "currency": "XOF"}
    response = client.post(url, data)
    assert (posted is not None) == (response.status_code == 302), (
        posted,
        response.status_code,
        re.findall(r'data-error-code="(\w+)"', response.content.decode()),
    )


def _other_plan_in_the_way(way: str, user, client) -> Product:
    """Starter (a 14-day trial), and Pro held in ``way``; returns Starter."""
    from datetime import timedelta

    from django.utils import timezone

    from billing_integration.checkout.trials import start_trial

    starter, pro = _trial(), make_product("Pro")
    if way == "checkout open":
        data = {"product": pro.pk, "cycle": "months-1", "currency": "XOF"}
        assert client.post("/billing/checkout/", data).status_code == 302
    elif way == "trial not pushed yet":
        start_trial(user, pro, "months-1", "XOF", days=14, wait=False)
    elif way == "may still renew":
        from .test_one_purchase import hold

        hold(user, pro, auto_renew=True, cycle_end_date=timezone.now() - timedelta(days=1))
    return starter


WAYS = ("checkout open", "trial not pushed yet", "may still renew")


@pytest.mark.parametrize("way", WAYS)
def test_the_trial_button_beside_another_plan(billing_sandbox, logged_in, user, way) -> None:
    starter = _other_plan_in_the_way(way, user, logged_in)
    _shown_iff_accepted(logged_in, user, "billing_trial_button", "billing-trial-form",
                        "/billing/trial/", starter)  # fmt: skip


@pytest.mark.parametrize("way", WAYS)
def test_the_checkout_button_beside_another_plan(billing_sandbox, logged_in, user, way) -> None:
    starter = _other_plan_in_the_way(way, user, logged_in)
    _shown_iff_accepted(logged_in, user, "billing_checkout_button", "billing-checkout-form",
                        "/billing/checkout/", starter)  # fmt: skip
