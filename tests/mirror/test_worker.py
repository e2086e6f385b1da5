"""A real Celery worker process pushing to the sandbox (Redis broker when CELERY_BROKER_URL is
set, else the filesystem transport; PostgreSQL or a file SQLite test database)."""

from __future__ import annotations

import signal
import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from billing_integration.customers import get_or_create_customer
from billing_integration.models import (
    BillingCycle,
    OutboxEntry,
    Price,
    Product,
    Subscription,
)
from billing_integration.models.outbox import LEASE
from billing_integration.outbox.tasks import sweep_outbox
from billing_integration.sync.pull import pull_subscriptions

from .conftest import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def all_done(timeout: float = 60) -> None:
    wait_for(lambda: not OutboxEntry.objects.exclude(state="done").exists(), timeout=timeout)


def new_product() -> Product:
    with transaction.atomic():
        product = Product.objects.create(name="Team plan", selected_currencies=[1])
        cycle = BillingCycle.objects.create(product=product, unit="months", frequency=1)
        Price.objects.create(cycle=cycle, currency_id=1, amount=Decimal("7500"))
    return product


def test_worker_pushes_product_lifecycle_customer_and_subscription(
    celery_worker_process, billing_sandbox
):
    worker = celery_worker_process()
    product = new_product()
    all_done()
    product.refresh_from_db()
    assert product.remote_id is not None, worker.output()[-3000:]

    product.name = "Team plan 2"
    product.save()
    all_done()
    product.publish()
    all_done()
    remote = billing_sandbox.object("product", str(product.remote_id))
    assert (remote["name"], remote["status"]) == ("Team plan 2", "published")

    user = get_user_model().objects.create(username="w", first_name="W", email="w@example.com")
    customer, _ = get_or_create_customer(user)
    all_done()
    customer.refresh_from_db()
    assert customer.remote_id is not None

    sub = Subscription.objects.create(
        product=product,
        customer=customer,
        selected_currency="XOF",
        selected_billing_cycle="months-1",
    )
    all_done()
    sub.refresh_from_db()
    assert sub.remote_id is not None and sub.status == "published"
    # Read it back from the service.
    counts = pull_subscriptions()
    assert counts.unchanged + counts.updated == 1 and counts.created == 0
    assert Subscription.objects.for_subscriber(user).active().get() == sub

    product.archive()  # existing subscriptions are kept
    all_done()
    assert billing_sandbox.object("product", str(product.remote_id))["status"] == "archived"

    keys = [
        r["headers"]["x-idempotency-id"]
        for r in billing_sandbox.requests()
        if r["method"] in ("POST", "PATCH") and r["operation"] != "token"
    ]
    # product: create, rename, publish, archive; customer: create; subscription: create
    assert len(keys) == len(set(keys)) == 6
    assert len(billing_sandbox.requests(operation="create_subscription")) == 1
    assert len(billing_sandbox.objects("customer")) == 1


def test_rollback_sends_nothing_through_the_worker(celery_worker_process, billing_sandbox):
    celery_worker_process()
    with pytest.raises(RuntimeError), transaction.atomic():
        new_product()
        raise RuntimeError("rolled back")
    marker = new_product()  # a committed change after it: once it is pushed, the queue is empty
    all_done()
    marker.refresh_from_db()
    creates = billing_sandbox.requests(operation="create_product")
    assert len(creates) == 1 and creates[0]["body"]["name"] == "Team plan"
    assert OutboxEntry.objects.count() == 1


@pytest.fixture
def held_product_creation(billing_sandbox_server, monkeypatch):
    """The sandbox holds the next ``create_product`` request until ``release`` is set, then
    commits it and answers (to whoever is still listening). ``received`` is set when the
    request has arrived. An event, not a latency the test must act within."""
    app = billing_sandbox_server.app
    real_handle = app._handle
    received, release = threading.Event(), threading.Event()
    held: list[str] = []

    def handle(request, op, *args, **kwargs):
        if op == "create_product" and not held:
            held.append(op)
            received.set()
            release.wait(timeout=120)
        return real_handle(request, op, *args, **kwargs)

    monkeypatch.setattr(app, "_handle", handle)
    yield received, release
    release.set()  # never leave a request thread of the shared sandbox waiting


def test_redelivery_after_a_killed_worker_sends_the_same_key_once_created(
    celery_worker_process, billing_sandbox, held_product_creation
):
    received, release = held_product_creation
    # The service commits the create, then the answer is lost: the worker was killed while
    # the sandbox held its request.
    worker = celery_worker_process()
    product = new_product()
    entry = OutboxEntry.objects.get()
    assert received.wait(timeout=60), worker.output()[-3000:]
    worker.stop(signal.SIGKILL)
    release.set()
    wait_for(lambda: billing_sandbox.objects("product"), timeout=30)  # created remotely
    entry.refresh_from_db()
    assert entry.state == "in_progress"
    product.refresh_from_db()
    assert product.remote_id is None  # the answer never arrived

    # Once the killed worker's lease expires, the periodic safety net re-enqueues the entry.
    OutboxEntry.objects.filter(pk=entry.pk).update(
        started_at=timezone.now() - timedelta(seconds=LEASE + 1)
    )
    celery_worker_process()
    wait_for(lambda: sweep_outbox() == 1, timeout=60, interval=0.2)
    all_done()
    calls = billing_sandbox.requests(operation="create_product")
    assert len(calls) == 2
    assert {c["headers"]["x-idempotency-id"] for c in calls} == {str(entry.idempotency_key)}
    remote = billing_sandbox.objects("product")
    assert len(remote) == 1
    product.refresh_from_db()
    assert str(product.remote_id) == remote[0]["id"]


def worker_sessions() -> set[int]:
    """The PostgreSQL sessions on the test database other than this process's own."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        return {pid for (pid,) in cursor.fetchall()}


def test_worker_keeps_its_connection_between_tasks_and_replaces_a_broken_one(
    celery_worker_process,
):
    """The example project keeps a worker's connection between tasks (CONN_MAX_AGE,
    CELERY_DB_REUSE_MAX) and closes a broken one before the next task (example_project/celery.py):
    pushes reuse one session, and a session killed between tasks costs no push."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("sessions are counted on PostgreSQL")
    celery_worker_process()
    product = new_product()
    all_done()
    first = worker_sessions()
    assert first, "the worker kept no connection after its task"
    for n in range(3):
        product.name = f"Team plan {n}"
        product.save()
        all_done()
    assert worker_sessions() == first  # the same session: no connection opened per task

    with connection.cursor() as cursor:
        for pid in first:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    wait_for(lambda: not (worker_sessions() & first), timeout=10)
    product.name = "After the restart"
    product.save()
    all_done()  # the next task opened a new connection instead of failing on the dead one
    assert worker_sessions() and not (worker_sessions() & first)
