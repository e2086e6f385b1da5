"""``billing_sync --push``: every open outbox entry pushed now, without a worker, and said so."""

from __future__ import annotations

import io
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.db import transaction

from billing_integration.models import BillingCycle, OutboxEntry, Price, Product
from billing_integration.outbox import push

pytestmark = pytest.mark.django_db(transaction=True)


def make_product(name: str) -> Product:
    with transaction.atomic():
        product = Product.objects.create(name=name, selected_currencies=[1])
        cycle = BillingCycle.objects.create(product=product, unit="months", frequency=1)
        Price.objects.create(cycle=cycle, currency_id=1, amount=Decimal("10000"))
    return product


def sync(*args: str) -> str:
    out = io.StringIO()
    call_command("billing_sync", *args, "--no-progress", stdout=out)
    return out.getvalue()


def test_push_sends_a_fresh_entry(billing_sandbox):
    product = make_product("Fresh plan")
    output = sync("--push")

    [call] = billing_sandbox.requests("create_product")
    assert call["status"] == 200 and call["body"]["name"] == "Fresh plan"
    product.refresh_from_db()
    assert product.sync_state == "synced" and product.remote_id is not None
    assert f"create product {product.pk} “Fresh plan”: pushed" in output
    assert "outbox: 1 open entries pushed now: 1 pushed" in output
    assert billing_sandbox.requests("list_products") == [], "--push alone pulls nothing"


def test_push_ignores_the_retry_time_and_reports_errors(billing_sandbox, settings, monkeypatch):
    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    monkeypatch.setattr(push, "RETRY_BASE", 3600.0)
    make_product("Plan")
    billing_sandbox.faults(operation="create_product", status=503, count=1)

    first = sync("--push")
    assert "to retry later (BillingServerError" in first
    entry = OutboxEntry.objects.get()
    assert entry.state == "pending" and entry.next_attempt_at is not None  # an hour away

    second = sync("--push")
    assert "1 pushed" in second
    calls = billing_sandbox.requests("create_product")
    assert [c["status"] for c in calls] == [503, 200]
    assert calls[0]["headers"]["x-idempotency-id"] == calls[1]["headers"]["x-idempotency-id"]
    assert OutboxEntry.objects.get().state == "done"


def test_push_with_nothing_open():
    assert "outbox: 0 open entries pushed now: nothing open" in sync("--push")


def test_push_prints_no_escape_sequence_from_a_name(billing_sandbox):
    make_product("Evil\x1b[2J\x1b]0;owned\x07 plan")
    output = sync("--push")
    assert "“Evil?[2J?]0;owned? plan”: pushed" in output
    assert "\x1b" not in output and "\x07" not in output
