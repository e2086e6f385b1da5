"""The demo in a real Chromium (Debian's ``chromium``, driven by Playwright).

The stack is started by the test: the example project on pytest-django's ``live_server``, the
sandbox (``billing_sandbox``) delivering its events to it, and a real Celery worker process
(the mirror tests' ``Worker``) pushing the outbox. Steps, each with a screenshot under
``test-artifacts/browser/``:

1. the admin logs in, adds a product with a monthly price in the admin form, publishes it with
   the "Publish" action; the worker pushes it, published, to the sandbox;
2. a user signs up, opens the pricing page, clicks the checkout button, lands on the sandbox's
   hosted page, pays with 0700000001, confirms the PIN, returns, and reaches the members page;
3. a second user paying with 0700000002 (declined) is sent back to pricing from the members page;
   his billing page shows the declined payment with "Pay again", in English and in French;
4. he pays again from the billing page with 0700000001 and reaches the members page;
5. (a second test) a user starts the 14-day trial of a plan from the pricing page and sees
   "Trial ends on …" on the billing page, in English and in French.

Skipped, with the reason, when ``/usr/bin/chromium`` or the ``playwright`` package is missing
(``.ci/run`` installs Chromium; locally: ``apt-get install chromium``).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SUCCESS_PHONE, DECLINED_PHONE = "0700000001", "0700000002"
PASSWORD = "correct-horse-battery"

if not CHROMIUM.exists():
    pytest.skip(
        f"{CHROMIUM} not found: install Debian's chromium (apt-get install chromium; "
        ".ci/run does) to run the browser test",
        allow_module_level=True,
    )
sync_api = pytest.importorskip(
    "playwright.sync_api",
    reason="the playwright package is not installed (pip install -e '.[test]')",
)

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.cache import cache  # noqa: E402

from billing_integration.access import subscribed  # noqa: E402
from billing_integration.models import (  # noqa: E402
    Customer,
    OutboxEntry,
    Payment,
    Product,
    Subscription,
)
from tests.mirror.conftest import Worker, wait_for  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # Playwright's sync API keeps an asyncio loop on this thread; the test's own ORM calls are
    # synchronous code that Django would otherwise refuse (SynchronousOnlyOperation).
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_api.sync_playwright() as pw:
            chromium = pw.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            try:
                yield chromium
            finally:
                chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def shots() -> Any:
    """``shot(page, name)`` saves ``test-artifacts/browser/NN-name.png`` (folder emptied first)."""
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    taken: list[Path] = []

    def shot(page: Any, name: str) -> Path:
        path = ARTIFACTS / f"{len(taken) + 1:02d}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        taken.append(path)
        return path

    shot.taken = taken  # type: ignore[attr-defined]
    return shot


@pytest.fixture
def demo_stack(live_server: Any, billing_sandbox: Any, settings: Any) -> Iterator[Any]:
    """live server + sandbox (events and customers sent back to it) + a real Celery worker."""
    billing_sandbox.set_callback(live_server.url + "/billing/webhooks/")
    billing_sandbox.config(
        return_url=live_server.url + "/billing/checkout/return/?session={session_id}"
    )
    worker = Worker(billing_sandbox)
    settings.DEBUG = True  # the admin's static files from the live server
    worker.start()
    try:
        with worker.routed_to():  # this process sends pushes and events to the worker's queue
            yield worker
    finally:
        worker.stop()
        worker.log.unlink(missing_ok=True)


def sign_up(browser: Any, base: str, username: str, shot: Any) -> Any:
    context = browser.new_context(viewport={"width": 1100, "height": 800})
    page = context.new_page()
    page.set_default_timeout(20_000)
    page.goto(f"{base}/accounts/signup/")
    page.fill("#id_username", username)
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    shot(page, f"{username.split('-')[0]}-signup")
    page.click("form[action='/accounts/signup/'] button[type=submit]")
    page.wait_for_url(re.compile(r".*/pricing/$"))
    return page


def checkout(page: Any, product: str, shot: Any, tag: str) -> str:
    """Click the monthly XOF checkout button of ``product``; return the sandbox page URL."""
    plan = page.locator("section.plan", has=page.locator("h2", has_text=product))
    option = plan.locator("div.option[data-cycle='months-1'][data-currency='XOF']")
    assert option.count() == 1, page.content()
    shot(page, f"{tag}-pricing")
    option.locator("button[type=submit]").click()
    page.wait_for_url(re.compile(r".*/checkout/[0-9a-f-]{36}$"))
    return page.url


def pay(page: Any, phone: str, shot: Any, tag: str) -> str:
    """The sandbox's hosted page: phone, then "I entered my PIN"; return data-outcome."""
    page.fill("#phone", phone)
    shot(page, f"{tag}-sandbox-phone")
    page.click("button:has-text('Pay')")
    page.wait_for_selector("button:has-text('I entered my PIN')")
    shot(page, f"{tag}-sandbox-pin")
    page.click("button:has-text('I entered my PIN')")
    page.wait_for_selector("main[data-outcome]")
    outcome = page.get_attribute("main[data-outcome]", "data-outcome")
    shot(page, f"{tag}-sandbox-result")
    return outcome


