"""The plugin's ``billing_inline`` fixture (the test runs in real transactions, Celery eager):
after-commit work runs when its transaction commits; and ``after_commit_inline`` with
pytest-django's ``django_capture_on_commit_callbacks`` in a plain ``django_db`` test."""

from __future__ import annotations

from decimal import Decimal

import pytest
from celery import current_app
from django.db import transaction

from billing_integration.models import BillingCycle, OutboxEntry, Price, Product
from billing_integration.testing.inline import after_commit_inline

pytestmark = pytest.mark.django_db  # one transaction per test, unless billing_inline


def make_product(sandbox, name: str = "Pro") -> Product:
    with transaction.atomic():
        product = Product.objects.create(name=name, status="published")
        cycle = BillingCycle.objects.create(product=product, unit="months", frequency=1)
        Price.objects.create(cycle=cycle, currency_id=1, amount=Decimal("10000"))
        assert sandbox.requests("create_product") == [], "nothing is sent before the block ends"
    return product


def test_without_it_nothing_after_commit_runs(billing_sandbox):
    product = make_product(billing_sandbox)
    assert billing_sandbox.requests("create_product") == []
    product.refresh_from_db()
    assert product.sync_state == "pending"


def test_a_product_is_pushed_when_its_block_ends(billing_sandbox, billing_inline):
    product = make_product(billing_sandbox)
    [call] = billing_sandbox.requests("create_product")
    assert call["status"] == 200 and call["body"]["name"] == "Pro"
    product.refresh_from_db()
    assert product.sync_state == "synced" and product.remote_id is not None
    assert OutboxEntry.objects.get().state == "done"


def test_a_save_outside_any_block_is_pushed_at_once(billing_sandbox, billing_inline):
    product = make_product(billing_sandbox)
    product.refresh_from_db()
    product.name = "Pro 2"
    product.save()  # its own atomic save: "committed" when it returns
    [patch] = billing_sandbox.requests("update_product")
    assert patch["body"] == {"name": "Pro 2"}


def test_a_rolled_back_block_sends_nothing(billing_sandbox, billing_inline):
    with pytest.raises(RuntimeError), transaction.atomic():
        Product.objects.create(name="Never", status="published")
        raise RuntimeError("rolled back")
    assert billing_sandbox.requests("create_product") == []
    assert not Product.objects.filter(name="Never").exists()


def test_callbacks_run_in_order_and_nested_ones_follow_their_commit(billing_inline):
    ran: list[str] = []
    with transaction.atomic():
        transaction.on_commit(lambda: ran.append("first"))
        with transaction.atomic():
            transaction.on_commit(lambda: ran.append("inner"))
        transaction.on_commit(lambda: ran.append("last"))
        assert ran == []
    assert ran == ["first", "inner", "last"]
    transaction.on_commit(lambda: ran.append("autocommit"))
    assert ran[-1] == "autocommit"


def test_celery_is_eager_inside_and_restored_after(settings):
    before = current_app.conf.task_always_eager
    with after_commit_inline(settings):
        assert current_app.conf.task_always_eager is True
        assert settings.CELERY_TASK_ALWAYS_EAGER is True
    assert current_app.conf.task_always_eager == before
    ran = []
    with transaction.atomic():
        transaction.on_commit(lambda: ran.append(1))
    assert ran == [], "after it, the test's transaction holds the callbacks again"


def test_captured_callbacks_run_the_push_in_a_plain_django_db_test(
    billing_sandbox, settings, django_capture_on_commit_callbacks
):
    with after_commit_inline(settings), django_capture_on_commit_callbacks(execute=True):
        product = make_product(billing_sandbox)
    [call] = billing_sandbox.requests("create_product")
    assert call["status"] == 200
    product.refresh_from_db()
    assert product.sync_state == "synced"


@pytest.mark.django_db(transaction=True)
def test_deliveries_over_http_to_a_live_server(
    billing_sandbox, live_server, billing_inline, client, django_user_model
):
    """The docs' second way: the sandbox's delivery thread POSTs to a live server."""
    from billing_integration.models import Payment

    billing_sandbox.set_callback(live_server.url + "/billing/webhooks/")
    product = make_product(billing_sandbox)
    client.force_login(django_user_model.objects.create_user("ada", password="pw"))
    response = client.post(
        "/billing/checkout/", {"product": product.pk, "cycle": "months-1", "currency": "XOF"}
    )
    session_id = response["Location"].rsplit("/", 1)[-1]
    billing_sandbox.complete_checkout(session_id, phone="0700000001")
    assert billing_sandbox.wait_for_deliveries(5)
    deliveries = billing_sandbox.deliveries()
    assert [d["event_type"] for d in deliveries] == ["payment.completed", "invoice.paid"]
    assert [d["status"] for d in deliveries] == ["delivered", "delivered"]
    assert deliveries[0]["log"][0]["status_code"] == 200
    assert deliveries[0]["event"]["id"] == deliveries[0]["event_id"]
    assert Payment.objects.get().status == "completed"
