"""A pull is the service's present: against the sandbox over real HTTP, a version of our own
clock never makes a pulled row stale, and a resource whose pull fails never keeps the others
from being pulled (``billing_sync``, ``sync_all``)."""

from __future__ import annotations

import io
import json
import threading
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from billing_integration.client import get_client
from billing_integration.models import (
    Customer,
    EventState,
    Notice,
    NoticeKind,
    Product,
    Subscription,
    WebhookEvent,
)
from billing_integration.sync import pull
from billing_integration.sync.pull import pull_customers, pull_products, pull_subscriptions
from billing_integration.sync.tasks import sync_all
from billing_integration.timestamps import format_timestamp, parse_timestamp
from billing_integration.webhooks.ingest import store_delivery
from billing_integration.webhooks.processing import process_event
from billing_integration.webhooks.verification import Verification

from ..webhooks.conftest import as_meta, sign
from .conftest import push_open, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sandbox(billing_sandbox, eager):
    from billing_integration.client import reset_client

    reset_client()
    return billing_sandbox


def test_a_version_of_our_clock_never_makes_a_pulled_row_stale(sandbox, client):
    sandbox.seed(customers=1, subscriptions=1)
    pull_products(), pull_customers(), pull_subscriptions()
    sub = Subscription.objects.get()
    assert sub.status == "published" and not sub.remote_updated_ours
    # An event without any date of its own, signed by a delivery clock 30 s ahead of the
    # service's: its version is that signed timestamp, a time of ours.
    body = json.dumps(
        {"id": "evt-undated", "type": "subscription.renewal", "data": {"id": str(sub.remote_id)}}
    ).encode()
    headers = sign(body, sandbox.webhook_secret, timestamp=int(time.time()) + 30)
    response = client.post(
        reverse("billing_integration:webhook"),
        data=body,
        content_type="application/json",
        **as_meta(headers),
    )
    assert response.status_code == 200
    event = WebhookEvent.objects.get(event_id="evt-undated")
    assert (event.state, event.outcome) == (EventState.PROCESSED, "applied")
    sub.refresh_from_db()
    assert sub.remote_updated_ours
    # Then the service pauses it: its date_updated is a few seconds behind our clock.
    sandbox.trigger("subscription.paused", str(sub.remote_id))
    remote = sandbox.object("subscription", str(sub.remote_id))
    assert remote["status"] == "paused"
    counts = pull_subscriptions()
    assert (counts.updated, counts.stale) == (1, 0)
    sub.refresh_from_db()
    assert sub.status == "paused" and not sub.remote_updated_ours
    assert sub.remote_updated.isoformat().startswith(remote["date_updated"][:19])
    # Now the stored version is the service's own: an older pulled row is stale again.
    assert pull_subscriptions().unchanged == 1


def blocked(backend: int | None) -> bool:
    """The PostgreSQL backend ``backend`` waits on a lock another transaction holds."""
    if backend is None:
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT cardinality(pg_blocking_pids(%s)) > 0", [backend])
        return bool(cursor.fetchone()[0])


def cancel_after_the_pulls_read(sandbox, monkeypatch, remote_id: str) -> tuple[list, dict]:
    """Once a pull has read the local rows (its first read), the service cancels subscription
    ``remote_id`` a minute later and another thread stores and processes that event; the pull
    goes on once the event is applied or waits on a lock the pull holds. Returns the order of
    the steps (``pull read``, ``event started``, ``event done``, ``pull wrote``) and the
    event thread's ``thread``, ``envelope``, ``result`` and whether it ``waited``."""
    order: list[str] = []
    event: dict = {}

    def deliver(envelope: dict) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                event["backend"] = cursor.fetchone()[0]
            order.append("event started")
            body = json.dumps(envelope).encode()
            stored = store_delivery(body, {}, Verification("signature", envelope["id"]))
            event["result"] = process_event(stored.event.pk)
            order.append("event done")
        finally:
            connection.close()

    read, touch = pull._existing, pull.touch_reports

    def read_then_event(model, mapped):
        rows = read(model, mapped)
        if "thread" in event:
            return rows
        order.append("pull read")
        sandbox.advance(seconds=60)
        event["envelope"] = sandbox.trigger("subscription.canceled", remote_id)
        thread = threading.Thread(target=deliver, args=(event["envelope"],))
        event["thread"] = thread
        thread.start()
        wait_for(lambda: not thread.is_alive() or blocked(event.get("backend")))
        event["waited"] = thread.is_alive()
        return rows

    def wrote(objs):
        order.append("pull wrote")
        touch(objs)

    monkeypatch.setattr(pull, "_existing", read_then_event)
    monkeypatch.setattr(pull, "touch_reports", wrote)
    return order, event


