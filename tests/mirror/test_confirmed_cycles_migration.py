"""Migration 0026: an upgrade sells what it sold before. A pushed product whose last push was
answered has its cycles as they are now confirmed; one whose push waits or failed has the
blueprint of its last push the service acknowledged; products not pushed, and products pulled
from the service (their cycles are declared), have none recorded (null)."""

import uuid

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("billing_integration", "0025_notice_per_pulled_change")]
AFTER = [("billing_integration", "0026_confirmed_cycles")]


def blueprint(amount: int) -> dict:
    prices = [{"currency": 1, "amount": amount}]
    return {
        "billing_type": "flat-rate",
        "billing_cycles": [{"cycle": "months", "frequency": 1, "prices": prices}],
    }


def test_pushed_products_keep_selling_their_cycles():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    apps = executor.loader.project_state(BEFORE).apps
    Product = apps.get_model("billing_integration", "Product")
    BillingCycle = apps.get_model("billing_integration", "BillingCycle")
    Price = apps.get_model("billing_integration", "Price")
    OutboxEntry = apps.get_model("billing_integration", "OutboxEntry")
    ContentType = apps.get_model("contenttypes", "ContentType")
    product_type, _ = ContentType.objects.get_or_create(
        app_label="billing_integration", model="product"
    )

    def product(name, *, remote=True, state="synced", known=True, one_time=False):
        row = Product.objects.create(
            name=name,
            remote_id=uuid.uuid4() if remote else None,
            sync_state=state,
            blueprint_known=known,
            product_type="one_time" if one_time else "subscription",
        )
        if not one_time:
            for unit, amount in (("months", "10000"), ("years", "99.5")):
                cycle = BillingCycle.objects.create(product=row, unit=unit, frequency=1)
                Price.objects.create(cycle=cycle, currency_id=1, amount=amount)
        return row.pk

    def entry(pk, state, payload, last_error=""):
        OutboxEntry.objects.create(
            content_type=product_type,
            object_id=pk,
            operation="update",
            state=state,
            payload=payload,
            last_error=last_error,
        )

    synced = product("synced")
    waiting = product("waiting", state="pending")
    entry(waiting, "done", {"subscription_blueprint": blueprint(9000)})  # acknowledged
    entry(waiting, "done", {"subscription_blueprint": blueprint(1)}, "Not sent: reset")
    entry(waiting, "pending", None)
    refused = product("refused", state="failed")
    entry(refused, "failed", {"subscription_blueprint": blueprint(1)}, "HTTP 400")
    unpushed = product("unpushed", remote=False, state="pending")
    pulled = product("pulled", known=False)
    one_time = product("one-time", one_time=True)

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(AFTER)
    apps = executor.loader.project_state(AFTER).apps
    Product = apps.get_model("billing_integration", "Product")
    confirmed = dict(Product.objects.values_list("pk", "confirmed_cycles"))
    now = {"months-1": {"1": "10000.00"}, "years-1": {"1": "99.50"}}
    assert confirmed[synced] == now
    assert confirmed[waiting] == {"months-1": {"1": "9000.00"}}  # its last acknowledged push
    assert confirmed[refused] == now  # no acknowledged push kept: as it was sold before
    assert confirmed[unpushed] is confirmed[pulled] is confirmed[one_time] is None  # not recorded
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
