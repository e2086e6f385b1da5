"""Products created on the service and pulled: reported without cycles, cycles declared in the
admin (kept, sold, not pushed), sent on request; and the admin's type/inline checks."""

from __future__ import annotations

import io
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.messages import get_messages
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from billing_integration.models import BillingCycle, CheckoutSession, OutboxEntry, Product
from billing_integration.outbox.push import PushOutcome, push_entry

from .conftest import product_form_data

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = reverse("admin:billing_integration_product_changelist")


def change_url(product: Product) -> str:
    return reverse("admin:billing_integration_product_change", args=[product.pk])


def create_on_service(name: str = "Remote plan", *, one_time: bool = False) -> dict[str, Any]:
    """A published product created directly on the sandbox (not through this app)."""
    from billing_integration.client import get_client

    body: dict[str, Any] = {
        "name": name,
        "description": "",
        "status": "published",
        "selected_currencies": ["1"],
    }
    if one_time:
        body["prices"] = [{"currency": 1, "amount": 500}]
    else:
        body["subscription_blueprint"] = {
            "billing_type": "flat-rate",
            "billing_cycles": [
                {"cycle": "months", "frequency": 1, "prices": [{"currency": 1, "amount": 7000}]}
            ],
        }
    return get_client().create_product(body)


def pull(out: io.StringIO | None = None) -> str:
    out = out or io.StringIO()
    call_command("billing_sync", "products", "--no-progress", stdout=out)
    return out.getvalue()


def push_all() -> list[str]:
    return [push_entry(pk).status for pk in OutboxEntry.objects.open().values_list("pk", flat=True)]


def blueprint_patches(sandbox: Any) -> list[dict[str, Any]]:
    return [
        r
        for r in sandbox.requests(operation="update_product")
        if "subscription_blueprint" in (r["body"] or {})
    ]


def declare_monthly(client: Client, product: Product, prices: str = "XOF 7000"):
    return client.post(
        change_url(product),
        product_form_data(
            product,
            **{
                "cycles-TOTAL_FORMS": "1",
                "cycles-0-unit": "months",
                "cycles-0-frequency": "1",
                "cycles-0-prices": prices,
                "cycles-0-product": str(product.pk),
            },
        ),
    )


@pytest.fixture
def pulled(billing_sandbox) -> Product:
    data = create_on_service()
    pull()
    product = Product.objects.get(remote_id=data["id"])
    billing_sandbox.clear_requests()
    return product


def test_billing_sync_reports_pulled_products_without_cycles(billing_sandbox):
    remote = create_on_service("Remote plan")
    create_on_service("Remote fee", one_time=True)
    output = pull()
    product = Product.objects.get(remote_id=remote["id"])
    assert product.product_type == "subscription" and not product.cycles.exists()
    assert product.blueprint_known is False
    assert "1 on the service without known billing cycles" in output
    assert f"Remote plan (remote id {remote['id']})" in output
    assert "Remote fee" not in output  # one-time: sold by its root price
    assert "declare their billing cycles" in output


def test_changelist_flags_products_without_known_cycles(billing_sandbox, admin_client):
    create_on_service("Remote plan")
    pull()
    local = Product.objects.create(name="Local plan")
    BillingCycle.objects.create(product=local, unit="months", frequency=1)
    html = admin_client.get(CHANGELIST).content.decode()
    assert "billing-badge-no-cycles" in html and "no known cycles" in html
    none = admin_client.get(CHANGELIST + "?cycles=none").context["cl"].result_list
    assert [p.name for p in none] == ["Remote plan"]
    response = admin_client.post(
        CHANGELIST, {"action": "sync_now", "index": "0", "_selected_action": [str(local.pk)]}
    )
    warnings = [str(m) for m in get_messages(response.wsgi_request) if m.level_tag == "warning"]
    assert any("Remote plan" in w and "no known billing cycles" in w for w in warnings)