def canceled_by(event: dict, remote_id: str) -> Subscription:
    """The subscription, once the event's thread is done and has applied the event."""
    event["thread"].join(timeout=30)
    assert not event["thread"].is_alive()
    assert (event["result"].state, event["result"].outcome) == (EventState.PROCESSED, "applied")
    return Subscription.objects.get(remote_id=remote_id)


@pytest.mark.postgresql
def test_an_event_processed_while_a_pull_writes_is_never_taken_back(sandbox, monkeypatch):
    """A pull reads a subscription; before it writes, another thread receives and processes
    an event of a newer state of it. The pull decides on the row locked in its write's
    transaction: the event waits for the pull's commit, then applies over the pulled state."""
    sandbox.seed(customers=1, subscriptions=1)
    pull_products(), pull_customers(), pull_subscriptions()
    remote_id = str(Subscription.objects.get().remote_id)
    sandbox.trigger("subscription.paused", remote_id)  # what the pull will write
    order, event = cancel_after_the_pulls_read(sandbox, monkeypatch, remote_id)
    counts = pull_subscriptions()
    sub = canceled_by(event, remote_id)
    # The race happened: the event's processing began after the pull's read, before its write.
    assert order.index("pull read") < order.index("event started") < order.index("pull wrote")
    assert (counts.updated, counts.stale) == (1, 0)  # the pulled (paused) state was written
    assert sub.status == "canceled", order  # not taken back to the pulled (older) state
    assert sub.remote_updated == parse_timestamp(event["envelope"]["data"]["date_updated"])
    assert event["waited"]  # on the row the pull locked, until its commit


@pytest.mark.postgresql
def test_a_subscription_an_event_inserts_while_a_pull_writes_is_never_taken_back(
    sandbox, monkeypatch
):
    """A pull reads no row of a subscription (there is none to lock); before it writes,
    another thread processes an event of a newer state of it, which inserts the row. The
    pull's insert of that row fails and the pull decides on it again, locked: ``stale``."""
    sandbox.seed(customers=1, subscriptions=1)
    pull_products(), pull_customers()  # the subscription is not known locally
    remote_id = str(sandbox.objects("subscription")[0]["id"])
    order, event = cancel_after_the_pulls_read(sandbox, monkeypatch, remote_id)
    counts = pull_subscriptions()
    sub = canceled_by(event, remote_id)
    # The race happened: the event inserted the row after the pull's read, before its write.
    assert order.index("pull read") < order.index("event done") < order.index("pull wrote")
    assert sub.status == "canceled", order  # not the pulled (older) state
    assert (counts.created, counts.updated, counts.stale) == (0, 0, 1)
    assert sub.remote_updated == parse_timestamp(event["envelope"]["data"]["date_updated"])


