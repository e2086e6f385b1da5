"""Pushes never stall on a process-local cache: through ``LocMemCache`` (or ``DummyCache``)
every wake-up is sent, because a worker's drain can never clear a flag set in the web
process's own memory (``billing_integration.wakeup``)."""

from __future__ import annotations

from decimal import Decimal
from unittest import mock

import pytest
from django.db import transaction

from billing_integration import wakeup
from billing_integration.models import BillingCycle, Price, Product
from billing_integration.outbox import tasks
from billing_integration.outbox.tasks import enqueue as real_enqueue  # before conftest patches it
from billing_integration.outbox.tasks import push_pending

from .conftest import wait_for

LOCMEM = "django.core.cache.backends.locmem.LocMemCache"


def new_product(name: str) -> Product:
    with transaction.atomic():
        product = Product.objects.create(name=name, selected_currencies=[1])
        cycle = BillingCycle.objects.create(product=product, unit="months", frequency=1)
        Price.objects.create(cycle=cycle, currency_id=1, amount=Decimal("5000"))
    return product


@pytest.mark.django_db(transaction=True)
def test_every_save_sends_its_wakeup_through_a_locmem_cache(settings, monkeypatch):
    settings.CACHES = {**settings.CACHES, "kicks": {"BACKEND": LOCMEM, "LOCATION": "kicks"}}
    settings.BILLING = {**settings.BILLING, "KICK_CACHE": "kicks"}
    monkeypatch.setattr(tasks, "enqueue", real_enqueue)
    with mock.patch.object(push_pending, "apply_async") as apply_async:
        new_product("A")
        new_product("B")
    assert apply_async.call_count == 2
    assert not wakeup.pending_locally(tasks.wakeup_name())


@pytest.mark.django_db(transaction=True)
def test_a_shared_cache_still_coalesces(monkeypatch):
    # The database cache of the example project: one message for both saves.
    monkeypatch.setattr(tasks, "enqueue", real_enqueue)
    wakeup.clear(tasks.wakeup_name())
    with mock.patch.object(push_pending, "apply_async") as apply_async:
        new_product("A")
        new_product("B")
    wakeup.clear(tasks.wakeup_name())
    assert apply_async.call_count == 1


@pytest.mark.worker
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_with_locmem_caches_a_later_save_reaches_the_service_without_beat(
    celery_worker_process, billing_sandbox, settings, monkeypatch
):
    # Web (this process) and worker each have their own LocMemCache; no beat runs.
    monkeypatch.setenv("CACHE_URL", "locmemcache://")
    settings.CACHES = {"default": {"BACKEND": LOCMEM, "LOCATION": "web-process"}}
    worker = celery_worker_process()
    first = new_product("First")
    wait_for(lambda: Product.objects.filter(pk=first.pk, remote_id__isnull=False).exists())
    # The drain that pushed it has returned: nothing but a new message can push the next one.
    wait_for(lambda: "push_pending[" in worker.output() and " succeeded in " in worker.output())
    second = new_product("Second")
    wait_for(
        lambda: Product.objects.filter(pk=second.pk, remote_id__isnull=False).exists(),
        timeout=30,
    )
    assert [r["body"]["name"] for r in billing_sandbox.requests(operation="create_product")] == [
        "First",
        "Second",
    ]
