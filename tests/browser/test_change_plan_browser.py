"""A change of plan in the example project, in a real Chromium (issue 28), in English and in
French: a user subscribes to Basic on the pricing page, then clicks "Change plan" on Pro. With
the checkout guess on (the sandbox switched to accept ``upgrade``) he confirms on the hosted
page and his billing page shows Pro renewing and Basic ending; with the guesses off (the
default) the billing page says the change is requested. The example project runs on
pytest-django's ``live_server``; products are pushed synchronously (no worker needed: the
checkout return page pulls the subscriptions). Screenshots under ``test-artifacts/browser/``.

Skipped, with the reason, when ``/usr/bin/chromium`` or ``playwright`` is missing.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from django.core.cache import cache

from .test_demo_browser import CHROMIUM, SUCCESS_PHONE, pay, sign_up

if not CHROMIUM.exists():  # pragma: no cover - the import above skips first
    pytest.skip("no chromium", allow_module_level=True)

from billing_integration.models import ChangeRequest, ChangeState, ChangeVia
from tests.checkout.conftest import make_product, push_open_entries

from .test_demo_browser import browser, shots  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pushes are sent by the test (``push_open_entries``), never through a broker."""
    from billing_integration.outbox import tasks

    monkeypatch.setattr(tasks, "enqueue", lambda pk, countdown=None: True)


@pytest.fixture
def stack(live_server: Any, billing_sandbox: Any, settings: Any) -> str:
    billing_sandbox.config(
        return_url=live_server.url + "/billing/checkout/return/?session={session_id}"
    )
    settings.DEBUG = True
    make_product("Basic")
    make_product("Pro")
    push_open_entries()
    return str(live_server.url)


def option(page: Any, product: str) -> Any:
    plan = page.locator("section.plan", has=page.locator("h2", has_text=product))
    return plan.locator("div.option[data-cycle='months-1'][data-currency='XOF']")


def subscribe_to_basic(browser: Any, base: str, shots: Any, tag: str) -> Any:  # noqa: F811
    page = sign_up(browser, base, f"{tag}-{uuid.uuid4().hex[:6]}", shots)
    option(page, "Basic").locator("button[type=submit]").click()
    page.wait_for_url(re.compile(r".*/checkout/[0-9a-f-]{36}$"))
    assert pay(page, SUCCESS_PHONE, shots, tag) == "success"
    page.goto(page.get_attribute("#return", "href"))
    page.wait_for_selector("[data-outcome='active']")
    page.goto(f"{base}/pricing/")
    return page


def test_change_plan_through_the_hosted_page_in_english_and_french(
    browser,  # noqa: F811
    shots,  # noqa: F811
    stack,
    billing_sandbox,
    settings,
):
    base = stack
    billing_sandbox.config(change_actions=["upgrade", "downgrade"])
    settings.BILLING = {**settings.BILLING, "GUESSES": {"change_plan_action": "upgrade"}}
    page = subscribe_to_basic(browser, base, shots, "carol")
    pro = option(page, "Pro")
    assert pro.locator("form.billing-change-form button:has-text('Change plan')").count() == 1
    shots(page, "carol-pricing-change")
    pro.locator("form.billing-change-form button").click()
    page.wait_for_url(re.compile(r".*/checkout/[0-9a-f-]{36}$"))
    assert page.inner_text("#product") == "Pro"
    assert pay(page, SUCCESS_PHONE, shots, "carol-change") == "success"
    cache.clear()  # the return page pulls once per 5 s per customer: this is a second return
    page.goto(page.get_attribute("#return", "href"))
    page.wait_for_selector("[data-outcome='active']")

    page.goto(f"{base}/account/")
    rows = page.locator("#billing-subscriptions tbody tr")
    text = page.inner_text("#billing-subscriptions")
    assert rows.count() == 2 and "Renews on" in text and "Ends on" in text
    pro_row = page.locator("#billing-subscriptions tr", has_text="Pro")
    assert "Renews on" in pro_row.inner_text()
    shots(page, "carol-account")
    [change] = ChangeRequest.objects.all()
    assert change.via == ChangeVia.CHECKOUT and change.state == ChangeState.CONFIRMED

    page.context.add_cookies([{"name": "django_language", "value": "fr", "url": base}])
    page.goto(f"{base}/account/")
    page.wait_for_selector("html[lang='fr']")
    text = page.inner_text("#billing-subscriptions")
    assert "Se renouvelle le" in text and "Prend fin le" in text
    # Basic ends: Pro renews in its place, so no Resume (it would bill both plans)
    assert page.locator("#billing-subscriptions form.billing-resume").count() == 0
    assert page.is_visible("#billing-subscriptions form.billing-cancel button:has-text('Annuler')")
    shots(page, "carol-account-fr")
    page.context.close()


def test_change_plan_as_a_request_in_french(browser, shots, stack, billing_sandbox):  # noqa: F811
    base = stack
    page = subscribe_to_basic(browser, base, shots, "dave")
    page.context.add_cookies([{"name": "django_language", "value": "fr", "url": base}])
    page.goto(f"{base}/pricing/")
    page.wait_for_selector("html[lang='fr']")
    pro = option(page, "Pro")
    pro.locator("form.billing-change-form button:has-text('Changer de formule')").click()
    page.wait_for_url(re.compile(r".*/account/$"))
    assert "Passage à Pro demandé" in page.inner_text("#billing-subscriptions")
    shots(page, "dave-account-fr-requested")
    page.context.clear_cookies(name="django_language")
    page.goto(f"{base}/account/")
    page.wait_for_selector("html[lang='en']")
    assert "Change to Pro requested" in page.inner_text("#billing-subscriptions")
    assert (
        billing_sandbox.requests(operation="create_checkout_session")[-1]["body"]["action"]
        == "new_subscription"
    )  # only Basic's checkout: the change went to staff
    page.context.close()