def between_read_and_write(monkeypatch, step) -> list[str]:
    """Run ``step()`` once a pull has read its first page (over HTTP) and before it writes it
    (its ``_upsert``); returns the order of the steps."""
    order: list[str] = []
    upsert = pull._upsert

    def late(model, mapped, counts, **kwargs):
        if order and order[-1] == "pull read":  # a pull run by ``step``
            return upsert(model, mapped, counts, **kwargs)
        if not order:
            order.append("pull read")
            step()
            order.append("newer applied")
        result = upsert(model, mapped, counts, **kwargs)
        order.append("pull wrote")
        return result

    monkeypatch.setattr(pull, "_upsert", late)
    return order


def test_a_product_pushed_while_a_pull_writes_is_never_taken_back(sandbox, monkeypatch):
    """A pull reads the product list; before it writes, a change made here is pushed and the
    service's answer (its newer date_updated) stored. The pull's older copy was written over
    it: the product was back to its old name here, and synced."""
    sandbox.seed(customers=1, subscriptions=1)
    pull_products()
    product = Product.objects.get()

    def rename() -> None:
        product.name = "Renamed"
        product.save()
        assert [r.status for r in push_open()] == ["done"]
        product.refresh_from_db()
        assert product.sync_state == "synced" and product.remote_updated is not None

    order = between_read_and_write(monkeypatch, rename)
    counts = pull_products()
    assert order == ["pull read", "newer applied", "pull wrote"]  # the race happened
    assert counts.stale == 1 and counts.updated == 0
    stored = Product.objects.get()
    assert stored.name == "Renamed" and stored.remote_updated == product.remote_updated
    remote = sandbox.object("product", str(product.remote_id))
    assert remote["name"] == "Renamed"
    assert stored.remote_updated == parse_timestamp(remote["date_updated"])


def test_a_customer_pulled_while_an_older_pull_writes_is_never_taken_back(sandbox, monkeypatch):
    """A pull reads the customer list; before it writes, the service changes the customer and
    another pull (an event's) writes that newer copy. The first pull's older copy was written
    over it (the phone lost until the next pull)."""
    sandbox.seed(customers=1)
    pull_customers()
    remote_id = Customer.objects.get().remote_id
    client = get_client()
    real = client._call

    # A minute ahead: a version beyond the tolerance would hold back nothing (docs/mirror.md).
    ahead = format_timestamp(timezone.now() + timedelta(minutes=1))

    def changed(operation, *args, **kwargs):
        items = real(operation, *args, **kwargs)
        newer = {"phone": "+221770000001", "date_updated": ahead}
        return [dict(item, **newer) for item in items]

    def newer_pull() -> None:
        monkeypatch.setattr(client, "_call", changed)
        assert pull_customers().updated == 1
        monkeypatch.setattr(client, "_call", real)

    order = between_read_and_write(monkeypatch, newer_pull)
    counts = pull_customers()
    assert order == ["pull read", "newer applied", "pull wrote"]  # the race happened
    assert counts.stale == 1 and counts.updated == 0
    customer = Customer.objects.get(remote_id=remote_id)
    assert customer.phone == "+221770000001"
    assert customer.remote_updated == parse_timestamp(ahead)


def without_date_updated(monkeypatch) -> None:
    """The client's list pages as from a service that sends no ``date_updated`` (the
    interface does not promise it): each row's version is its ``date_created``."""
    client = get_client()
    real = client._call

    def undated(operation, *args, **kwargs):
        items = real(operation, *args, **kwargs)
        if not operation.startswith("list_") or not isinstance(items, list):
            return items
        return [{k: v for k, v in item.items() if k != "date_updated"} for item in items]

    monkeypatch.setattr(client, "_call", undated)


def apply_undated_event(envelope: dict) -> None:
    """Store and process ``envelope`` here and now, its data without ``date_updated``."""
    data = {k: v for k, v in envelope["data"].items() if k != "date_updated"}
    body = json.dumps({**envelope, "data": data}).encode()
    stored = store_delivery(body, {}, Verification("signature", envelope["id"]))
    result = process_event(stored.event.pk)
    assert (result.state, result.outcome) == (EventState.PROCESSED, "applied")


