"""The outbox's lookups of an object's open entries go through the partial index of open
entries (``billing_outbox_open``), so they cost the same however many done entries the table
keeps (PostgreSQL's plans, on a table of 5,000 done entries with fresh statistics)."""

from __future__ import annotations

import pytest
from billing_integration.models.bulk import insert_rows
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing_integration.models import Customer, OutboxEntry
from billing_integration.outbox.push import push_entries

from .test_batch import customers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]

TABLE = OutboxEntry._meta.db_table


def plan(sql: str, params: tuple = ()) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.fixture
def history() -> None:
    """5,000 done entries of customers, and the planner's statistics of them."""
    ct = ContentType.objects.get_for_model(Customer)
    insert_rows(
        OutboxEntry,
        [
            {"content_type_id": ct.pk, "object_id": 100_000 + i, "state": "done"}
            for i in range(5000)
        ],
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {TABLE}")


def test_a_push_asks_for_open_entries_through_the_index_of_open_entries(history, billing_sandbox):
    customers(20, "idx")
    ids = list(OutboxEntry.objects.filter(state="pending").values_list("pk", flat=True))
    with CaptureQueriesContext(connection) as queries:
        results = push_entries(ids)
    assert {r.status for r in results} == {"done"}
    lookups = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith(f'SELECT "{TABLE}"."content_type_id"')
        and '"object_id" IN (' in q["sql"]
    ]
    # Who comes first (the claim) and what is still open (the record).
    assert len(lookups) == 2, lookups
    for sql in lookups:
        assert "billing_outbox_open" in plan(sql), plan(sql)


def test_the_due_heads_look_for_older_open_entries_through_the_index(history):
    customers(5, "heads")
    sql, params = OutboxEntry.objects.due(lease=300).heads().values("pk").query.sql_with_params()
    assert "billing_outbox_open" in plan(sql, params), plan(sql, params)
