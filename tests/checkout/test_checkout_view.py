"""The checkout view against the sandbox over real HTTP."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from billing_integration.client import get_client
from billing_integration.client.backoff import clear_shared_backoff
from billing_integration.customers import get_or_create_customer
from billing_integration.models import CheckoutSession, Customer, OutboxEntry, Product
from billing_integration.outbox.push import push_entry

from .conftest import make_product, push_open_entries

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/billing/checkout/"
TS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


def post(client, product, cycle="months-1", currency="XOF", **extra):
    data = {"product": product.pk if isinstance(product, Product) else product, **extra}
    if cycle is not None:
        data["cycle"] = cycle
    if currency is not None:
        data["currency"] = currency
    return client.post(URL, data)


def test_checkout_url_is_the_hosted_page_of_the_new_session(billing_sandbox, product, user):
    from billing_integration.checkout.services import checkout_redirect, checkout_url

    url = checkout_url(user, product, "months-1", "XOF")
    session = CheckoutSession.objects.get()
    assert url == f"{billing_sandbox.checkout_url}/checkout/{session.remote_id}"
    response = checkout_redirect(user, product, "months-1", "XOF")  # a second click: reused
    assert response.status_code == 302 and response["Location"] == url
    assert CheckoutSession.objects.count() == 1


def test_url_names():
    assert reverse("billing_integration:checkout") == URL
    assert reverse("billing_integration:checkout_return") == "/billing/checkout/return/"


def test_redirects_to_the_hosted_page_with_the_documented_body(
    billing_sandbox, product, logged_in, user
):
    before = datetime.now(UTC)
    response = post(logged_in, product)
    after = datetime.now(UTC)

    session = CheckoutSession.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"{billing_sandbox.checkout_url}/checkout/{session.remote_id}"

    [call] = billing_sandbox.requests(operation="create_checkout_session")
    body = call["body"]
    customer = Customer.objects.get(subscriber=user)
    assert body["customer"] == str(customer.remote_id)
    assert body["product"] == str(product.remote_id)
    assert body["action"] == "new_subscription"
    assert body["selected_currency"] == 1 and isinstance(body["selected_currency"], int)
    assert body["selected_billing_cycle"] == "months-1"
    assert TS.match(body["expires_at"]), body["expires_at"]
    expires = datetime.fromisoformat(body["expires_at"].replace("Z", "+00:00"))
    assert before + timedelta(seconds=299) <= expires <= after + timedelta(seconds=301)
    uuid.UUID(call["headers"]["x-idempotency-id"])
    assert call["status"] == 200

    # recorded locally from the service's answer
    remote = billing_sandbox.object("checkout_session", str(session.remote_id))
    assert session.status == "open" == remote["status"]
    assert session.customer == customer and session.product == product
    assert session.selected_currency == 1 and session.selected_billing_cycle == "months-1"
    assert session.sync_state == "synced"
    assert abs((session.expires_at - expires).total_seconds()) < 1
    assert not OutboxEntry.objects.filter(
        object_id=str(session.pk), content_type__model="checkoutsession"
    ).exists()


def test_other_cycle_and_currency_by_id(billing_sandbox, product, logged_in):
    response = post(logged_in, product, cycle="months-1", currency="2")
    assert response.status_code == 302
    assert billing_sandbox.requests("create_checkout_session")[0]["body"]["selected_currency"] == 2
    CheckoutSession.objects.update(expires_at=timezone.now())  # else it is in the way
    response = post(logged_in, product, cycle="years-1", currency="XOF")
    assert response.status_code == 302
    body = billing_sandbox.requests("create_checkout_session")[1]["body"]
    assert body["selected_billing_cycle"] == "years-1" and body["selected_currency"] == 1


def test_one_time_product_sends_no_cycle(billing_sandbox, transactional_db, logged_in):
    product = make_product("Ebook", one_time=True)
    response = post(logged_in, product, cycle=None, currency="XOF")
    assert response.status_code == 302, response.content
    assert (
        billing_sandbox.requests("create_checkout_session")[0]["body"]["selected_billing_cycle"]
        is None
    )


def test_customer_pushed_once_when_clicking_twice(billing_sandbox, product, logged_in, user):
    """A double click: one remote customer, and the second POST is sent to the first one's
    hosted session (no second create_checkout_session)."""
    first = post(logged_in, product)
    second = post(logged_in, product)
    assert first.status_code == second.status_code == 302
    assert first["Location"] == second["Location"]
    assert len(billing_sandbox.requests(operation="create_customer")) == 1
    assert len(billing_sandbox.objects("customer")) == 1
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 1
    assert len(billing_sandbox.objects("checkout_session")) == 1
    session = CheckoutSession.objects.get()
    assert first["Location"] == f"{billing_sandbox.checkout_url}/checkout/{session.remote_id}"
    assert Customer.objects.count() == 1


def test_pending_customer_entry_is_shared(
    billing_sandbox, product, logged_in, user, recorded_enqueues
):
    customer, created = get_or_create_customer(user)
    assert created and customer.remote_id is None
    entry = OutboxEntry.objects.for_object(customer).get()
    assert entry.pk in recorded_enqueues  # queued for a worker that has not run yet

    assert post(logged_in, product).status_code == 302

    [call] = billing_sandbox.requests(operation="create_customer")
    assert call["headers"]["x-idempotency-id"] == str(entry.idempotency_key)
    # The worker's delivery of the same entry afterwards creates nothing more.
    push_entry(entry.pk)
    assert len(billing_sandbox.requests(operation="create_customer")) == 1
    assert len(billing_sandbox.objects("customer")) == 1
    customer.refresh_from_db()
    assert CheckoutSession.objects.get().customer == customer and customer.remote_id


@pytest.mark.parametrize(
    "status,code", [("archived", "product_archived"), ("draft", "product_not_published")]
)
def test_unpublished_product_gives_a_page_and_no_session(
    billing_sandbox, transactional_db, logged_in, status, code
):
    product = make_product(status=status)
    response = post(logged_in, product)
    assert response.status_code == 409
    assert f'data-error-code="{code}"' in response.content.decode()
    assert "could not start your checkout" in response.content.decode()
    assert not CheckoutSession.objects.exists()
    assert not Customer.objects.exists(), "nothing written when validation fails"
    assert billing_sandbox.requests(operation="create_checkout_session") == []


def test_product_archived_remotely_only(billing_sandbox, product, logged_in):
    """The local row and its last answer still say published (archived on the service by
    something else, a pull not run yet): the service refuses and the customer gets the same
    clear page."""
    product.archive()
    push_open_entries()
    product.refresh_from_db()
    seen = {**product.remote_data, "status": "published"}
    Product.objects.filter(pk=product.pk).update(status="published", remote_data=seen)
    response = post(logged_in, product)
    assert response.status_code == 409
    assert 'data-error-code="product_archived"' in response.content.decode()
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 1
    assert not CheckoutSession.objects.exists()


def test_product_not_pushed_yet(billing_sandbox, transactional_db, logged_in):
    product = make_product(push=False)
    response = post(logged_in, product)
    assert response.status_code == 409
    assert not CheckoutSession.objects.exists()


@pytest.mark.parametrize("product_ref", ["999999", "not-a-product", str(uuid.uuid4()), ""])
def test_unknown_product_is_404(billing_sandbox, product, logged_in, product_ref):
    response = post(logged_in, product_ref)
    assert response.status_code == 404
    assert not CheckoutSession.objects.exists()


@pytest.mark.parametrize(
    "cycle,currency,code",
    [
        ("weeks-1", "XOF", "unknown_cycle"),
        ("months-2", "XOF", "unknown_cycle"),
        ("months-x", "XOF", "unknown_cycle"),
        ("months-1", "EUR", "unknown_currency"),  # a known currency the product is not sold in
        ("years-1", "USD", "unknown_currency"),  # offered, but no price in this cycle
        ("months-1", "ZZZ", "invalid_choice"),
        ("months-1", "99", "invalid_choice"),
        ("", "XOF", "cycle_required"),  # two cycles: the choice is needed
    ],
)
def test_unknown_cycle_or_currency_is_400(
    billing_sandbox, product, logged_in, cycle, currency, code
):
    response = post(logged_in, product, cycle=cycle, currency=currency)
    assert response.status_code == 400
    assert f'data-error-code="{code}"' in response.content.decode()
    assert not CheckoutSession.objects.exists()
    assert not Customer.objects.exists()
    assert billing_sandbox.requests(operation="create_customer") == []
    assert billing_sandbox.requests(operation="create_checkout_session") == []


def test_outage_gives_503_and_no_session(billing_sandbox, product, logged_in):
    billing_sandbox.faults(outage_seconds=30)
    response = post(logged_in, product)
    assert response.status_code == 503
    assert 'data-error-code="service_unavailable"' in response.content.decode()
    assert "temporarily unavailable" in response.content.decode()
    assert not CheckoutSession.objects.exists()
    billing_sandbox.clear_faults()
    # known down until its window ends (KNOWN_DOWN_SECONDS): a click answers 503 at once
    billing_sandbox.clear_requests()
    assert post(logged_in, product).status_code == 503
    assert billing_sandbox.requests() == []
    clear_shared_backoff()  # the window over (or ended by an operator who knows)...
    get_client().backoff.reset()  # ...and this process's copy of it
    # the same click works once the service is back, with one remote customer
    assert post(logged_in, product).status_code == 302
    assert len(billing_sandbox.objects("customer")) == 1


def test_checkout_session_5xx_gives_503_and_no_session(billing_sandbox, product, logged_in):
    billing_sandbox.faults(operation="create_checkout_session", status=503, count=10)
    response = post(logged_in, product)
    assert response.status_code == 503
    assert not CheckoutSession.objects.exists()
    calls = billing_sandbox.requests(operation="create_checkout_session")
    assert len(calls) == 2, "one retry (MAX_RETRIES here) within the interactive deadline"
    assert calls[0]["headers"]["x-idempotency-id"] == calls[1]["headers"]["x-idempotency-id"]


def test_lost_answer_is_retried_with_the_same_key(billing_sandbox, product, logged_in):
    """The service created the session but the answer was lost: the retry gets the replay,
    one remote session, one local row."""
    billing_sandbox.faults(operation="create_checkout_session", reset_after_commit_rate=1, count=1)
    response = post(logged_in, product)
    assert response.status_code == 302
    assert len(billing_sandbox.objects("checkout_session")) == 1
    session = CheckoutSession.objects.get()
    assert response["Location"].endswith(f"/checkout/{session.remote_id}")


def test_service_down_while_pushing_the_customer(billing_sandbox, product, logged_in):
    billing_sandbox.faults(operation="create_customer", status=503, count=10)
    response = post(logged_in, product)
    assert response.status_code == 503
    assert not CheckoutSession.objects.exists()
    assert billing_sandbox.requests(operation="create_checkout_session") == []


def test_anonymous_is_sent_to_login_and_back_to_the_page_of_the_click(
    billing_sandbox, product, client, user
):
    """Back after login to the page the click came from (the view only takes POSTs: sent back
    to it, a GET would answer 405); without a ``Referer``, the posted ``next``, else the
    billing page; never another site."""
    from urllib.parse import parse_qs, urlsplit

    def back(response) -> str:
        assert response.status_code == 302 and "login" in response["Location"]
        return parse_qs(urlsplit(response["Location"]).query)["next"][0]

    data = {"product": product.pk, "cycle": "months-1", "currency": "XOF", "next": "/members/"}
    assert back(client.post(URL, data, HTTP_REFERER="http://testserver/pricing/")) == (
        "http://testserver/pricing/"
    )
    assert back(client.post(URL, data)) == "/members/"
    evil = {**data, "next": "https://evil.example/"}
    assert back(client.post(URL, evil, HTTP_REFERER="https://evil.example/x")) == (
        "/billing/account/"
    )
    assert billing_sandbox.requests(operation="create_checkout_session") == []
    client.force_login(user)
    assert client.get("/pricing/").status_code == 200  # where the login sends the visitor


def test_get_is_refused(logged_in):
    assert logged_in.get(URL).status_code == 405


def test_csrf_is_enforced(product, user):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    response = strict.post(URL, {"product": product.pk, "cycle": "months-1", "currency": "XOF"})
    assert response.status_code == 403
    assert not CheckoutSession.objects.exists()


@pytest.mark.parametrize(
    "evil",
    [
        "https://evil.example/x",
        "//evil.example/x",
        "javascript:alert(1)",
        "http://testserver.evil.example/",
    ],
)
def test_tampered_next_cannot_redirect_elsewhere(billing_sandbox, product, logged_in, evil):
    response = post(logged_in, product, next=evil)
    session = CheckoutSession.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"{billing_sandbox.checkout_url}/checkout/{session.remote_id}"
    page = logged_in.get(f"/billing/checkout/return/?session_id={session.remote_id}&next={evil}")
    assert page.status_code == 200
    assert "evil" not in page.content.decode()
    assert "javascript:" not in page.content.decode()


def test_local_next_is_kept_for_the_return_page(billing_sandbox, product, logged_in):
    post(logged_in, product, next="/members/")
    page = logged_in.get("/billing/checkout/return/")
    assert 'href="/members/"' in page.content.decode()


def test_simultaneous_clicks_push_one_customer(billing_sandbox, product, user):
    """Two checkout requests at the same moment (a double click, two tabs): one customer and
    one hosted session (the subscriber's checkouts are serialised by a lock)."""
    import threading

    from django.db import connection
    from django.test import Client

    billing_sandbox.faults(operation="create_customer", latency=0.3)
    billing_sandbox.faults(operation="create_checkout_session", latency=0.3)
    barrier = threading.Barrier(2)
    results: list[tuple[int, str]] = []

    def click() -> None:
        try:
            c = Client()
            c.force_login(user)
            barrier.wait()
            response = post(c, product)
            results.append((response.status_code, response.get("Location", "")))
        finally:
            connection.close()

    threads = [threading.Thread(target=click) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [s for s, _ in results] == [302, 302]
    assert len(billing_sandbox.objects("customer")) == 1
    assert len(billing_sandbox.requests(operation="create_customer")) == 1
    assert Customer.objects.count() == 1
    # ... and one hosted session: the second request waited for the first and reused it.
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 1
    session = CheckoutSession.objects.get()
    assert {loc for _, loc in results} == {
        f"{billing_sandbox.checkout_url}/checkout/{session.remote_id}"
    }


@pytest.mark.parametrize(
    "cycle,currency,code",
    [
        ("months-²", "XOF", "unknown_cycle"),  # "²".isdigit() is True, int("²") fails
        ("months-①", "XOF", "unknown_cycle"),
        ("months-1", "²", "invalid_choice"),
        ("months-1", "¹", "invalid_choice"),
    ],
)
def test_unicode_digits_are_a_clear_400_not_a_crash(
    billing_sandbox, product, logged_in, cycle, currency, code
):
    response = post(logged_in, product, cycle=cycle, currency=currency)
    assert response.status_code == 400
    assert f'data-error-code="{code}"' in response.content.decode()
    assert not CheckoutSession.objects.exists()
    assert billing_sandbox.requests(operation="create_checkout_session") == []


TOO_MANY_DIGITS = "9" * 5000  # more than Python's int() reads from text (4,300 digits)


def refused_before_the_service(sandbox, product, logged_in, url, fields, status, code):
    """The view answers ``status`` with ``code``; nothing is recorded or sent."""
    data = {"product": product.pk, "cycle": "months-1", "currency": "XOF", **fields}
    response = logged_in.post(url, data)
    assert response.status_code == status
    assert f'data-error-code="{code}"' in response.content.decode()
    assert not CheckoutSession.objects.exists()
    assert sandbox.requests(operation="create_checkout_session") == []
    assert sandbox.requests(operation="create_subscription") == []


@pytest.mark.parametrize(
    "url,fields,status,code",
    [
        (URL, {"currency": TOO_MANY_DIGITS}, 400, "invalid_choice"),
        ("/billing/trial/", {"currency": TOO_MANY_DIGITS}, 400, "invalid_choice"),
        ("/billing/account/change-plan/", {"currency": TOO_MANY_DIGITS}, 400, "invalid_choice"),
        ("/billing/trial/", {"product": TOO_MANY_DIGITS}, 404, "product_not_found"),
    ],
)
def test_a_number_too_long_to_read_is_a_clear_4xx_not_a_crash(
    billing_sandbox, product, logged_in, url, fields, status, code
):
    refused_before_the_service(billing_sandbox, product, logged_in, url, fields, status, code)


def test_unicode_digits_in_stored_currencies_are_ignored(billing_sandbox, product, logged_in):
    Product.objects.filter(pk=product.pk).update(selected_currencies=["²", 1, "2"])
    assert post(logged_in, product, currency=None).status_code == 302
    CheckoutSession.objects.update(expires_at=timezone.now())  # else it is in the way
    assert post(logged_in, product, cycle="years-1", currency="XOF").status_code == 302


@pytest.mark.parametrize("url", [URL, "/billing/trial/", "/billing/account/change-plan/"])
@pytest.mark.parametrize(
    "fields,status,code",
    [
        ({"product": "Pro\x00plan"}, 404, "product_not_found"),
        ({"cycle": "mon\x00ths-1"}, 400, "unknown_cycle"),
    ],
)
def test_a_nul_character_is_a_clear_4xx_not_a_crash(
    billing_sandbox, product, logged_in, url, fields, status, code
):
    """PostgreSQL refuses a query with a NUL in a text: it never reaches the database."""
    refused_before_the_service(billing_sandbox, product, logged_in, url, fields, status, code)


@pytest.mark.parametrize("change", [False, True])
def test_the_503_page_says_once_that_nothing_was_charged(user, change):
    from django.test import RequestFactory

    from billing_integration.checkout.services import ServiceUnavailable
    from billing_integration.checkout.views import error_page

    request = RequestFactory().get("/")
    request.user = user
    page = error_page(request, ServiceUnavailable(), change=change).content.decode()
    section = page.split('<section class="billing-checkout-error"', 1)[1].split("</section>")[0]
    text = " ".join(re.sub(r"<[^>]+>", " ", section.split(">", 1)[1]).split())
    heading = "We could not make this change" if change else "We could not start your checkout"
    assert text == (
        f"{heading} The payment service is temporarily unavailable. Nothing was charged; "
        "please try again in a few minutes. Return to the home page ."
    )


@pytest.mark.parametrize(
    "key,value", [("CHECKOUT_EXPIRY", -1), ("INTERACTIVE_DEADLINE", 0), ("CHECKOUT_EXPIRY", "300")]
)
def test_a_bad_checkout_setting_refuses_the_checkout_naming_it(
    billing_sandbox, product, logged_in, settings, key, value, caplog
):
    # Where the checks do not run (gunicorn): CHECKOUT_EXPIRY=-1 opened a session already
    # expired, INTERACTIVE_DEADLINE=0 failed every checkout as if the service were slow.
    settings.BILLING = {**settings.BILLING, key: value}
    response = post(logged_in, product)
    assert response.status_code == 503  # the service shown unavailable, the reason logged
    assert f"checkout failed: BILLING['{key}'] must be " in caplog.text
    assert billing_sandbox.requests(operation="create_checkout_session") == []
    assert CheckoutSession.objects.filter(remote_id__isnull=False).count() == 0