def test_declared_cycles_are_kept_not_pushed_and_sold(billing_sandbox, pulled, admin_client):
    buyer = get_user_model().objects.create_user(
        "alice", email="alice@example.com", first_name="Alice", last_name="Doe"
    )
    shopper = Client()
    shopper.force_login(buyer)
    checkout = {"product": pulled.pk, "cycle": "months-1", "currency": "XOF"}
    refused = shopper.post("/billing/checkout/", checkout)
    assert refused.status_code == 400  # no cycle known here yet

    response = declare_monthly(admin_client, pulled)
    assert response.status_code == 302, response.content.decode()[:2000]
    cycle = pulled.cycles.get()
    assert cycle.code == "months-1" and cycle.declared is True
    assert [(p.currency_id, p.amount) for p in cycle.prices.all()] == [(1, Decimal("7000"))]
    warnings = [str(m) for m in get_messages(response.wsgi_request) if m.level_tag == "warning"]
    assert any("declared here, not confirmed by the service" in w for w in warnings)

    # Whatever the outbox holds is pushed: no blueprint reaches the service.
    assert all(status == PushOutcome.DONE for status in push_all())
    assert blueprint_patches(billing_sandbox) == []
    cycle.refresh_from_db()
    assert cycle.declared is True

    # The admin shows it as declared (list and cycle row).
    assert "billing-badge-declared" in admin_client.get(CHANGELIST).content.decode()
    page = admin_client.get(change_url(pulled)).content.decode()
    assert "declared here, not confirmed by the service" in page
    assert "billing-send-declared-link" in page
    listed = admin_client.get(CHANGELIST + "?cycles=declared").context["cl"].result_list
    assert [p.pk for p in listed] == [pulled.pk]

    # Checkout offers the declared cycle: the service receives it.
    response = shopper.post("/billing/checkout/", checkout)
    assert response.status_code == 302, response.content.decode()[:2000]
    [call] = billing_sandbox.requests(operation="create_checkout_session")
    assert call["status"] == 200
    assert call["body"]["product"] == str(pulled.remote_id)
    assert call["body"]["selected_billing_cycle"] == "months-1"
    session = CheckoutSession.objects.get()
    assert session.product == pulled and session.selected_billing_cycle == "months-1"
    assert response["Location"] == f"{billing_sandbox.checkout_url}/checkout/{session.remote_id}"


def test_send_declared_cycles_button_pushes_the_blueprint_and_confirms(
    billing_sandbox, pulled, admin_client
):
    declare_monthly(admin_client, pulled, "XOF 7500")
    push_all()
    url = reverse("admin:billing_integration_product_send_declared_cycles", args=[pulled.pk])
    page = admin_client.get(url)
    assert page.status_code == 200
    assert "may affect existing subscriptions" in page.content.decode()
    assert "months-1" in page.content.decode()
    assert blueprint_patches(billing_sandbox) == []  # the page sends nothing

    assert admin_client.post(url).status_code == 302
    assert OutboxEntry.objects.open().get().changed_fields == ["subscription_blueprint"]
    assert push_all() == [PushOutcome.DONE]
    [patch] = blueprint_patches(billing_sandbox)
    assert patch["body"]["subscription_blueprint"]["billing_cycles"] == [
        {"cycle": "months", "frequency": 1, "prices": [{"currency": 1, "amount": 7500}]}
    ]
    assert "prices" not in patch["body"]
    cycle = pulled.cycles.get()
    pulled.refresh_from_db()
    assert cycle.declared is False and pulled.blueprint_known is True
    assert pulled.sync_state == "synced"
    assert pulled.confirmed_cycles == {"months-1": {"1": "7500.00"}}  # what checkout sells
    # From now on the blueprint is the one sent: a price change is pushed as usual, and shown
    # not confirmed until the service acknowledges it.
    admin_client.post(
        change_url(pulled), product_form_data(pulled, **{"cycles-0-prices": "XOF 8000"})
    )
    pending = "not confirmed by the service yet: still XOF 7500.00 there"
    assert pending in admin_client.get(change_url(pulled)).content.decode()
    assert push_all() == [PushOutcome.DONE]
    assert pending not in admin_client.get(change_url(pulled)).content.decode()
    assert blueprint_patches(billing_sandbox)[-1]["body"]["subscription_blueprint"][
        "billing_cycles"
    ][0]["prices"] == [{"currency": 1, "amount": 8000}]


def test_send_declared_cycles_action_through_a_batch_drain(billing_sandbox, pulled, admin_client):
    declare_monthly(admin_client, pulled)
    push_all()
    response = admin_client.post(
        CHANGELIST,
        {"action": "send_declared_cycles", "index": "0", "_selected_action": [str(pulled.pk)]},
    )
    assert response.status_code == 302
    entries = list(OutboxEntry.objects.open().values_list("pk", flat=True))
    assert [push_entry(pk).status for pk in entries] == [PushOutcome.DONE]
    assert len(blueprint_patches(billing_sandbox)) == 1
    assert pulled.cycles.get().declared is False