def test_admin_publishes_user_subscribes_declined_user_does_not(
    browser: Any, demo_stack: Any, live_server: Any, billing_sandbox: Any, shots: Any
) -> None:
    base = live_server.url
    get_user_model().objects.create_superuser("admin", "admin@example.com", "admin")
    name = f"Browser plan {uuid.uuid4().hex[:6]}"

    # 1. The admin creates a product with a monthly price and publishes it. ------------------
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    admin = context.new_page()
    admin.set_default_timeout(20_000)
    admin.goto(f"{base}/admin/login/?next=/admin/")
    admin.fill("#id_username", "admin")
    admin.fill("#id_password", "admin")
    shots(admin, "admin-login")
    admin.click("input[type=submit]")
    admin.wait_for_url(f"{base}/admin/")

    admin.goto(f"{base}/admin/billing_integration/product/add/")
    admin.fill("#id_name", name)
    admin.fill("#id_description", "Created in the admin by the browser test.")
    admin.check("input[name=selected_currencies][value='1']")  # XOF
    admin.select_option("#id_cycles-0-unit", "months")
    admin.fill("#id_cycles-0-frequency", "1")
    admin.fill("#id_cycles-0-prices", "XOF 7500")
    shots(admin, "admin-add-product")
    admin.click("input[name=_save]")
    admin.wait_for_url(f"{base}/admin/billing_integration/product/")
    product = Product.objects.get(name=name)
    assert product.status == "draft"
    assert [
        (c.code, [(p.currency_id, int(p.amount)) for p in c.prices.all()])
        for c in product.cycles.all()
    ] == [("months-1", [(1, 7500)])]

    row = admin.locator("#result_list tr", has=admin.locator("a", has_text=name))
    row.locator("input[name=_selected_action]").check()
    admin.select_option("select[name=action]", "publish")
    shots(admin, "admin-publish-action")
    admin.click("button[name=index]")
    admin.wait_for_selector("ul.messagelist li.success")
    assert "published" in admin.inner_text("ul.messagelist")
    shots(admin, "admin-published")
    context.close()

    product.refresh_from_db()
    assert product.status == "published"
    wait_for(
        lambda: not OutboxEntry.objects.exclude(state="done").exists(),
        timeout=60,
    )
    product.refresh_from_db()
    assert product.remote_id is not None, demo_stack.output()[-3000:]
    remote = billing_sandbox.object("product", str(product.remote_id))
    assert (remote["name"], remote["status"]) == (name, "published")

    # 2. A user signs up, pays with the success number and reaches the members page. --------
    alice_name = "alice-" + uuid.uuid4().hex[:6]
    page = sign_up(browser, base, alice_name, shots)
    checkout_url = checkout(page, name, shots, "alice")
    assert checkout_url.startswith(billing_sandbox.checkout_url + "/checkout/")
    assert pay(page, SUCCESS_PHONE, shots, "alice") == "success"
    page.goto(page.get_attribute("#return", "href"))  # (the page also redirects after 3 s)
    page.wait_for_selector("[data-outcome='active']")
    assert page.is_visible("header a.brand")  # the site's layout (BILLING['BASE_TEMPLATE'])
    assert "(Monthly)" in page.inner_text("main")
    shots(page, "alice-returned")
    page.click("text=Continue")
    page.wait_for_url(f"{base}/members/")
    assert page.is_visible("#members-only")
    assert name in page.inner_text("main")
    shots(page, "alice-members")
    page.goto(f"{base}/account/")
    page.wait_for_selector("#billing-payments td:text-is('Completed')")
    assert "XOF\xa07,500" in page.inner_text("#billing-payments")
    assert "Active" in page.inner_text("#billing-subscriptions")
    shots(page, "alice-account")
    # buying the held plan again (a forged form: the pricing page shows "Current plan"): 409
    page.evaluate(
        """([pk]) => {
            const form = document.createElement("form");
            form.method = "post"; form.action = "/billing/checkout/";
            const fields = {csrfmiddlewaretoken: document.cookie.match(/csrftoken=([^;]+)/)[1],
                            product: pk, cycle: "months-1", currency: "XOF"};
            for (const [name, value] of Object.entries(fields)) {
                const input = document.createElement("input");
                input.type = "hidden"; input.name = name; input.value = value;
                form.appendChild(input);
            }
            document.body.appendChild(form); form.submit();
        }""",
        [str(product.pk)],
    )
    page.wait_for_selector("[data-error-code='already_subscribed']")
    assert page.is_visible("header a.brand")
    shots(page, "alice-already-subscribed")
    page.context.close()

    alice = get_user_model().objects.get(username=alice_name)
    assert subscribed(alice, product)
    sub = Subscription.objects.for_subscriber(alice).get()
    assert (sub.selected_billing_cycle, sub.selected_currency) == ("months-1", "XOF")
    assert billing_sandbox.object("subscription", str(sub.remote_id))["status"] == "published"
    session_id = checkout_url.rsplit("/", 1)[1]
    assert billing_sandbox.object("checkout_session", session_id)["status"] == "completed"
    payment = Payment.objects.get(customer__subscriber=alice)
    assert (payment.status, int(payment.amount), payment.currency) == ("completed", 7500, "XOF")

    # 3. A user whose payment is declined does not get in. -------------------------------------
    bob_name = "bob-" + uuid.uuid4().hex[:6]
    page = sign_up(browser, base, bob_name, shots)
    checkout(page, name, shots, "bob")
    assert pay(page, DECLINED_PHONE, shots, "bob") == "declined"
    page.goto(page.get_attribute("#return", "href"))
    page.wait_for_selector("[data-outcome='failed']")
    shots(page, "bob-returned")
    page.goto(f"{base}/members/")
    page.wait_for_url(re.compile(r".*/pricing/\?next=%2Fmembers%2F$"))
    assert page.is_visible("#subscription-required")
    assert not page.is_visible("#members-only")
    shots(page, "bob-refused")
    page.goto(f"{base}/account/")
    page.wait_for_selector("#billing-payments td:text-is('Declined')")
    assert page.is_visible("#billing-payments form.billing-pay-again button")
    shots(page, "bob-account")
    # The billing page in French (the example project's language switch sets this cookie).
    page.context.add_cookies([{"name": "django_language", "value": "fr", "url": base}])
    page.goto(f"{base}/account/")
    page.wait_for_selector("html[lang='fr']")
    assert page.is_visible(
        "#billing-payments form.billing-pay-again button:has-text('Payer à nouveau')"
    )
    assert "Refusé" in page.inner_text("#billing-payments")
    shots(page, "bob-account-fr")
    page.context.clear_cookies(name="django_language")
    page.goto(f"{base}/account/")
    page.wait_for_selector("html[lang='en']")
    bob = get_user_model().objects.get(username=bob_name)
    assert not subscribed(bob)
    assert not Subscription.objects.for_subscriber(bob).exists()

    # 4. He pays again from the billing page, with a number that succeeds: he gets in. -------
    page.click("#billing-payments form.billing-pay-again button")
    page.wait_for_url(re.compile(r".*/checkout/[0-9a-f-]{36}$"))
    assert pay(page, SUCCESS_PHONE, shots, "bob-again") == "success"
    # His second return may come within 5 s of his first, when the return page does not pull
    # again (RETURN_PULL_INTERVAL, in the shared cache) and shows "pending" until reloaded.
    cache.clear()
    # The return page pulls at most once per 5 s per customer (bob's last one was just now):
    # the worker's processing of the payment's events makes him subscribed.
    wait_for(lambda: subscribed(bob), timeout=60)
    page.goto(page.get_attribute("#return", "href"))
    page.wait_for_selector("[data-outcome='active']")
    shots(page, "bob-again-returned")
    page.goto(f"{base}/members/")
    page.wait_for_url(f"{base}/members/")
    assert page.is_visible("#members-only")
    shots(page, "bob-again-members")
    page.context.close()
    assert subscribed(bob)
    bob_customer = Customer.objects.get(subscriber=bob)
    failed = [
        e
        for e in billing_sandbox.events("payment.failed")
        if e["data"]["customer"] == str(bob_customer.remote_id)
    ]
    assert [e["data"]["failure_reason"] for e in failed] == ["declined"]

    names = [p.name for p in shots.taken]
    assert len(names) == 27 and all(p.stat().st_size > 1000 for p in shots.taken), names


