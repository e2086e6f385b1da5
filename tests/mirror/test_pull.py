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
from billing_integration.outbox.push import push_entry
from billing_integration.sync.pull import (
    pull_customers,
    pull_products,
    pull_subscriptions,
    upsert_subscription,
)

pytestmark = pytest.mark.django_db(transaction=True)


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
    Customer.objects.all().delete()
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


def test_consecutive_pages_are_written_together(small_pages, monkeypatch):
    def writes(queries: CaptureQueriesContext) -> list[str]:
        """The statements on the mirror's customers (not the token cache's)."""
        return [q["sql"][:40] for q in queries.captured_queries if "_customer" in q["sql"]]

    small_pages.seed(customers=10)
    with CaptureQueriesContext(connection) as one_page:
        pull_customers()
    Customer.objects.all().delete()
    small_pages.seed(customers=20)  # 30 remote customers: 3 pages, written at once
    seen = []
    with CaptureQueriesContext(connection) as three_pages:
        counts = pull_customers(progress=lambda _, total: seen.append((total.pages, total.total)))
    assert (counts.created, counts.pages) == (30, 3) and Customer.objects.count() == 30
    # the SELECT of the known rows, the INSERT, an UPDATE linking what waited for them in
    # each of subscriptions, invoices, payments, refunds
    assert len(writes(one_page)) == 6
    assert writes(three_pages) == writes(one_page)
    assert seen == [(3, 30)]
    # A batch of 20 rows: the first two pages, then the third (the short one).
    monkeypatch.setattr("billing_integration.sync.pull.PULL_BATCH_ROWS", 20)
    seen.clear()
    again = pull_customers(progress=lambda _, total: seen.append((total.pages, total.total)))
    assert (again.unchanged, again.pages) == (30, 3) and seen == [(2, 20), (3, 30)]


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

    result = push_entry(entry.pk)
    assert result.status == "retry" and isinstance(result.error, BillingTransportError)
    small_pages.clear_faults()
    pull_customers()  # the remote customer exists: link it to the local row
    assert Customer.objects.count() == 1
    c.refresh_from_db()
    assert c.remote_id is not None
    assert push_entry(entry.pk).status == "done"
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


def test_active_rule(db, settings):
    now = timezone.now()
    active = Subscription.objects.create(status="published", cycle_end_date=now + timedelta(days=3))
    grace = Subscription.objects.create(status="canceled", cycle_end_date=now + timedelta(days=3))
    Subscription.objects.create(status="canceled", cycle_end_date=now - timedelta(days=1))
    Subscription.objects.create(status="published", cycle_end_date=now - timedelta(days=1))
    trial = Subscription.objects.create(
        status="published",
        cycle_end_date=now - timedelta(days=1),
        trial_end_date=now + timedelta(days=1),
    )
    open_ended = Subscription.objects.create(status="published")
    assert set(Subscription.objects.active()) == {active, grace, trial, open_ended}
    assert all(s.is_active for s in Subscription.objects.active())
    settings.BILLING = {**settings.BILLING, "ACCESS_AFTER_CANCEL": "immediately"}
    assert set(Subscription.objects.active()) == {active, trial, open_ended}


def test_lost_subscription_create_answer_is_adopted_not_duplicated(small_pages):
    from billing_integration.exceptions import BillingTransportError

    from .conftest import subscribe
    from .test_outbox import make_product

    product = make_product()
    product.publish()
    sub = subscribe(product, "adopt", "a@example.com")
    others = OutboxEntry.objects.exclude(content_type__model="subscription")
    for entry in others.order_by("pk"):
        assert push_entry(entry.pk).status == "done"  # the product and the customer
    entry = OutboxEntry.objects.open().get()
    small_pages.faults(operation="create_subscription", reset_after_commit_rate=1.0, count=1)
    small_pages.faults(operation="create_subscription", reset_rate=1.0, count=10)
    result = push_entry(entry.pk)
    assert result.status == "retry" and isinstance(result.error, BillingTransportError)
    small_pages.clear_faults()
    counts = pull_subscriptions()  # the remote subscription exists: link it to the local row
    assert (counts.created, counts.updated) == (0, 1)
    sub.refresh_from_db()
    (remote,) = small_pages.objects("subscription")
    assert str(sub.remote_id) == remote["id"] and Subscription.objects.count() == 1


def test_pulled_rows_get_every_column(small_pages):
    small_pages.seed(customers=1, subscriptions=1)
    before = timezone.now()
    pull_products()
    pull_customers()
    pull_subscriptions()
    (remote,) = small_pages.objects("subscription")
    sub = Subscription.objects.select_related("customer").get()
    assert sub.created_at >= before and sub.updated_at >= before
    assert sub.last_synced_at >= before and sub.sync_state == "synced" and sub.sync_error == ""
    assert sub.remote_data["id"] == remote["id"] and sub.customer.remote_data["identifier"]
    assert sub.cycle_end_date > sub.cycle_start_date and sub.next_billing_date is not None


def test_a_page_that_fails_stops_the_pull_after_storing_the_pages_before(small_pages):
    from billing_integration.client import get_client
    from billing_integration.exceptions import BillingAPIError

    small_pages.seed(customers=35)
    real = get_client()

    class ThirdPageFails:
        def iter_pages(self, resource):
            pages = real.iter_pages(resource)
            yield next(pages)
            yield next(pages)
            raise BillingAPIError(status=500, operation="list_customers", message="boom")

    with pytest.raises(BillingAPIError, match="boom"):
        pull_customers(client=ThirdPageFails())
    assert Customer.objects.count() == 20  # the two pages read before the failure
    assert pull_customers().created == 15