def test_send_declared_cycles_action_refused_says_why_not_that_none_were_declared(
    billing_sandbox, pulled, admin_client
):
    """Every selected product refused (here: it lost its link to the service): the refusal is
    the message, not a "none of the selected products has declared cycles" that is untrue."""
    declare_monthly(admin_client, pulled)
    push_all()
    Product.objects.filter(pk=pulled.pk).update(remote_id=None)
    response = admin_client.post(
        CHANGELIST,
        {"action": "send_declared_cycles", "index": "0", "_selected_action": [str(pulled.pk)]},
        follow=True,
    )
    text = response.content.decode()
    assert "Only the cycles of a subscription product already on the service" in text
    assert "has declared cycles" not in text
    assert not OutboxEntry.objects.open().exists()


def test_view_only_staff_cannot_send_declared_cycles(billing_sandbox, pulled, admin_client):
    from .conftest import staff_with

    declare_monthly(admin_client, pulled)
    push_all()
    viewer = Client()
    viewer.force_login(staff_with("view_product", "view_billingcycle", "view_price"))
    page = viewer.get(change_url(pulled))
    assert page.status_code == 200 and "billing-send-declared-link" not in page.content.decode()
    url = reverse("admin:billing_integration_product_send_declared_cycles", args=[pulled.pk])
    assert viewer.post(url).status_code == 403
    assert not OutboxEntry.objects.open().exists()


def test_cycles_of_a_one_time_product_and_root_prices_of_a_subscription_are_refused(
    admin_client,
):
    """Neither would ever be sent (a one-time product is sold by its root price, a
    subscription by its cycles): refused at the form instead of kept silently."""
    add = reverse("admin:billing_integration_product_add")
    response = admin_client.post(
        add,
        product_form_data(
            name="Fee",
            product_type="one_time",
            **{
                "cycles-TOTAL_FORMS": "1",
                "cycles-0-unit": "months",
                "cycles-0-frequency": "1",
                "cycles-0-prices": "XOF 500",
            },
        ),
    )
    assert response.status_code == 200
    assert "A one-time product has no billing cycles" in response.content.decode()
    response = admin_client.post(
        add,
        product_form_data(
            name="Plan",
            **{
                "root_prices-TOTAL_FORMS": "1",
                "root_prices-0-currency_id": "1",
                "root_prices-0-amount": "500",
            },
        ),
    )
    assert response.status_code == 200
    assert "prices go on its billing cycles" in response.content.decode()
    assert not Product.objects.exists()


# --- changes no request can carry ------------------------------------------------------------
def pushed_setup_fee(admin_client: Client) -> Product:
    """A one-time product at XOF 2500 added in the admin and pushed."""
    add = reverse("admin:billing_integration_product_add")
    admin_client.post(
        add,
        product_form_data(
            name="Setup fee",
            product_type="one_time",
            **{
                "root_prices-TOTAL_FORMS": "1",
                "root_prices-0-currency_id": "1",
                "root_prices-0-amount": "2500",
            },
        ),
    )
    assert push_all() == [PushOutcome.DONE]
    product = Product.objects.get()
    assert product.remote_id is not None and product.sync_state == "synced"
    return product


def root_price_rows(product: Product, *rows: tuple[str, str]) -> dict[str, Any]:
    """The product form's POST with ``rows`` (currency id, amount) as its price rows, the
    stored ones first."""
    stored = list(product.root_prices.all())
    data = product_form_data(product)
    data.update({"root_prices-TOTAL_FORMS": str(len(rows)), "root_prices-INITIAL_FORMS": "0"})
    data["root_prices-INITIAL_FORMS"] = str(min(len(stored), len(rows)))
    for i, (currency, amount) in enumerate(rows):
        if i < len(stored):
            data[f"root_prices-{i}-id"] = str(stored[i].pk)
        data[f"root_prices-{i}-product"] = str(product.pk)
        data[f"root_prices-{i}-currency_id"] = currency
        data[f"root_prices-{i}-amount"] = amount
    return data


