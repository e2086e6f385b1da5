"""A checkout still open is in the way of one that would double it: another plan of the group,
the same product in another cycle or currency, or a trial of another plan. Both could be paid
(the service sells each session it created), so the second is refused (409 ``checkout_open``)
until the first is completed or expires. Over real HTTP with the sandbox."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing_integration.billing import CheckoutInProgress, start_checkout, start_trial
from billing_integration.models import CheckoutSession, Product, Subscription

from .conftest import make_product
from .test_one_purchase import API, RETURN, post

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def plans(billing_sandbox, transactional_db) -> tuple[Product, Product]:
    return make_product("Starter"), make_product("Pro plan")


def sessions_sent(sandbox) -> int:
    return len(sandbox.requests(operation="create_checkout_session"))


def test_a_second_plan_waits_for_the_open_checkout_and_one_plan_is_paid(
    billing_sandbox, plans, logged_in, user
):
    """Starter's payment page is open; Pro is refused with a page naming Starter and the time
    its page closes; paying Starter gives one plan, and a month later one renewal."""
    starter, pro = plans
    first = post(logged_in, starter)
    assert first.status_code == 302

    second = post(logged_in, pro)

    assert second.status_code == 409
    html = second.content.decode()
    assert 'data-error-code="checkout_open"' in html
    assert "You have started buying Starter" in html and "stays open until" in html
    assert f'id="billing-open-checkout-link" href="{first["Location"]}"' in html
    assert sessions_sent(billing_sandbox) == 1
    assert list(CheckoutSession.objects.values_list("product", flat=True)) == [starter.pk]

    session = CheckoutSession.objects.get()
    assert billing_sandbox.complete_checkout(str(session.remote_id)).status_code == 200
    logged_in.get(RETURN, {"session_id": str(session.remote_id)})
    assert billing_sandbox.advance(days=32)["renewals"] == 1
    assert len(billing_sandbox.objects("subscription")) == 1


def test_the_same_product_in_another_cycle_or_currency_is_in_the_way(
    billing_sandbox, plans, logged_in, user
):
    starter, _pro = plans
    assert post(logged_in, starter, cycle="months-1", currency="XOF").status_code == 302
    first = CheckoutSession.objects.get()

    assert post(logged_in, starter, cycle="years-1").status_code == 409
    assert post(logged_in, starter, currency="USD").status_code == 409
    again = post(logged_in, starter, cycle="months-1", currency="XOF")  # a double click
    assert again.status_code == 302 and str(first.remote_id) in again["Location"]
    assert sessions_sent(billing_sandbox) == 1


@pytest.mark.parametrize("status", ["OPEN", "", "pending"])
def test_a_session_answered_with_another_status_is_still_in_the_way(
    billing_sandbox, plans, logged_in, status
):
    """The interface shows ``open`` on creation only; any other spelling keeps it in the way
    (sessions are not read back: fail closed)."""
    starter, pro = plans
    assert post(logged_in, starter).status_code == 302
    CheckoutSession.objects.update(status=status)
    assert post(logged_in, pro).status_code == 409
    assert sessions_sent(billing_sandbox) == 1


def test_an_expired_or_completed_checkout_is_no_longer_in_the_way(
    billing_sandbox, plans, logged_in, user
):
    starter, pro = plans
    assert post(logged_in, starter).status_code == 302
    CheckoutSession.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert post(logged_in, pro).status_code == 302

    CheckoutSession.objects.filter(product=pro).update(completed_at=timezone.now())
    CheckoutSession.objects.filter(product=starter).update(
        expires_at=timezone.now() + timedelta(minutes=5), completed_at=timezone.now()
    )
    assert post(logged_in, starter, cycle="years-1").status_code == 302
    assert sessions_sent(billing_sandbox) == 3


def test_add_ons_other_groups_repeat_purchases_and_other_customers_are_not_in_the_way(
    billing_sandbox, plans, logged_in, user, other_user, client
):
    starter, pro = plans
    support = make_product("Support add-on")
    storage = make_product("Storage")
    ebook = make_product("Ebook", one_time=True)
    Product.objects.filter(pk=support.pk).update(add_on=True)
    Product.objects.filter(pk=storage.pk).update(plan_group="storage")
    Product.objects.filter(pk=ebook.pk).update(multiple_purchases=True)
    assert post(logged_in, starter).status_code == 302

    assert post(logged_in, support).status_code == 302
    assert post(logged_in, support, cycle="years-1").status_code == 409  # the same add-on
    assert post(logged_in, storage).status_code == 302
    assert logged_in.post("/billing/checkout/", {"product": ebook.pk}).status_code == 302
    assert logged_in.post("/billing/checkout/", {"product": ebook.pk}).status_code == 302

    client.force_login(other_user)
    assert post(client, pro).status_code == 302
    assert sessions_sent(billing_sandbox) == 5


def test_every_path_refuses_it(billing_sandbox, plans, logged_in, user):
    starter, pro = plans
    first = start_checkout(user, starter, "months-1", "XOF")
    billing_sandbox.clear_requests()

    with pytest.raises(CheckoutInProgress) as info:
        start_checkout(user, pro, "months-1", "XOF")
    assert info.value.status == 409 and info.value.code == "checkout_open"
    assert info.value.session == first and info.value.open_name == "Starter"

    response = logged_in.post(
        API,
        {"product": str(pro.pk), "cycle": "months-1", "currency": "XOF"},
        content_type="application/json",
    )
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "checkout_open" and "Starter" in body["detail"]
    assert body["open_until"] == first.expires_at.isoformat()
    assert body["open_url"].endswith(f"/checkout/{first.remote_id}")

    with pytest.raises(CheckoutInProgress):
        start_trial(user, pro, "months-1", "XOF", days=7)
    assert billing_sandbox.requests() == []
    assert not Subscription.objects.exists()
    assert CheckoutSession.objects.count() == 1


def test_a_plan_sold_more_than_once_is_not_in_its_own_way(billing_sandbox, plans, logged_in):
    """``multiple_purchases`` on a plan: another cycle of it is sold beside its open session;
    another plan of the group still waits."""
    starter, pro = plans
    Product.objects.filter(pk=starter.pk).update(multiple_purchases=True)
    assert post(logged_in, starter).status_code == 302
    assert post(logged_in, starter, cycle="years-1").status_code == 302
    assert post(logged_in, pro).status_code == 409
    assert sessions_sent(billing_sandbox) == 2


@pytest.mark.parametrize(
    ("language", "message"),
    [
        (
            "en",
            "You have started buying Starter, and its payment page stays open until 3:50 a.m., "
            "so finish that payment or choose again once it has closed: paying both would buy "
            "both.",
        ),
        (
            "fr",
            "Vous avez commencé l'achat de Starter, et sa page de paiement reste ouverte "
            "jusqu'à 03:50 : terminez ce paiement, ou choisissez à nouveau une fois qu'elle "
            "sera fermée, car payer les deux achèterait les deux.",
        ),
    ],
)
def test_the_open_checkout_message_has_no_double_period_whatever_the_time_format(language, message):
    """English times end with "a.m."/"p.m.": "until 3:50 a.m.. Finish" had two periods."""
    from django.utils import translation

    closes = timezone.make_aware(timezone.datetime(2030, 1, 2, 3, 50))
    session = CheckoutSession(product=Product(name="Starter"), expires_at=closes)
    with translation.override(language):
        assert CheckoutInProgress(session).message == message
