"""Pull / reconcile against the sandbox: bulk upserts, ownership, linking, query counts."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing_integration.models import Customer, OutboxEntry, Product, Subscription
from billing_integration.outbox.push import push_entry_now
from billing_integration.sync.pull import (
    pull_customers,
    pull_products,
    pull_subscriptions,
    upsert_subscription,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def small_pages(settings, billing_sandbox):
    settings.BILLING = {**settings.BILLING, "PAGE_SIZE": 10}
    from billing_integration.client import reset_client

    reset_client()
    return billing_sandbox


def test_pull_creates_then_reports_unchanged(small_pages):
    small_pages.seed(customers=25)
    first = pull_customers()
    assert (first.created, first.updated, first.unchanged) == (25, 0, 0)
    assert first.pages == 3
    assert Customer.objects.count() == 25
    c = Customer.objects.get(identifier="seed-3")
    assert (c.first_name, c.last_name, c.email) == ("Seed", "3", "seed3@example.com")
    assert c.status == "published"
    assert c.sync_state == "synced" and c.remote_id is not None
    second = pull_customers()
    assert (second.created, second.updated, second.unchanged) == (0, 0, 25)
    assert OutboxEntry.objects.count() == 0, "pulled rows are never pushed back"


def test_queries_per_page_are_constant(small_pages):
    small_pages.seed(customers=10)
    with CaptureQueriesContext(connection) as one_page:
        pull_customers()
    Customer.objects.all()._raw_delete(Customer.objects.db)
    small_pages.seed(customers=30)  # now 40 remote customers: 4 pages (and a short one)
    with CaptureQueriesContext(connection) as more_pages:
        counts = pull_customers()
    assert counts.created == 40
    per_page = len(one_page.captured_queries)
    # Constant per page (at most the one-page cost for each page), never per row.
    assert len(more_pages.captured_queries) <= per_page * counts.pages, (
        per_page,
        len(more_pages.captured_queries),
    )
    assert len(more_pages.captured_queries) < 40


def test_local_pending_changes_are_not_overwritten(small_pages):
    small_pages.seed(customers=2)
    pull_customers()
    c = Customer.objects.get(identifier="seed-0")
    c.first_name = "Local edit"
    c.save()
    c.refresh_from_db()
    assert c.sync_state == "pending"
    counts = pull_customers()
    assert counts.skipped == 1
    c.refresh_from_db()
    assert c.first_name == "Local edit"


def test_subscriptions_link_to_local_rows_and_remote_owns_state(small_pages):
    small_pages.seed(customers=3, subscriptions=5)
    pull_products()
    pull_customers()
    counts = pull_subscriptions()
    assert counts.created == 5
    product = Product.objects.get()
    assert product.name == "Seeded plan" and product.product_type == "subscription"
    subs = list(Subscription.objects.select_related("customer", "product"))
    assert all(s.product == product for s in subs)
    for s in subs:
        assert s.customer is not None and s.customer.remote_id == s.customer_remote_id
        assert (s.selected_currency, s.selected_billing_cycle) == ("XOF", "months-1")
    assert Subscription.objects.active().count() == 5

    # A local edit of a remote-owned field is overwritten by the next pull.
    sub = subs[0]
    Subscription.objects.filter(pk=sub.pk).update(status="canceled", sync_state="pending")
    again = pull_subscriptions()
    sub.refresh_from_db()
    assert sub.status == "published"
    assert again.updated == 1 and again.unchanged == 4


def test_pull_for_one_customer_and_upsert_of_an_event_resource(small_pages):
    small_pages.seed(customers=2, subscriptions=4)
    pull_products()
    pull_customers()
    customer = Customer.objects.filter(subscriptions__isnull=True).first()
    remote_subs = small_pages.objects("subscription")
    mine = [s for s in remote_subs if s["customer"] == str(customer.remote_id)]
    counts = pull_subscriptions(customer)
    assert counts.created == len(mine)
    data = dict(remote_subs[0], status="canceled")
    sub = upsert_subscription(data)
    assert sub.status == "canceled" and str(sub.remote_id) == remote_subs[0]["id"]
    assert OutboxEntry.objects.count() == 0


def test_lost_create_answer_is_adopted_not_duplicated(small_pages):
    c = Customer.objects.create(identifier="team:7", first_name="T", email="t@example.com")
    entry = OutboxEntry.objects.get()
    small_pages.faults(operation="create_customer", reset_after_commit_rate=1.0, count=1)
    small_pages.faults(operation="create_customer", reset_rate=1.0, count=10)
    from billing_integration.exceptions import BillingTransportError

    result = push_entry_now(entry.pk)
    assert result.status == "retry" and isinstance(result.error, BillingTransportError)
    small_pages.clear_faults()
    pull_customers()  # the remote customer exists: link it to the local row
    assert Customer.objects.count() == 1
    c.refresh_from_db()
    assert c.remote_id is not None
    assert push_entry_now(entry.pk).status == "done"
    assert len(small_pages.objects("customer")) == 1


def test_billing_sync_command_prints_counts(small_pages):
    small_pages.seed(customers=3, subscriptions=2)
    out = io.StringIO()
    call_command("billing_sync", stdout=out)
    text = out.getvalue()
    assert "products: 1 created" in text
    assert "customers: 3 created" in text
    assert "subscriptions: 2 created" in text
    out = io.StringIO()
    call_command("billing_sync", "customers", stdout=out)
    assert "customers: 0 created, 0 updated, 3 unchanged" in out.getvalue()


def test_active_rule(db):
    now = timezone.now()
    active = Subscription.objects.create(status="published", cycle_end_date=now + timedelta(days=3))
    Subscription.objects.create(status="canceled", cycle_end_date=now + timedelta(days=3))
    Subscription.objects.create(status="published", cycle_end_date=now - timedelta(days=1))
    trial = Subscription.objects.create(
        status="published",
        cycle_end_date=now - timedelta(days=1),
        trial_end_date=now + timedelta(days=1),
    )
    open_ended = Subscription.objects.create(status="published")
    assert set(Subscription.objects.active()) == {active, trial, open_ended}
    assert all(s.is_active for s in Subscription.objects.active())