@pytest.mark.parametrize(
    "rows",
    [[("1", "3000")], [("1", "2500"), ("2", "4")], [("2", "2500")]],
    ids=["repriced", "a currency added", "another currency"],
)
def test_the_prices_of_a_one_time_product_the_service_has_are_not_changed(
    billing_sandbox, admin_client, rows
):
    """PATCH /products/{id} has no ``prices``: the form saved the new prices, kept here only
    ("Not sent", a warning after the save), never sold. Refused before anything is saved,
    naming the prices the service keeps and what to do instead."""
    product = pushed_setup_fee(admin_client)
    billing_sandbox.clear_requests()
    response = admin_client.post(change_url(product), root_price_rows(product, *rows))
    assert response.status_code == 200
    html = response.content.decode()
    assert (
        "The service has no way to change the prices of a one-time product it has: they stay "
        "XOF 2500.00 there. To sell at other prices, add a new product and archive this one."
    ) in html
    assert list(product.root_prices.values_list("currency_id", "amount")) == [(1, Decimal("2500"))]
    assert not OutboxEntry.objects.open().exists()
    # Its other fields are still changed, with the prices as the service has them.
    data = root_price_rows(product, ("1", "2500.00"))
    data["name"] = "Setup fee (2027)"
    assert admin_client.post(change_url(product), data).status_code == 302
    assert push_all() == [PushOutcome.DONE]
    [patch] = billing_sandbox.requests(operation="update_product")
    assert patch["body"] == {"name": "Setup fee (2027)"}
    product.refresh_from_db()
    assert product.sync_state == "synced"


def test_repricing_a_pushed_one_time_product_in_code_is_kept_and_shown_not_sent(
    billing_sandbox, admin_client
):
    """The admin refuses it (above); a save in code (an import, a shell) is kept locally and
    shown "Not sent"."""
    product = pushed_setup_fee(admin_client)
    billing_sandbox.clear_requests()

    price = product.root_prices.get()
    price.amount = Decimal("3000")
    price.save()
    data = product_form_data(
        product,
        **{
            "root_prices-TOTAL_FORMS": "1",
            "root_prices-INITIAL_FORMS": "1",
            "root_prices-0-id": str(price.pk),
            "root_prices-0-product": str(product.pk),
            "root_prices-0-currency_id": "1",
            "root_prices-0-amount": "3000",
        },
    )
    response = admin_client.post(change_url(product), data)  # a save of the page says so
    assert response.status_code == 302
    warnings = [str(m) for m in get_messages(response.wsgi_request) if m.level_tag == "warning"]
    assert any(
        "Not sent: the service has no way to change a one-time product's prices; "
        "local 3000 XOF, service 2500 XOF."
        in w
        and "The local change is kept." in w
        for w in warnings
    ), warnings

    assert push_all() == [PushOutcome.DONE]
    assert billing_sandbox.requests(operation="update_product") == []  # nothing can carry it
    assert billing_sandbox.object("product", str(product.remote_id))["prices"] == [
        {"currency": 1, "amount": 2500}
    ]
    product.refresh_from_db()
    assert product.root_prices.get().amount == Decimal("3000")  # the local change is kept
    assert product.sync_state == "not_sent"
    assert "local 3000 XOF, service 2500 XOF" in product.sync_error
    html = admin_client.get(CHANGELIST).content.decode()
    assert "billing-badge-not_sent" in html and "Not sent" in html
    # the price row: checkout sells the service's price
    page = admin_client.get(change_url(product)).content.decode()
    assert "not sent (the service cannot receive it): still XOF 2500.00 there" in page
    assert product.sold_prices() == {1: Decimal("2500.00")}
    assert [
        p.pk
        for p in admin_client.get(CHANGELIST + "?sync_state__exact=not_sent")
        .context["cl"]
        .result_list
    ] == [product.pk]


def test_declaring_cycles_of_a_pulled_product_with_subscriptions_asks_no_confirmation(
    billing_sandbox, pulled, admin_client
):
    """Declared cycles reach no subscription (they are not sent): no "may affect existing
    subscriptions" page on save; the send page asks instead."""
    from .conftest import make_subscription

    make_subscription(pulled)
    response = declare_monthly(admin_client, pulled)
    assert response.status_code == 302
    assert pulled.cycles.get().declared is True
    url = reverse("admin:billing_integration_product_send_declared_cycles", args=[pulled.pk])
    page = admin_client.get(url).content.decode()
    assert "may affect existing subscriptions" in page and "It has 1 subscription." in page
