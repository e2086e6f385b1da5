"""Fixtures of the checkout tests: a pushed, published product in the sandbox, logged-in users.

Pushes happen through ``transaction.on_commit`` -> Celery; like the mirror tests
(``tests/mirror/conftest.py``), enqueued pushes are recorded instead of sent to a broker, and
the tests push what they need synchronously (``push_entry``), or let the checkout view do
it (``ensure_customer_pushed``).
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from billing_integration.models import BillingCycle, OutboxEntry, Price, Product
from billing_integration.outbox.push import PushOutcome, push_entry

PASSWORD = "pw-for-tests"


@pytest.fixture(autouse=True)
def recorded_enqueues(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Enqueued pushes are recorded, not sent to a broker (no worker in these tests)."""
    from billing_integration.outbox import tasks

    calls: list[int] = []
    monkeypatch.setattr(tasks, "enqueue", lambda pk, countdown=None: calls.append(pk) or True)
    return calls


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    """Keep the client's background retries short (a person waiting has a deadline too)."""
    from billing_integration.client import retry

    monkeypatch.setattr(retry, "MAX_RETRIES", 1)
    monkeypatch.setattr(retry, "BACKOFF_BASE", 0.01)
    monkeypatch.setattr(retry, "RETRY_AFTER_MAX", 0.2)


def push_open_entries() -> None:
    for pk in list(OutboxEntry.objects.open().values_list("pk", flat=True)):
        assert push_entry(pk).status == PushOutcome.DONE


def make_product(
    name: str = "Pro plan",
    *,
    status: str = "published",
    one_time: bool = False,
    push: bool = True,
) -> Product:
    """A product with a monthly (XOF 10000, USD 19.99) and a yearly (XOF only) cycle,
    pushed to the sandbox."""
    with transaction.atomic():
        product = Product.objects.create(
            name=name,
            description="All features",
            status=status,
            selected_currencies=[1, 2],
            product_type="one_time" if one_time else "subscription",
        )
        if one_time:
            Price.objects.create(product=product, currency_id=1, amount=Decimal("5000"))
        else:
            monthly = BillingCycle.objects.create(product=product, unit="months", frequency=1)
            Price.objects.create(cycle=monthly, currency_id=1, amount=Decimal("10000"))
            Price.objects.create(cycle=monthly, currency_id=2, amount=Decimal("19.99"))
            yearly = BillingCycle.objects.create(product=product, unit="years", frequency=1)
            Price.objects.create(cycle=yearly, currency_id=1, amount=Decimal("100000"))
    if push:
        push_open_entries()
        product.refresh_from_db()
        assert product.remote_id is not None
    return product


@pytest.fixture
def product(billing_sandbox, transactional_db) -> Product:
    return make_product()


@pytest.fixture
def user(transactional_db):
    return get_user_model().objects.create_user(
        "alice",
        email="alice@example.com",
        password=PASSWORD,
        first_name="Alice",
        last_name="Doe",
    )


@pytest.fixture
def other_user(transactional_db):
    return get_user_model().objects.create_user("bob", email="bob@example.com", password=PASSWORD)


@pytest.fixture
def logged_in(client, user):
    client.force_login(user)
    return client


def use_database_cache(settings) -> None:
    """``BILLING['CACHE']`` a database cache (the demo's), empty, its table made, whatever
    ``CACHE_URL`` the run has (Redis under CI): its writes go in the caller's transaction."""
    from django.core.cache import caches
    from django.core.management import call_command

    table = "billing_test_cache"
    indb = {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": table}
    settings.CACHES = {**settings.CACHES, "indb": indb}
    settings.BILLING = {**settings.BILLING, "CACHE": "indb"}
    call_command("createcachetable", table, verbosity=0)
    caches["indb"].clear()  # a transactional test's flush leaves this table alone


def first_save_fails(monkeypatch, settings, model, *, cache: str = "outside") -> list[int]:
    """The next ``model.save()`` raises ``DatabaseError`` (the list returned holds one item
    once it has), with ``BILLING['CACHE']`` outside the database, as Redis is, or (``cache=
    "database"``) a database cache, whose writes go in the same transaction."""
    from django.db import DatabaseError

    assert cache in ("outside", "database")
    if cache == "outside":
        locmem = "django.core.cache.backends.locmem.LocMemCache"
        outside = {"BACKEND": locmem, "LOCATION": "outside"}
        settings.CACHES = {**settings.CACHES, "outside": outside}
        settings.BILLING = {**settings.BILLING, "CACHE": "outside"}
    else:
        use_database_cache(settings)
    real_save = model.save
    failed: list[int] = []

    def save(self, *args, **kwargs):
        if not failed:
            failed.append(1)
            raise DatabaseError("the database went away")
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(model, "save", save)
    return failed
