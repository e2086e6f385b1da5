"""The reliability suite at CI size (benchmarks/reliability.py runs the full size), and its
comparison of the mirror with the service, which must see a lost price change."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from decimal import Decimal
from pathlib import Path

import pytest
import requests
from django.db import transaction

from benchmarks._stack import RabbitMQ, rabbitmq_url
from benchmarks.reliability import compare_with_remote
from billing_integration.models import BillingCycle, Customer, OutboxEntry, Price, Product
from billing_integration.outbox.push import push_entry

ROOT = Path(__file__).resolve().parents[2]


#: The CI size of the suite (benchmarks/RESULTS.md records the full size).
CI_SIZE = [
    "--changes",
    "100",
    "--outage",
    "10",
    "--broker-stop",
    "3",
    "--rate-limit",
    "2",
    "--rate-limit-seconds",
    "3",
    "--workers",
    "2",
    "--drain-timeout",
    "240",
]


def run_suite(*args: str) -> str:
    """Run benchmarks/reliability.py at CI size; assert it passed; return what it printed."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [sys.executable, "benchmarks/reliability.py", *CI_SIZE, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    assert "changes lost: 0" in out
    assert "duplicate remote objects: 0" in out
    assert "objects whose remote state differs from local: 0" in out
    assert "rate-limit phase: " in out
    return out


def broker_connections_lost(out: str) -> int:
    match = re.search(r"worker connections to the broker lost \(worker logs\): (\d+)", out)
    assert match, out[-3000:]
    return int(match.group(1))


@pytest.mark.slow
@pytest.mark.redis
def test_reliability_ci_size():
    out = run_suite()
    assert "broker: redis://" in out
    assert "broker accepting connections again" in out, out[-3000:]


@pytest.mark.slow
@pytest.mark.rabbitmq
def test_reliability_ci_size_on_rabbitmq():
    """The same run on RabbitMQ, the server restarted mid-run (``rabbitmqctl stop``, then
    ``rabbitmq-server -detached``): the workers lost their connection and came back."""
    try:
        out = run_suite("--broker", "rabbitmq")
    finally:  # the script starts it again itself, unless it was killed (the timeout)
        RabbitMQ(rabbitmq_url(), "/").ensure_running()
    assert "broker: amqp://" in out
    assert "broker accepting connections again" in out, out[-3000:]
    assert broker_connections_lost(out) >= 1, out[-3000:]


def push_all() -> None:
    for pk in OutboxEntry.objects.open().values_list("pk", flat=True):
        assert push_entry(pk).status == "done"


def drop_unpushed_changes() -> int:
    """Lose the changes not pushed yet, as a faulty outbox would."""
    return OutboxEntry.objects.open().update(state="done")


@pytest.fixture
def pushed_mirror(billing_sandbox):
    """A subscription product (two currencies, two cycles), a one-time product and a
    customer, all pushed: the comparison finds no difference."""
    with transaction.atomic():
        plan = Product.objects.create(name="Plan", description="d", selected_currencies=[1, 2])
        monthly = BillingCycle.objects.create(product=plan, unit="months", frequency=1)
        Price.objects.create(cycle=monthly, currency_id=1, amount=Decimal("5000"))
        Price.objects.create(cycle=monthly, currency_id=2, amount=Decimal("9.50"))
        yearly = BillingCycle.objects.create(product=plan, unit="years", frequency=1)
        Price.objects.create(cycle=yearly, currency_id=1, amount=Decimal("50000"))
        once = Product.objects.create(
            name="Setup", selected_currencies=[1], product_type="one_time"
        )
        Price.objects.create(product=once, currency_id=1, amount=Decimal("700"))
        Customer.objects.create(identifier="c-1", first_name="A", last_name="B", email="a@b.c")
    push_all()
    clean = compare_with_remote(billing_sandbox)
    assert (clean.lost, clean.mismatched) == (0, [])
    assert (clean.products, clean.customers, clean.prices) == (2, 1, 4)
    return plan


@pytest.mark.django_db(transaction=True)
def test_the_comparison_sees_a_lost_price_change(billing_sandbox, pushed_mirror):
    price = Price.objects.get(cycle__product=pushed_mirror, cycle__unit="months", currency_id=2)
    price.amount = Decimal("12.25")
    price.save()
    assert drop_unpushed_changes() == 1
    result = compare_with_remote(billing_sandbox)
    assert result.lost == 0
    assert [(obj, name) for obj, name, _, _ in result.mismatched] == [
        (f"product {pushed_mirror.pk}", "cycles")
    ]
    _, _, local, remote = result.mismatched[0]
    assert local["months-1"][2] == Decimal("12.25") and remote["months-1"][2] == Decimal("9.5")
    assert local["years-1"] == remote["years-1"]


@pytest.mark.django_db(transaction=True)
def test_the_comparison_sees_a_price_changed_behind_the_apps_back(billing_sandbox, pushed_mirror):
    """A price the service holds that the mirror does not (here: changed by another client)."""
    pushed_mirror.refresh_from_db()
    blueprint = {
        "billing_type": "flat-rate",
        "billing_cycles": [
            {
                "cycle": "months",
                "frequency": 1,
                "prices": [{"currency": 1, "amount": 5000}, {"currency": 2, "amount": 9.5}],
            },
            {"cycle": "years", "frequency": 1, "prices": [{"currency": 1, "amount": 45000}]},
        ],
    }
    response = requests.patch(
        f"{billing_sandbox.api_url}/products/{pushed_mirror.remote_id}",
        json={"subscription_blueprint": blueprint},
        headers={"x-kc-token": billing_sandbox.token(), "x-idempotency-id": str(uuid.uuid4())},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    result = compare_with_remote(billing_sandbox)
    assert [(obj, name) for obj, name, _, _ in result.mismatched] == [
        (f"product {pushed_mirror.pk}", "cycles")
    ]
    _, _, local, remote = result.mismatched[0]
    assert (local["years-1"], remote["years-1"]) == ({1: Decimal("50000")}, {1: Decimal("45000")})
