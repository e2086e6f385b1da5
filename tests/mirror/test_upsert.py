"""The pull's upsert through the ORM: what it counts, what it keeps, and its query count."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing_integration.models import Customer, OutboxEntry, Product, Subscription
from billing_integration.sync.pull import upsert_customers, upsert_products, upsert_subscriptions

pytestmark = pytest.mark.django_db


def _customer(i: int, **more):
    return {
        "id": str(uuid.UUID(int=i + 1)),
        "identifier": f"c-{i}",
        "first_name": "First",
        "last_name": str(i),
        "email": f"c{i}@example.com",
        "status": "published",
        **more,
    }


def _ts(when):
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_upsert_creates_updates_and_counts():
    first = upsert_customers([_customer(i) for i in range(3)])
    assert (first.created, first.updated, first.unchanged) == (3, 0, 0)
    again = upsert_customers([_customer(0, first_name="Renamed"), _customer(1), _customer(2)])
    assert (again.created, again.updated, again.unchanged) == (0, 1, 2)
    renamed = Customer.objects.get(identifier="c-0")
    assert renamed.first_name == "Renamed" and renamed.sync_state == "synced"
    assert renamed.remote_id == uuid.UUID(int=1) and renamed.last_synced_at is not None
    assert OutboxEntry.objects.count() == 0, "pulled rows are never pushed back"


def test_a_bad_row_is_counted_and_the_rest_applied():
    counts = upsert_customers([_customer(0), _customer(1, date_created="not a date")])
    assert (counts.created, counts.errors) == (1, 1)
    assert str(uuid.UUID(int=2)) in counts.error_messages[0]
    assert list(Customer.objects.values_list("identifier", flat=True)) == ["c-0"]


def _product(i: int, **more):
    return {
        "id": str(uuid.UUID(int=i + 1)),
        "name": f"P{i}",
        "status": "published",
        "selected_currencies": ["1"],
        "subscription_blueprint": None,
        "prices": [{"currency": 1, "amount": 2500}],
        **more,
    }


@pytest.mark.parametrize(
    "bad",
    [
        {"prices": [{"currency": "abc", "amount": 5}]},
        {"prices": [{"currency": 1, "amount": "ten"}]},
        {"prices": [{"currency": 1, "amount": 10**40}]},
        {"prices": [{"currency": 10**30, "amount": 5}]},
        {"prices": {"currency": 1}},
        {"selected_currencies": "XOF"},
        {"selected_currencies": ["ZZZ"]},
        {"name": {"en": "Plan"}},
        {"name": "n" * 300},
    ],
)
def test_a_product_row_that_cannot_be_stored_is_counted_and_the_rest_applied(bad):
    counts = upsert_products([_product(0), _product(1, **bad)])
    assert (counts.created, counts.errors) == (1, 1)
    assert str(uuid.UUID(int=2)) in counts.error_messages[0]
    assert list(Product.objects.values_list("name", flat=True)) == ["P0"]
    assert Product.objects.get().root_prices.count() == 1


@pytest.mark.parametrize(
    "bad", [{"identifier": {"a": 1}}, {"identifier": ["a"]}, {"identifier": "i" * 300}]
)
def test_a_customer_row_that_cannot_be_stored_is_counted_and_the_rest_applied(bad):
    counts = upsert_customers([_customer(0), _customer(1, **bad)])
    assert (counts.created, counts.errors) == (1, 1)
    assert list(Customer.objects.values_list("identifier", flat=True)) == ["c-0"]


def test_a_number_where_text_is_expected_is_stored_as_its_text():
    """Tolerant where the interface is silent: a phone (or a name) sent as a JSON number."""
    counts = upsert_customers([_customer(0, phone=221770000001)])
    assert (counts.created, counts.errors) == (1, 0)
    assert Customer.objects.get().phone == "221770000001"
    assert upsert_products([_product(0, name=2025)]).errors == 0
    assert Product.objects.get().name == "2025"


def test_local_changes_pending_are_kept():
    upsert_customers([_customer(0)])
    Customer.objects.update(first_name="Local", sync_state="pending")
    counts = upsert_customers([_customer(0, first_name="Remote")])
    assert counts.skipped == 1 and counts.updated == 0
    assert Customer.objects.get().first_name == "Local"


def test_an_unlinked_local_row_is_adopted():
    local = Customer.objects.create(identifier="c-0", first_name="Here", sync_state="failed")
    counts = upsert_customers([_customer(0)])
    assert counts.created == 0 and Customer.objects.count() == 1
    local.refresh_from_db()
    assert local.remote_id == uuid.UUID(int=1) and local.sync_state == "synced"


def test_a_subscription_version_never_goes_back():
    now = timezone.now()
    row = {"id": str(uuid.uuid4()), "status": "published", "date_created": _ts(now)}
    upsert_subscriptions([{**row, "date_updated": _ts(now)}])
    older = upsert_subscriptions(
        [{**row, "status": "cancelled", "date_updated": _ts(now - timedelta(seconds=5))}]
    )
    assert older.stale == 1
    sub = Subscription.objects.get()
    assert sub.status == "published" and sub.remote_updated is not None
    undated = upsert_subscriptions(
        [{**row, "status": "paused", "date_created": _ts(now + timedelta(seconds=1))}]
    )
    assert undated.updated == 1
    sub.refresh_from_db()
    assert sub.status == "paused" and sub.remote_updated is not None, "never nulled"
    # A version of our clock (an undated event's) never makes the service's row stale.
    Subscription.objects.update(remote_updated=now + timedelta(hours=1), remote_updated_ours=True)
    ours = upsert_subscriptions([{**row, "status": "published", "date_updated": _ts(now)}])
    assert ours.updated == 1 and ours.stale == 0
    sub.refresh_from_db()
    assert sub.status == "published" and not sub.remote_updated_ours


@pytest.mark.parametrize("existing", [False, True])
def test_the_query_count_does_not_grow_with_the_page(existing):
    def run(n: int, offset: int) -> int:
        rows = [_customer(offset + i) for i in range(n)]
        if existing:
            upsert_customers(rows)
            rows = [{**r, "first_name": "Changed"} for r in rows]
        with CaptureQueriesContext(connection) as queries:
            counts = upsert_customers(rows)
        assert counts.created + counts.updated == n
        return len(queries.captured_queries)

    # (SQLite splits a statement past 999 parameters: 40 rows stay within one.)
    assert run(2, 0) == run(40, 100)


def test_a_row_written_here_after_the_read_takes_only_a_newer_version():
    """A page read before an event (or a push's answer, another pull) wrote a row here: the
    row is not written over when the versions tie (only ``date_created``) or the stored one
    is of our clock; a strictly newer ``date_updated`` still applies, and the page still fills
    in the rows not written since its read."""
    now = timezone.now()
    created = _ts(now - timedelta(days=1))
    rows = [
        {"id": str(uuid.UUID(int=i + 1)), "status": "published", "date_created": created}
        for i in range(2)
    ]
    assert upsert_subscriptions(rows).created == 2
    read_at = timezone.now()  # the page below is read now, then an event cancels the first
    touched = Subscription.objects.get(remote_id=uuid.UUID(int=1))
    touched.status, touched.remote_updated = "canceled", touched.remote_created
    touched.save()
    page = [{**row, "status": "paused"} for row in rows]
    counts = upsert_subscriptions(page, read_at=read_at)
    assert (counts.updated, counts.stale) == (1, 1)
    statuses = dict(Subscription.objects.values_list("remote_id", "status"))
    assert statuses == {uuid.UUID(int=1): "canceled", uuid.UUID(int=2): "paused"}
    # A version of our clock (an undated event's) orders nothing, even an earlier one.
    Subscription.objects.filter(pk=touched.pk).update(
        remote_updated=now - timedelta(hours=1), remote_updated_ours=True
    )
    dated = {**page[0], "date_updated": _ts(now)}
    assert upsert_subscriptions([dated], read_at=read_at).stale == 1
    assert Subscription.objects.get(pk=touched.pk).status == "canceled"
    # The service's newer version applies, even read before the row was written here.
    Subscription.objects.filter(pk=touched.pk).update(remote_updated_ours=False)
    assert upsert_subscriptions([dated], read_at=read_at).updated == 1
    assert Subscription.objects.get(pk=touched.pk).status == "paused"