def test_a_page_read_before_an_event_never_takes_it_back_without_date_updated(
    sandbox, monkeypatch, settings
):
    """Rows and events carry only ``date_created``: every version of a subscription ties. A
    page read before a cancellation event was applied, written after it, set the subscription
    back to active; the next pull found it canceled again and sent a second notice. The row
    changed here after the page was read keeps the event's state; the page fills in the rest."""
    settings.BILLING = {**settings.BILLING, "NOTICES": {"subscription_canceled": True}}
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    sandbox.seed(customers=2, subscriptions=2)
    without_date_updated(monkeypatch)
    pull_products(), pull_customers(), pull_subscriptions()
    canceled, paused = (str(s.remote_id) for s in Subscription.objects.order_by("pk"))
    sandbox.trigger("subscription.paused", paused)  # no event of it here: the pull brings it

    def cancel() -> None:
        apply_undated_event(sandbox.trigger("subscription.canceled", canceled))
        assert Subscription.objects.get(remote_id=canceled).status == "canceled"

    order = between_read_and_write(monkeypatch, cancel)
    counts = pull_subscriptions()
    assert order == ["pull read", "newer applied", "pull wrote"]  # the race happened
    assert (counts.updated, counts.stale) == (1, 1)
    assert Subscription.objects.get(remote_id=canceled).status == "canceled"
    assert Subscription.objects.get(remote_id=paused).status == "paused"
    # The next pull reads the cancellation: nothing moves, no second notice.
    again = pull_subscriptions()
    assert (again.updated, again.stale, again.unchanged) == (0, 0, 2)
    assert Subscription.objects.get(remote_id=canceled).status == "canceled"
    notices = Notice.objects.filter(kind=NoticeKind.SUBSCRIPTION_CANCELED)
    assert notices.count() == 1 and notices.get().event is not None


def fail_products(sandbox) -> None:
    sandbox.faults(operation="list_products", error_rate=1.0, status=400)


def test_billing_sync_pulls_the_other_resources_when_one_fails(sandbox):
    sandbox.seed(customers=2, subscriptions=1)
    pull_products()  # the subscription's product, so it links
    fail_products(sandbox)
    sandbox.clear_requests()
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError, match="pull failed for products"):
        call_command("billing_sync", "--no-progress", stdout=out, stderr=err)
    assert "products: failed:" in err.getvalue()
    assert "customers: 2 created" in out.getvalue()
    assert "subscriptions: 1 created" in out.getvalue()
    asked = {r["operation"] for r in sandbox.requests()}
    assert {"list_products", "list_customers", "list_subscriptions"} <= asked
    assert Customer.objects.count() == 2 and Subscription.objects.count() == 1


def test_sync_all_pulls_the_other_resources_then_raises(sandbox):
    from billing_integration.exceptions import BillingError

    sandbox.seed(customers=2)
    fail_products(sandbox)
    with pytest.raises(BillingError):
        sync_all()
    assert Customer.objects.count() == 2


def test_a_pulled_copy_older_than_the_stored_version_is_stale(sandbox):
    """The service's list answers a copy older than the version stored here well before the
    pull began (an event applied a newer state): the pull counts it stale and keeps the row."""
    sandbox.seed(customers=1, subscriptions=1)
    pull_products(), pull_customers(), pull_subscriptions()
    sub = Subscription.objects.get()
    remote = sandbox.object("subscription", str(sub.remote_id))
    pulled = sub.remote_updated or sub.remote_created  # the copy's version
    assert pulled is not None
    newer = pulled + timedelta(seconds=1)
    Subscription.objects.filter(pk=sub.pk).update(status="canceled", remote_updated=newer)
    counts = pull_subscriptions()
    assert (counts.updated, counts.stale) == (0, 1)
    sub.refresh_from_db()
    assert (sub.status, sub.remote_updated) == ("canceled", newer)
    assert remote["status"] != "canceled"  # the pulled copy would have taken it back
