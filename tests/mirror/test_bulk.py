"""``models.bulk``: rows written by ``update_rows``, ``insert_rows`` and
``insert_ignoring_conflict`` read back exactly as the ORM would have written them, on SQLite
and on PostgreSQL (jsonb_to_recordset, COPY, ON CONFLICT)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal
from unittest import mock

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing_integration.models import Customer, Price, Product, Subscription, bulk
from billing_integration.models.bulk import insert_ignoring_conflict, insert_rows, update_rows
from billing_integration.outbox import from_remote

pytestmark = pytest.mark.django_db


def test_update_rows_writes_each_rows_own_values_of_every_type():
    with from_remote():
        customers = [
            Customer.objects.create(identifier=f"u-{i}", first_name="A", email=f"{i}@x.io")
            for i in range(3)
        ]
    when = timezone.now() - timedelta(days=3, microseconds=7)
    for i, customer in enumerate(customers):
        customer.remote_id = uuid.uuid4()
        customer.remote_created = when + timedelta(hours=i)
        customer.remote_data = {"id": str(customer.remote_id), "n": i, "tags": ["a", "é\"'\\"]}
        customer.first_name = f'O\'Brien "{i}"'
        customer.phone = None if i == 0 else f"+225 0{i}"
    customers[2].remote_data = None
    with CaptureQueriesContext(connection) as queries:
        assert (
            update_rows(
                customers, ["remote_id", "remote_created", "remote_data", "first_name", "phone"]
            )
            == 3
        )
    assert len(queries) == 1  # one statement (PostgreSQL) or one executemany
    for i, customer in enumerate(customers):
        stored = Customer.objects.get(pk=customer.pk)
        assert stored.remote_id == customer.remote_id
        assert stored.remote_created == when + timedelta(hours=i)
        assert stored.remote_data == customer.remote_data
        assert stored.first_name == f'O\'Brien "{i}"'
        assert stored.phone == customer.phone
        assert stored.last_name == "" and stored.identifier == f"u-{i}"  # untouched


def test_update_rows_leaves_other_rows_alone():
    with from_remote():
        a, b = (Customer.objects.create(identifier=i, first_name="A") for i in "ab")
    a.first_name = "Changed"
    update_rows([a], ["first_name"])
    assert Customer.objects.get(pk=b.pk).first_name == "A"
    assert Customer.objects.get(pk=a.pk).first_name == "Changed"


@pytest.mark.postgresql
def test_update_rows_finds_its_rows_through_the_primary_key_not_a_table_scan():
    # On PostgreSQL the planner hash-joins the recordset to a scan of the whole table unless
    # the statement names the keys (the cost of one batch would grow with the table).
    insert_rows(Customer, [{"identifier": f"t-{i}", "first_name": "A"} for i in range(5000)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE billing_integration_customer")
    batch = list(Customer.objects.order_by("pk")[:100])
    for customer in batch:
        customer.first_name = "B"
    with CaptureQueriesContext(connection) as queries:
        update_rows(batch, ["first_name"])
    (update,) = queries.captured_queries
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + update["sql"])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Seq Scan on billing_integration_customer" not in plan, plan
    assert "billing_integration_customer_pkey" in plan, plan
    assert Customer.objects.filter(first_name="B").count() == 100


def test_insert_rows_fills_defaults_and_converts_values():
    with from_remote():
        product = Product.objects.create(name="P", selected_currencies=[1])
    remote_id = uuid.uuid4()
    when = timezone.now().replace(microsecond=123456)
    with from_remote():
        assert (
            insert_rows(
                Subscription,
                [
                    {
                        "remote_id": remote_id,
                        "product_id": product.pk,
                        "status": "active",
                        "cycle_start_date": when,
                        "remote_data": {"id": str(remote_id), "x": [1, "ü"]},
                        "sync_state": "synced",
                    },
                    {"remote_id": uuid.uuid4(), "product": product.pk, "auto_renew": False},
                ],
            )
            == 2
        )
    first = Subscription.objects.get(remote_id=remote_id)
    assert first.product == product and first.status == "active"
    assert first.cycle_start_date == when
    assert first.remote_data == {"id": str(remote_id), "x": [1, "ü"]}
    assert first.created_at is not None and first.updated_at is not None
    assert first.auto_renew is True and first.customer_id is None  # defaults
    second = Subscription.objects.exclude(pk=first.pk).get()
    assert second.auto_renew is False and second.sync_state == "pending"
    with from_remote():
        insert_rows(
            Price, [{"product_id": product.pk, "currency_id": 1, "amount": Decimal("12.50")}]
        )
    assert Price.objects.get().amount == Decimal("12.50")


def test_insert_ignoring_conflict_inserts_once_and_reports_a_duplicate():
    """A new row: its primary key, every field as the ORM would store it, ``values`` completed
    with the computed defaults; the same conflict value again: None, nothing written."""
    remote_id = uuid.uuid4()
    values = {"remote_id": remote_id, "identifier": "u-1", "remote_data": {"a": ["é", 1]}}
    with CaptureQueriesContext(connection) as queries:
        pk = insert_ignoring_conflict(Customer, values, conflict="remote_id")
    assert pk is not None and [
        q["sql"].split()[0] for q in queries if "SAVEPOINT" not in q["sql"]
    ] == ["INSERT"]
    stored = Customer.objects.get(pk=pk)
    assert stored.remote_id == remote_id and stored.identifier == "u-1"
    assert stored.remote_data == {"a": ["é", 1]} and stored.first_name == ""
    assert stored.created_at is not None and values["created_at"] == stored.created_at
    assert values["updated_at"] == stored.updated_at
    again = {"remote_id": remote_id, "identifier": "u-2", "remote_data": None}
    assert insert_ignoring_conflict(Customer, again, conflict="remote_id") is None
    assert list(Customer.objects.values_list("identifier", flat=True)) == ["u-1"]


def test_insert_ignoring_conflict_builds_its_statement_once_per_set_of_keys():
    with mock.patch.dict(bulk._STATEMENTS, clear=True):
        with mock.patch.object(bulk, "_build_statement", wraps=bulk._build_statement) as build:
            for i in range(3):
                insert_ignoring_conflict(
                    Customer,
                    {"remote_id": uuid.uuid4(), "identifier": f"{i}"},
                    conflict="remote_id",
                )
            insert_ignoring_conflict(Customer, {"remote_id": uuid.uuid4()}, conflict="remote_id")
        assert build.call_count == 2
    assert Customer.objects.count() == 4


def test_insert_ignoring_conflict_names_unknown_fields():
    with mock.patch.dict(bulk._STATEMENTS, clear=True), pytest.raises(ValueError, match="nope"):
        insert_ignoring_conflict(Customer, {"nope": 1}, conflict="remote_id")


def test_insert_ignoring_conflict_leaves_the_callers_transaction_usable():
    """A failing insert inside a transaction runs in a savepoint: the transaction goes on."""
    remote_id = uuid.uuid4()
    with transaction.atomic():
        insert_ignoring_conflict(Customer, {"remote_id": remote_id}, conflict="remote_id")
        with pytest.raises(IntegrityError):
            insert_ignoring_conflict(Customer, {"identifier": None}, conflict="remote_id")
        assert Customer.objects.filter(remote_id=remote_id).exists()


def test_insert_ignoring_conflict_falls_back_to_save_elsewhere():
    """Backends without ``ON CONFLICT ... RETURNING``: ``save()``; a duplicate is None."""
    remote_id = uuid.uuid4()
    with (
        mock.patch.dict(bulk._STATEMENTS, clear=True),
        mock.patch.object(bulk, "_on_conflict_returning", return_value=False),
    ):
        values = {"remote_id": remote_id, "identifier": "f"}
        pk = insert_ignoring_conflict(Customer, values, conflict="remote_id")
        assert Customer.objects.get(pk=pk).identifier == "f"
        assert values["created_at"] == Customer.objects.get(pk=pk).created_at
        assert (
            insert_ignoring_conflict(Customer, {"remote_id": remote_id}, conflict="remote_id")
            is None
        )
    assert Customer.objects.count() == 1