def test_a_user_starts_a_trial_and_sees_its_end_on_the_billing_page_in_english_and_french(
    browser: Any, demo_stack: Any, live_server: Any, billing_sandbox: Any, shots: Any
) -> None:
    """A plan offering a 14-day trial (``trial_days``): the pricing page's "Start a 14-day
    trial" starts it (pushed with ``trial_end_date``), the billing page says "Trial ends on …"
    with "Subscribe now", in English and in French, and the members page lets the user in."""
    from decimal import Decimal

    from django.db import transaction

    from billing_integration.access import on_trial
    from billing_integration.models import BillingCycle, Price

    base = live_server.url
    name = f"Trial plan {uuid.uuid4().hex[:6]}"
    with transaction.atomic():
        product = Product.objects.create(
            name=name, status="published", selected_currencies=[1], trial_days=14
        )
        cycle = BillingCycle.objects.create(product=product, unit="months", frequency=1)
        Price.objects.create(cycle=cycle, currency_id=1, amount=Decimal("7500"))
    wait_for(lambda: not OutboxEntry.objects.exclude(state="done").exists(), timeout=60)
    product.refresh_from_db()
    assert product.remote_id is not None, demo_stack.output()[-3000:]

    carol_name = "carol-" + uuid.uuid4().hex[:6]
    page = sign_up(browser, base, carol_name, shots)
    plan = page.locator("section.plan", has=page.locator("h2", has_text=name))
    button = plan.locator("form.billing-trial-form button")
    assert button.inner_text() == "Start a 14-day trial"
    shots(page, "carol-pricing-trial")
    button.click()
    page.wait_for_url(f"{base}/billing/account/")
    page.wait_for_selector("#billing-subscriptions .billing-trial")
    assert "Trial ends on" in page.inner_text("#billing-subscriptions")
    assert page.is_visible("#billing-subscriptions form.billing-convert-trial button")
    shots(page, "carol-account-trial")
    page.context.add_cookies([{"name": "django_language", "value": "fr", "url": base}])
    page.goto(f"{base}/account/")
    page.wait_for_selector("html[lang='fr']")
    assert "essai se termine le" in page.inner_text("#billing-subscriptions")  # L'essai
    assert page.is_visible("form.billing-convert-trial button:has-text('abonner maintenant')")
    shots(page, "carol-account-trial-fr")
    page.context.clear_cookies(name="django_language")
    page.goto(f"{base}/members/")
    page.wait_for_url(f"{base}/members/")
    assert page.is_visible("#members-only")
    page.context.close()

    carol = get_user_model().objects.get(username=carol_name)
    assert on_trial(carol, product)
    sub = Subscription.objects.for_subscriber(carol).get()
    remote = billing_sandbox.object("subscription", str(sub.remote_id))
    assert remote["trial_end_date"] is not None and remote["auto_renew"] is False
