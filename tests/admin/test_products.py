"""The product admin: add form with inlines, actions, confirmation page, no delete, permissions."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from billing_integration.admin.products import CONFIRM_FIELD, parse_prices
from billing_integration.models import BillingCycle, OutboxEntry, Price, Product
from billing_integration.outbox import from_remote

from .conftest import make_product, make_subscription, product_form_data, staff_with

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:billing_integration_product_changelist")
ADD = reverse("admin:billing_integration_product_add")


def change_url(product: Product) -> str:
    return reverse("admin:billing_integration_product_change", args=[product.pk])


def action(client: Client, name: str, *products: Product):
    return client.post(
        CHANGELIST,
        {"action": name, "_selected_action": [str(p.pk) for p in products], "index": "0"},
    )


# --- add form ---------------------------------------------------------------------------------
def test_add_product_with_monthly_price_in_one_form(
    admin_client, recorded_enqueues, django_capture_on_commit_callbacks
):
    data = product_form_data(
        name="Pro plan",
        description="All features",
        **{
            "cycles-TOTAL_FORMS": "1",
            "cycles-0-unit": "months",
            "cycles-0-frequency": "1",
            "cycles-0-prices": "XOF 10000, USD 19.99",
        },
    )
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(ADD, data)
    assert response.status_code == 302, response.content.decode()[:3000]
    product = Product.objects.get(name="Pro plan")
    assert product.status == "draft" and product.product_type == "subscription"
    cycle = product.cycles.get()
    assert cycle.code == "months-1"
    assert {(p.currency_id, p.amount) for p in cycle.prices.all()} == {
        (1, Decimal("10000")),
        (2, Decimal("19.99")),
    }
    # Currencies of the prices are added to the product's currencies.
    assert sorted(product.selected_currencies) == [1, 2]
    # One outbox entry (a create) for the product with its cycle and prices, enqueued once.
    entry = OutboxEntry.objects.get()
    assert entry.operation == "create" and entry.object_id == product.pk
    assert recorded_enqueues == [entry.pk]


def test_add_one_time_product_with_root_prices(admin_client):
    data = product_form_data(
        name="Setup fee",
        product_type="one_time",
        **{
            "root_prices-TOTAL_FORMS": "1",
            "root_prices-0-currency_id": "1",
            "root_prices-0-amount": "5000",
        },
    )
    response = admin_client.post(ADD, data)
    assert response.status_code == 302
    product = Product.objects.get(name="Setup fee")
    assert [(p.currency_id, p.amount) for p in product.root_prices.all()] == [(1, Decimal("5000"))]
    assert not BillingCycle.objects.filter(product=product).exists()


def test_bad_prices_text_is_a_form_error(admin_client):
    data = product_form_data(
        name="Broken",
        **{
            "cycles-TOTAL_FORMS": "1",
            "cycles-0-unit": "months",
            "cycles-0-frequency": "1",
            "cycles-0-prices": "XOF ten",
        },
    )
    response = admin_client.post(ADD, data)
    assert response.status_code == 200
    assert "is not a price" in response.content.decode()
    assert not Product.objects.exists()


def test_parse_prices_forms():
    assert parse_prices("XOF 10000; usd=19.99\n3:5") == {
        1: Decimal("10000"),
        2: Decimal("19.99"),
        3: Decimal("5"),
    }
    assert parse_prices("") == {}
    for bad in ("ZZZ 1", "99 1", "XOF 1.234", "XOF 1, XOF 2", "XOF"):
        with pytest.raises(ValidationError):
            parse_prices(bad)


# --- list ---------------------------------------------------------------------------------------
def test_changelist_columns_filters_search_and_bounded_queries(
    admin_client, django_assert_max_num_queries
):
    products = [make_product(f"P{i:02d}", remote=True) for i in range(20)]
    for _ in range(3):
        make_subscription(products[0])
    make_subscription(products[0], status="canceled")
    with django_assert_max_num_queries(12):
        response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    rows = response.context["cl"].result_list
    assert len(rows) == 20
    counts = {p.name: p._subscriber_count for p in rows}
    assert counts["P00"] == 3 and counts["P01"] == 0  # the canceled one is not counted
    html = response.content.decode()
    assert "billing-badge-synced" in html and str(products[0].remote_id) in html
    for query in (
        "?status__exact=published",
        "?product_type__exact=one_time",
        "?sync_state__exact=failed",
        f"?q={products[3].remote_id}",
    ):
        response = admin_client.get(CHANGELIST + query)
        assert response.status_code == 200
    assert [p.name for p in admin_client.get(CHANGELIST + "?q=P03").context["cl"].result_list] == [
        "P03"
    ]


def test_change_view_shows_sync_state_and_last_error(admin_client):
    product = make_product(remote=True)
    Product.objects.filter(pk=product.pk).update(
        sync_state="failed", sync_error="HTTP 422: name is required"
    )
    html = admin_client.get(change_url(product)).content.decode()
    assert "billing-badge-failed" in html
    assert "HTTP 422: name is required" in html
    assert "XOF 10000.00" in html  # the cycle's prices in the compact field


# --- actions ------------------------------------------------------------------------------------
def test_publish_and_archive_actions_change_status_and_write_outbox(
    admin_client, recorded_enqueues, django_capture_on_commit_callbacks
):
    a, b = make_product("A", remote=True), make_product("B", remote=True, status="published")
    with django_capture_on_commit_callbacks(execute=True):
        response = action(admin_client, "publish", a, b)
    assert response.status_code == 302
    a.refresh_from_db()
    b.refresh_from_db()
    assert a.status == "published" and b.status == "published"
    # Only the product whose status changed is pushed (an update).
    assert list(OutboxEntry.objects.values_list("object_id", "operation")) == [(a.pk, "update")]
    with django_capture_on_commit_callbacks(execute=True):
        action(admin_client, "archive", a, b)
    assert set(Product.objects.values_list("status", flat=True)) == {"archived"}
    assert OutboxEntry.objects.count() == 2  # a's entry (not attempted) collapsed; b's new
    assert len(recorded_enqueues) == 2


def test_archiving_or_publishing_again_says_nothing_was_sent(admin_client, recorded_enqueues):
    """A product already in the chosen status is left alone, and the message says so; it said
    "0 product(s) archived; the change is being pushed." (success) when nothing was."""

    def said(name: str, *products: Product) -> list[str]:
        """The messages of the page the action leads to."""
        selected = [str(p.pk) for p in products]
        data = {"action": name, "_selected_action": selected, "index": "0"}
        response = admin_client.post(CHANGELIST, data, follow=True)
        return [f"{m.level_tag}: {m}" for m in response.context["messages"]]

    old = make_product("Old", remote=True, status="archived")
    new = make_product("New", remote=True, status="draft")
    assert said("archive", old) == ["info: Already archived, nothing sent: Old."]
    assert not OutboxEntry.objects.exists() and recorded_enqueues == []

    assert said("archive", old, new) == [
        "success: 1 product(s) archived; the change is being pushed.",
        "info: Already archived, nothing sent: Old.",
    ]
    assert list(OutboxEntry.objects.values_list("object_id", flat=True)) == [new.pk]

    live = make_product("Live", remote=True, status="published")
    assert said("publish", live) == ["info: Already published, nothing sent: Live."]


def test_a_product_with_no_price_the_service_has_not_got_is_not_published(admin_client):
    """Its create (with the new status) is refused by the service ("billing_cycles must be a
    non-empty array"): the action said "published; the change is being pushed" all the same.
    The other selected products are published, and the message names the one left."""
    with from_remote():
        empty = Product.objects.create(name="Empty", selected_currencies=[1])
        BillingCycle.objects.create(product=empty, unit="months", frequency=1)  # no price
    full = make_product("Full")
    response = admin_client.post(
        CHANGELIST,
        {"action": "publish", "_selected_action": [empty.pk, full.pk], "index": "0"},
        follow=True,
    )
    said = [f"{m.level_tag}: {m}" for m in response.context["messages"]]
    assert said[0].startswith("error: Not published, no price") and said[0].endswith(": Empty.")
    assert len(said) == 2
    assert said[1] == "success: 1 product(s) published; the change is being pushed."
    assert dict(Product.objects.values_list("name", "status")) == {
        "Empty": "draft",
        "Full": "published",
    }
    assert list(OutboxEntry.objects.values_list("object_id", flat=True)) == [full.pk]


@pytest.mark.django_db(transaction=True)
def test_publish_action_reaches_the_sandbox(billing_sandbox, admin_client):
    from billing_integration.outbox.push import PushOutcome, push_entry

    def push_all() -> list[str]:
        return [
            push_entry(pk).status for pk in OutboxEntry.objects.open().values_list("pk", flat=True)
        ]

    # Created through the admin add form, pushed: the sandbox has the draft product.
    data = product_form_data(
        name="Pro plan",
        **{
            "cycles-TOTAL_FORMS": "1",
            "cycles-0-unit": "months",
            "cycles-0-frequency": "1",
            "cycles-0-prices": "XOF 10000",
        },
    )
    assert admin_client.post(ADD, data).status_code == 302
    assert push_all() == [PushOutcome.DONE]
    product = Product.objects.get()
    assert product.remote_id is not None and product.sync_state == "synced"
    [created] = billing_sandbox.requests(operation="create_product")
    assert created["body"]["subscription_blueprint"]["billing_cycles"][0]["prices"] == [
        {"currency": 1, "amount": 10000}
    ]

    action(admin_client, "publish", product)
    assert push_all() == [PushOutcome.DONE]
    [patch] = billing_sandbox.requests(operation="update_product")
    assert patch["method"] == "PATCH" and patch["body"]["status"] == "published"
    assert billing_sandbox.object("product", str(product.remote_id))["status"] == "published"

    action(admin_client, "archive", product)
    assert push_all() == [PushOutcome.DONE]
    assert billing_sandbox.object("product", str(product.remote_id))["status"] == "archived"
    product.refresh_from_db()
    assert product.status == "archived" and product.sync_state == "synced"


def test_retry_failed_push_action_requeues_the_entry(admin_client, recorded_enqueues):
    product = make_product(remote=True)
    product.publish()
    entry = OutboxEntry.objects.get()
    OutboxEntry.objects.filter(pk=entry.pk).update(
        state="failed", attempts=3, last_error="HTTP 422"
    )
    other = make_product("Other", remote=True)
    other.publish()
    OutboxEntry.objects.filter(object_id=other.pk).update(state="failed")
    recorded_enqueues.clear()
    answer = admin_client.get(action(admin_client, "retry_failed_push", product)["Location"])
    assert "1 failed push(es) re-queued." in answer.content.decode()
    entry.refresh_from_db()
    assert entry.state == "pending" and entry.attempts == 0
    assert OutboxEntry.objects.get(object_id=other.pk).state == "failed"  # not selected
    again = admin_client.get(action(admin_client, "retry_failed_push", product)["Location"])
    assert "Nothing re-queued: none of the selected rows has a failed push." in (
        again.content.decode()
    )


def test_sync_now_action_pulls_products(admin_client, billing_sandbox):
    from billing_integration.client import get_client

    get_client().create_product(
        {
            "name": "Remote plan",
            "description": "",
            "status": "published",
            "selected_currencies": ["1"],
            "prices": [{"currency": 1, "amount": 500}],
        }
    )
    assert not Product.objects.filter(name="Remote plan").exists()
    local = make_product("Local")
    response = action(admin_client, "sync_now", local)
    assert response.status_code == 302
    assert Product.objects.filter(name="Remote plan", status="published").exists()


# --- the confirmation before changing prices of a product with subscriptions -----------------
def test_price_change_with_subscribers_needs_confirmation(admin_client):
    product = make_product(remote=True)
    make_subscription(product)
    make_subscription(product, status="canceled")
    data = product_form_data(product, **{"cycles-0-prices": "XOF 12000"})
    response = admin_client.post(change_url(product), data)
    assert response.status_code == 200
    html = response.content.decode()
    assert "may affect existing subscriptions" in html
    assert "2 subscriptions (1 active)" in html
    assert "change months-1 (prices)" in html
    assert f'name="{CONFIRM_FIELD}"' in html
    # Nothing saved yet.
    assert Price.objects.get().amount == Decimal("10000")
    assert not OutboxEntry.objects.exists()

    # The confirmation page re-posts the same data with the flag: now it is saved.
    response = admin_client.post(change_url(product), {**data, CONFIRM_FIELD: "1"})
    assert response.status_code == 302
    assert Price.objects.get().amount == Decimal("12000")
    entry = OutboxEntry.objects.get()
    assert entry.changed_fields == ["subscription_blueprint"]


def test_cycle_added_or_removed_with_subscribers_needs_confirmation(admin_client):
    product = make_product(remote=True)
    make_subscription(product)
    add_cycle = product_form_data(
        product,
        **{
            "cycles-TOTAL_FORMS": "2",
            "cycles-1-unit": "years",
            "cycles-1-frequency": "1",
            "cycles-1-prices": "XOF 100000",
            "cycles-1-product": str(product.pk),
        },
    )
    response = admin_client.post(change_url(product), add_cycle)
    assert response.status_code == 200 and "add unit=years" in response.content.decode()
    assert product.cycles.count() == 1
    with from_remote():  # a product keeps a cycle: one removed of two
        cycle = BillingCycle.objects.create(product=product, unit="years", frequency=1)
        Price.objects.create(cycle=cycle, currency_id=1, amount=Decimal("100000"))
    remove = product_form_data(product, **{"cycles-0-DELETE": "on"})
    response = admin_client.post(change_url(product), remove)
    assert response.status_code == 200 and "remove months-1" in response.content.decode()
    assert product.cycles.count() == 2


def test_no_confirmation_without_subscribers_or_without_price_changes(admin_client):
    lonely = make_product("Lonely", remote=True)
    response = admin_client.post(
        change_url(lonely), product_form_data(lonely, **{"cycles-0-prices": "XOF 1"})
    )
    assert response.status_code == 302
    assert Price.objects.get(cycle__product=lonely).amount == Decimal("1")

    busy = make_product("Busy", remote=True)
    make_subscription(busy)
    response = admin_client.post(change_url(busy), product_form_data(busy, description="New words"))
    assert response.status_code == 302  # only the description changed: saved at once
    busy.refresh_from_db()
    assert busy.description == "New words"


def test_cycle_page_also_asks_for_confirmation(admin_client):
    product = make_product(remote=True)
    make_subscription(product)
    cycle = product.cycles.get()
    price = cycle.prices.get()
    url = reverse("admin:billing_integration_billingcycle_change", args=[cycle.pk])
    assert admin_client.get(url).status_code == 200
    data = {
        "unit": "months",
        "frequency": "1",
        "prices-TOTAL_FORMS": "1",
        "prices-INITIAL_FORMS": "1",
        "prices-MIN_NUM_FORMS": "0",
        "prices-MAX_NUM_FORMS": "1000",
        "prices-0-id": str(price.pk),
        "prices-0-cycle": str(cycle.pk),
        "prices-0-currency_id": "1",
        "prices-0-amount": "15000",
        "_save": "Save",
    }
    response = admin_client.post(url, data)
    assert response.status_code == 200 and "may affect existing" in response.content.decode()
    assert Price.objects.get().amount == Decimal("10000")
    assert admin_client.post(url, {**data, CONFIRM_FIELD: "1"}).status_code == 302
    assert Price.objects.get().amount == Decimal("15000")


# --- delete replaced by archive --------------------------------------------------------------
def test_delete_is_not_offered_and_forged_deletes_do_nothing(admin_client):
    product = make_product(remote=True)
    html = admin_client.get(CHANGELIST).content.decode()
    assert "delete_selected" not in html
    change = admin_client.get(change_url(product)).content.decode()
    assert "/delete/" not in change and "billing-archive-link" in change

    delete_url = reverse("admin:billing_integration_product_delete", args=[product.pk])
    assert admin_client.get(delete_url).status_code == 403
    assert admin_client.post(delete_url, {"post": "yes"}).status_code == 403
    action(admin_client, "delete_selected", product)
    assert Product.objects.filter(pk=product.pk).exists()


def test_archive_button_archives_after_confirmation(admin_client, recorded_enqueues):
    product = make_product(remote=True, status="published")
    url = reverse("admin:billing_integration_product_archive", args=[product.pk])
    page = admin_client.get(url)
    assert page.status_code == 200 and "Yes, archive it" in page.content.decode()
    product.refresh_from_db()
    assert product.status == "published"
    response = admin_client.post(url)
    assert response.status_code == 302
    admin_client.get(response.url)  # its message read
    product.refresh_from_db()
    assert product.status == "archived"
    assert OutboxEntry.objects.get().object_id == product.pk
    # Again (a second tab, a double click): nothing sent, and the message says so; it said
    # "“Pro” is archived." as if it had been archived then.
    response = admin_client.post(url, follow=True)
    assert [str(m) for m in response.context["messages"]] == [
        "Already archived, nothing sent: Pro."
    ]
    assert OutboxEntry.objects.count() == 1
    # Its confirmation page (reached by its address: the change page has no button now) is
    # not offered again: it offered to archive an archived product.
    response = admin_client.get(url, follow=True)
    assert response.redirect_chain == [(change_url(product), 302)]
    assert [str(m) for m in response.context["messages"]] == [
        "Already archived, nothing sent: Pro."
    ]
    # A product the service has not got, with no price: its create would be refused.
    with from_remote():
        empty = Product.objects.create(name="Empty", selected_currencies=[1])
    url = reverse("admin:billing_integration_product_archive", args=[empty.pk])
    [said] = admin_client.post(url, follow=True).context["messages"]
    assert str(said).startswith("Not archived, no price") and said.level_tag == "error"
    empty.refresh_from_db()
    assert empty.status == "draft" and OutboxEntry.objects.count() == 1


# --- permissions --------------------------------------------------------------------------------
def test_view_only_staff_cannot_publish_or_archive(viewer_client):
    product = make_product(remote=True)
    response = viewer_client.get(CHANGELIST)
    assert response.status_code == 200
    html = response.content.decode()
    for name in ("publish", "archive", "sync_now", "retry_failed_push"):
        assert f'value="{name}"' not in html
    # Forged POSTs change nothing.
    action(viewer_client, "publish", product)
    action(viewer_client, "archive", product)
    product.refresh_from_db()
    assert product.status == "draft"
    assert not OutboxEntry.objects.exists()
    url = reverse("admin:billing_integration_product_archive", args=[product.pk])
    assert viewer_client.post(url).status_code == 403
    assert (
        viewer_client.post(
            change_url(product), product_form_data(product, status="published")
        ).status_code
        == 403
    )
    product.refresh_from_db()
    assert product.status == "draft"


def test_view_only_staff_see_the_change_page_with_prices_as_text(db):
    """Read-only inline rows display the cycle's prices (not the related manager: a 500)."""
    client = Client()
    client.force_login(staff_with("view_product", "view_billingcycle", "view_price"))
    product = make_product(remote=True, amount="12500")
    response = client.get(change_url(product))
    assert response.status_code == 200
    html = response.content.decode()
    assert "XOF 12500.00" in html
    assert 'name="cycles-0-prices"' not in html  # shown as text, not as an input
    assert client.post(change_url(product), product_form_data(product)).status_code == 403


def test_staff_with_change_permission_can_publish(db):
    user = staff_with("view_product", "change_product")
    client = Client()
    client.force_login(user)
    product = make_product(remote=True)
    assert 'value="publish"' in client.get(CHANGELIST).content.decode()
    action(client, "publish", product)
    product.refresh_from_db()
    assert product.status == "published"
    # Even with every product permission, delete stays refused.
    user.user_permissions.add(Permission.objects.get(codename="delete_product"))
    client.force_login(user)
    delete_url = reverse("admin:billing_integration_product_delete", args=[product.pk])
    assert client.post(delete_url, {"post": "yes"}).status_code == 403
    assert Product.objects.filter(pk=product.pk).exists()


def test_add_page_offers_the_documented_fields(admin_client):
    """The names docs/admin.md gives the browser test."""
    html = admin_client.get(ADD).content.decode()
    for name in (
        "name",
        "description",
        "product_type",
        "status",
        "selected_currencies",
        "cycles-0-unit",
        "cycles-0-frequency",
        "cycles-0-prices",
        "cycles-TOTAL_FORMS",
        "root_prices-TOTAL_FORMS",
        "_save",
    ):
        assert f'name="{name}"' in html, name
    assert "billing-archive-link" not in html


# --- publishing an archived product again -----------------------------------------------------
def test_publishing_an_archived_product_again_asks_first(admin_client):
    archived = make_product("Old plan", remote=True, status="archived")
    draft = make_product("New plan", remote=True, status="draft")

    page = action(admin_client, "publish", archived, draft)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="billing-republish-archived"><li>Old plan</li></ul>' in html
    assert "may refuse to publish an archived product again" in html
    archived.refresh_from_db()
    draft.refresh_from_db()
    assert archived.status == "archived" and draft.status == "draft"  # nothing done yet
    assert not OutboxEntry.objects.exists()

    confirmed = admin_client.post(
        CHANGELIST,
        {
            "action": "publish",
            "_selected_action": [str(archived.pk), str(draft.pk)],
            "_confirm_republish": "yes",
        },
        follow=True,
    )
    text = confirmed.content.decode()
    assert "2 product(s) published" in text
    assert "may refuse to publish an archived product again" in text
    archived.refresh_from_db()
    assert archived.status == "published"
    assert OutboxEntry.objects.filter(object_id=archived.pk).exists()


def test_the_admin_says_when_the_service_refused_to_publish_again(billing_sandbox, admin_client):
    """Archive, then publish again: the sandbox refuses (400 invalid_transition); the list and
    the change page say so, and the product is not on sale."""
    from billing_integration.outbox.push import PushOutcome, push_entry

    def push_all() -> list[str]:
        return [
            push_entry(pk).status for pk in OutboxEntry.objects.open().values_list("pk", flat=True)
        ]

    data = product_form_data(
        name="Pro plan",
        status="published",
        **{
            "cycles-TOTAL_FORMS": "1",
            "cycles-0-unit": "months",
            "cycles-0-frequency": "1",
            "cycles-0-prices": "XOF 10000",
        },
    )
    assert admin_client.post(ADD, data).status_code == 302
    assert push_all() == [PushOutcome.DONE]
    product = Product.objects.get()
    action(admin_client, "archive", product)
    assert push_all() == [PushOutcome.DONE]
    admin_client.post(
        CHANGELIST,
        {"action": "publish", "_selected_action": [str(product.pk)], "_confirm_republish": "y"},
    )
    # before the push: not sold, and the list says the service has not confirmed it yet
    listing = admin_client.get(CHANGELIST).content.decode()
    assert "not confirmed by the service yet: still Archived there" in listing
    assert "The service refused" not in admin_client.get(change_url(product)).content.decode()
    assert not Product.objects.on_sale().exists()
    assert push_all() == [PushOutcome.FAILED]
    product.refresh_from_db()
    assert (product.status, product.sync_state) == ("published", "failed")
    assert billing_sandbox.object("product", str(product.remote_id))["status"] == "archived"

    listing = admin_client.get(CHANGELIST).content.decode()
    assert "refused by the service: still Archived there" in listing
    page = admin_client.get(change_url(product)).content.decode()
    assert "The service refused to make “Pro plan” published: it is still archived there" in page
    assert not Product.objects.on_sale().exists()


def test_add_on_and_plan_group_are_set_in_the_admin_and_not_pushed(admin_client):
    product = make_product("Support", remote=True, status="published")
    html = admin_client.get(change_url(product)).content.decode()
    assert 'name="add_on"' in html and 'name="plan_group"' in html
    assert 'name="multiple_purchases"' in html
    data = product_form_data(product, add_on="on", plan_group="support", multiple_purchases="on")
    assert admin_client.post(change_url(product), data).status_code == 302
    product.refresh_from_db()
    assert product.add_on and product.plan_group == "support" and product.multiple_purchases
    assert not OutboxEntry.objects.exists()  # kept here only: nothing to send


def test_add_on_plan_group_and_trial_are_set_on_the_add_form(admin_client):
    html = admin_client.get(ADD).content.decode()
    for name in ("add_on", "plan_group", "multiple_purchases", "trial_days"):
        assert f'name="{name}"' in html, name
    assert 'name="sync_state"' not in html and "Synchronisation" not in html
    data = product_form_data(
        name="Extra seats",
        add_on="on",
        plan_group="seats",
        multiple_purchases="on",
        trial_days="7",
        **{
            "cycles-TOTAL_FORMS": "1",
            "cycles-0-unit": "months",
            "cycles-0-frequency": "1",
            "cycles-0-prices": "XOF 1000",
        },
    )
    response = admin_client.post(ADD, data)
    assert response.status_code == 302, response.content.decode()[:3000]
    product = Product.objects.get(name="Extra seats")
    assert (product.add_on, product.plan_group, product.multiple_purchases) == (
        True,
        "seats",
        True,
    )
    assert product.trial_days == 7


def test_the_change_form_does_not_publish_an_archived_product_unwarned(admin_client):
    archived = make_product("Old plan", remote=True, status="archived")
    data = product_form_data(archived, status="published")
    response = admin_client.post(change_url(archived), data)
    assert response.status_code == 200
    assert "archived on the service, which may refuse to publish it again" in (
        response.content.decode()
    )
    archived.refresh_from_db()
    assert archived.status == "archived"
    assert not OutboxEntry.objects.exists()
    # a draft, or an archived product the service never saw, is published from the form
    draft = make_product("Draft plan", remote=True, status="draft")
    assert admin_client.post(change_url(draft), product_form_data(draft, status="published"))[
        "Location"
    ]
    local = make_product("Local plan", remote=False, status="archived")
    admin_client.post(change_url(local), product_form_data(local, status="published"))
    draft.refresh_from_db()
    local.refresh_from_db()
    assert draft.status == local.status == "published"


def test_a_product_whose_archive_the_service_refused_is_published_again_unasked(admin_client):
    """Archived here, its archive refused (the service still has it draft or published): the
    form refused to publish it ("This product is archived on the service") and the action
    asked to confirm a republication the service "may refuse", though the service holds no
    archived product: a draft one is published as any draft, a published one stays so."""
    products = []
    for name, there in (("Was draft", "draft"), ("Was live", "published")):
        product = make_product(name, remote=True, status="archived")
        Product.objects.filter(pk=product.pk).update(
            sync_state="failed", remote_data={"status": there}
        )
        product.refresh_from_db()
        products.append(product)
    was_draft, was_live = products

    response = admin_client.post(
        change_url(was_draft), product_form_data(was_draft, status="published")
    )
    assert response.status_code == 302, response.content.decode()
    was_draft.refresh_from_db()
    assert was_draft.status == "published"
    assert list(OutboxEntry.objects.values_list("object_id", flat=True)) == [was_draft.pk]

    response = action(admin_client, "publish", was_live)
    assert response.status_code == 302  # no confirmation page
    was_live.refresh_from_db()
    assert was_live.status == "published"


def test_archiving_again_a_product_whose_archive_the_service_refused_says_so(admin_client):
    """Archived here, still published on the service (its push refused): the action said
    "Already archived, nothing sent", as if the product were off sale there too."""
    stuck = make_product("Stuck", remote=True, status="archived")
    Product.objects.filter(pk=stuck.pk).update(
        sync_state="failed", remote_data={"status": "published"}
    )
    data = {"action": "archive", "_selected_action": [str(stuck.pk)], "index": "0"}
    response = admin_client.post(CHANGELIST, data, follow=True)
    said = [f"{m.level_tag}: {m}" for m in response.context["messages"]]
    assert said == [
        "warning: The service refused to make “Stuck” archived: it is still published there, "
        "and it is sold as such (checkout and the pricing page show it as published)."
    ]
    assert not OutboxEntry.objects.exists()


def test_publishing_again_while_the_publication_is_pending_says_it_is_not_refused(admin_client):
    """Published here, its push not done yet (the service still says draft): the action said
    "The service refused to make “Pending” published", which nothing had; nothing is sent
    again either way."""
    pending = make_product("Pending", remote=True, status="draft")
    Product.objects.filter(pk=pending.pk).update(remote_data={"status": "draft"})
    data = {"action": "publish", "_selected_action": [str(pending.pk)], "index": "0"}
    admin_client.post(CHANGELIST, data, follow=True)  # its message read
    pending.refresh_from_db()
    assert pending.status == "published" and pending.sync_state == "pending"
    entries = list(OutboxEntry.objects.values_list("pk", flat=True))
    assert len(entries) == 1

    response = admin_client.post(CHANGELIST, data, follow=True)
    said = [f"{m.level_tag}: {m}" for m in response.context["messages"]]
    assert said == [
        "info: Already published, not confirmed by the service yet (its push is waiting); "
        "nothing sent again: Pending."
    ]
    assert list(OutboxEntry.objects.values_list("pk", flat=True)) == entries


def test_a_cycle_or_price_not_confirmed_by_the_service_is_shown_so(admin_client):
    """Checkout sells the cycles and prices the service acknowledged: the product page says
    which are not confirmed yet, or refused, and what the service still has."""
    product = make_product(remote=True, status="published", amount="10000.00")
    page = admin_client.get(reverse("admin:billing_integration_product_change", args=[product.pk]))
    assert "not confirmed by the service" not in page.content.decode()

    with from_remote():  # a cycle added, a price changed: their push waits
        cycle = BillingCycle.objects.create(product=product, unit="years", frequency=1)
        Price.objects.create(cycle=cycle, currency_id=1, amount=Decimal("100000"))
        Price.objects.filter(cycle__unit="months").update(amount=Decimal("12000"))
    url = reverse("admin:billing_integration_product_change", args=[product.pk])
    html = admin_client.get(url).content.decode()
    assert "not confirmed by the service yet: not sold there" in html  # the new cycle
    assert "not confirmed by the service yet: still XOF 10000.00 there" in html  # the price
    assert "billing-badge-pending" in html

    Product.objects.filter(pk=product.pk).update(sync_state="failed")  # the service refused
    html = admin_client.get(url).content.decode()
    assert "refused by the service: not sold there" in html
    assert "refused by the service: still XOF 10000.00 there" in html


def test_cycle_page_needs_the_change_product_permission(db):
    """A cycle's change pushes its product's prices: the cycle permissions alone (the product
    only viewed) change nothing, even by a forged, confirmed POST to the cycle's page."""
    client = Client()
    user = staff_with(
        "view_product",
        "view_billingcycle",
        "change_billingcycle",
        "view_price",
        "add_price",
        "change_price",
        "delete_price",
    )
    client.force_login(user)
    product = make_product(remote=True)
    cycle = product.cycles.get()
    price = cycle.prices.get()
    url = reverse("admin:billing_integration_billingcycle_change", args=[cycle.pk])
    data = {
        "unit": "months",
        "frequency": "1",
        "prices-TOTAL_FORMS": "1",
        "prices-INITIAL_FORMS": "1",
        "prices-MIN_NUM_FORMS": "0",
        "prices-MAX_NUM_FORMS": "1000",
        "prices-0-id": str(price.pk),
        "prices-0-cycle": str(cycle.pk),
        "prices-0-currency_id": "1",
        "prices-0-amount": "1",
        "_save": "Save",
        CONFIRM_FIELD: "1",
    }
    assert client.post(url, data).status_code == 403
    assert Price.objects.get().amount == Decimal("10000")
    assert not OutboxEntry.objects.exists()
    html = client.get(url).content.decode()
    assert 'name="prices-0-amount"' not in html and 'name="_save"' not in html
    # With the product's change permission too, the same POST changes the price.
    user.user_permissions.add(Permission.objects.get(codename="change_product"))
    client.force_login(user)
    assert client.post(url, data).status_code == 302
    assert Price.objects.get().amount == Decimal("1")


def test_add_only_staff_cannot_create_a_product_published(db):
    """Publishing needs the change permission: a staff user who may add products but not
    change them adds drafts only (the status is not on the add form, a forged one is ignored)."""
    client = Client()
    client.force_login(staff_with("add_product", "view_product", "add_billingcycle", "add_price"))
    page = client.get(ADD)
    assert page.status_code == 200 and 'name="status"' not in page.content.decode()
    data = product_form_data(
        name="Sneaky",
        status="published",
        **{
            "cycles-TOTAL_FORMS": "1",
            "cycles-0-unit": "months",
            "cycles-0-frequency": "1",
            "cycles-0-prices": "XOF 10000",
        },
    )
    assert client.post(ADD, data).status_code == 302
    product = Product.objects.get(name="Sneaky")
    assert product.status == "draft"
    assert OutboxEntry.objects.get().operation == "create"  # pushed as the draft it is
