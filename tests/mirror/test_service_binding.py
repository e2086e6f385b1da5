"""Which service the mirror belongs to (``billing_integration.service``), against the sandbox
over real HTTP: recorded on the first push or pull; settings pointed elsewhere make pushes
and pulls refuse before anything is sent, losing nothing; ``billing_service relink`` lets the
held entries go out; ``billing_service reset`` pushes everything anew to the new service."""

from __future__ import annotations

import uuid
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, transaction

from billing_integration.exceptions import BillingError
from billing_integration.models import (
    Customer,
    OutboxEntry,
    Product,
    Subscription,
    WebhookEvent,
)
from billing_integration.outbox.push import PushOutcome, push_entry
from billing_integration.sync.pull import pull_customers, pull_products, pull_subscriptions
from billing_integration.sync.tasks import sync_all
from billing_integration.testing import start_sandbox

from .conftest import push_open
from .test_outbox import make_product
from .test_push import customers, open_ids

pytestmark = pytest.mark.django_db(transaction=True)

REFUSED = "refused"


@pytest.fixture(scope="module")
def other_server():
    """A second, independent sandbox: another service."""
    server = start_sandbox()
    yield server
    server.stop()


@pytest.fixture
def other_sandbox(other_server, billing_sandbox):
    from billing_integration.testing.helpers import SandboxHandle

    handle = SandboxHandle(other_server.url, server=other_server)
    handle.reset()
    return handle


def binding():
    from billing_integration.models import ServiceBinding

    return ServiceBinding.objects.get()


def moved_url(sandbox) -> str:
    """The same sandbox under another address (``localhost`` for ``127.0.0.1``): requests
    sent there reach it and show in its request log."""
    assert sandbox.base_url.startswith("http://127.0.0.1:")
    return sandbox.base_url.replace("127.0.0.1", "localhost")


def point_at(settings, **keys) -> None:
    settings.BILLING = {**settings.BILLING, **keys}


def point_at_sandbox(settings, sandbox) -> None:
    point_at(settings, **sandbox.django_settings())


def pushed_product(name: str = "Pro plan") -> Product:
    product = make_product(name)
    for pk in open_ids():
        assert push_entry(pk).status == PushOutcome.DONE
    product.refresh_from_db()
    assert product.remote_id is not None
    return product


# --- recording --------------------------------------------------------------------------------
def test_the_first_push_records_the_service_never_the_secret(billing_sandbox, settings):
    from billing_integration.models import ServiceBinding

    assert not ServiceBinding.objects.exists()
    pushed_product()
    row = binding()
    assert (row.base_url, row.realm, row.client_id) == (
        billing_sandbox.base_url,
        "sandbox",
        billing_sandbox.client_id,
    )
    values = " ".join(str(v) for v in ServiceBinding.objects.values().get().values())
    assert billing_sandbox.client_secret not in values
    # Pushing again keeps the one row.
    pushed_product("Other")
    assert ServiceBinding.objects.count() == 1


def test_the_first_pull_records_the_service(billing_sandbox):
    billing_sandbox.seed(customers=2)
    assert pull_customers().created == 2
    assert binding().base_url == billing_sandbox.base_url


def service_check_errors() -> list[str]:
    from django.core.checks import run_checks

    return [m.id for m in run_checks(databases=["default"]) if m.id == "billing_integration.E010"]


def test_a_service_that_never_answered_does_not_keep_an_empty_mirror(billing_sandbox, settings):
    """A typo in ``BASE_URL``: the first pull cannot connect, so nothing came from there. Once
    the setting is fixed, the empty mirror follows the configured service: no refusal, and the
    database check (``migrate``) passes."""
    from billing_integration.client import retry

    good = settings.BILLING["BASE_URL"]
    point_at(settings, BASE_URL="http://127.0.0.1:9")  # nothing listens there
    retry_count = retry.MAX_RETRIES
    retry.MAX_RETRIES = 0
    try:
        with pytest.raises(BillingError):
            pull_products()
    finally:
        retry.MAX_RETRIES = retry_count
    point_at(settings, BASE_URL=good)
    assert service_check_errors() == []
    billing_sandbox.seed(customers=2)
    assert pull_customers().created == 2
    assert binding().base_url == billing_sandbox.base_url


def test_a_mirror_with_a_push_in_doubt_stays_with_its_service(billing_sandbox, settings):
    """A push whose answer was lost may have created the object there: that mirror keeps its
    service, even with no remote id yet."""
    from billing_integration.service import ensure_service

    good = settings.BILLING["BASE_URL"]
    point_at(settings, BASE_URL=moved_url(billing_sandbox))
    ensure_service()  # what the push does first
    make_product("Pro plan")
    OutboxEntry.objects.update(in_doubt=True)  # its answer lost: maybe created there
    assert binding().base_url != good
    point_at(settings, BASE_URL=good)
    assert service_check_errors() == ["billing_integration.E010"]
    billing_sandbox.clear_requests()
    assert [push_entry(pk).status for pk in open_ids()] == [REFUSED]
    assert billing_sandbox.requests() == []


def test_one_binding_per_database_even_when_two_processes_record_at_once(
    billing_sandbox, monkeypatch
):
    """The unique constraint decides: the process that loses the insert reads the winner's
    row and compares with it."""
    from billing_integration import service
    from billing_integration.exceptions import BillingServiceMismatchError
    from billing_integration.models import ServiceBinding

    with pytest.raises(IntegrityError), transaction.atomic():
        ServiceBinding.objects.create(
            base_url="http://a", realm="r", client_id="c", recorded_at="2026-01-01T00:00:00Z"
        )
        ServiceBinding.objects.create(
            base_url="http://b", realm="r", client_id="c", recorded_at="2026-01-01T00:00:00Z"
        )
    # Another process recorded another service between our read and our insert, and pulled
    # from it (a mirror holding nothing would follow the settings).
    Product.objects.create(remote_id=uuid.uuid4(), name="There")
    ServiceBinding.objects.create(
        base_url="http://elsewhere",
        realm="sandbox",
        client_id="x",
        recorded_at="2026-01-01T00:00:00Z",
    )
    reads = iter([None])
    real = service.recorded_service
    monkeypatch.setattr(
        service, "recorded_service", lambda using=None: next(reads, None) or real(using)
    )
    with pytest.raises(BillingServiceMismatchError, match="http://elsewhere"):
        service.ensure_service()
    assert ServiceBinding.objects.count() == 1


@pytest.mark.postgresql  # concurrent writers
def test_two_processes_recording_different_services_at_once_agree_on_one(billing_sandbox):
    import threading

    from django.db import connections

    from billing_integration import service
    from billing_integration.models import ServiceBinding

    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def record(name: str) -> None:
        try:
            barrier.wait(timeout=10)
            results[name] = service._record_first(
                service.ServiceIdentity(f"http://{name}", "sandbox", "c"), "default"
            )
        finally:
            connections.close_all()

    threads = [threading.Thread(target=record, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    row = ServiceBinding.objects.get()
    assert len(results) == 2  # the loser read the winner's row instead of failing
    assert {r.base_url for r in results.values()} == {row.base_url}


# --- identity ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://Billing.Example.com/", "https://billing.example.com"),
        ("https://billing.example.com:443/api/", "https://billing.example.com/api"),
        ("http://billing.example.com:80", "http://billing.example.com"),
        ("http://billing.example.com:8100/", "http://billing.example.com:8100"),
        ("https://user:pw@billing.example.com/x?q=1#f", "https://billing.example.com/x"),
        ("http://[::1]:8100/", "http://[::1]:8100"),
    ],
)
def test_the_base_url_is_normalised(url, expected):
    from billing_integration.service import normalise_url

    assert normalise_url(url) == expected


def test_the_same_service_written_differently_is_not_another_one(billing_sandbox, settings):
    pushed_product()
    point_at(settings, BASE_URL=billing_sandbox.base_url + "/")  # normalised: the same
    product = Product.objects.get()
    product.description = "Changed"
    product.save()
    assert [push_entry(pk).status for pk in open_ids()] == [PushOutcome.DONE]
    assert len(billing_sandbox.requests("update_product")) == 1


def test_the_configured_service_follows_the_settings(billing_sandbox, settings):
    from billing_integration.service import configured_service

    first = configured_service()
    assert configured_service() == first
    point_at(settings, CLIENT_ID="another-client")
    assert configured_service().client_id == "another-client"
    assert configured_service().base_url == first.base_url


# --- pushes -----------------------------------------------------------------------------------
def test_pointed_elsewhere_pushes_are_refused_nothing_sent_nothing_lost_then_relinked(
    billing_sandbox, settings, recorded_enqueues
):
    product = pushed_product()
    remote_id = product.remote_id
    product.description = "Changed while pointed elsewhere"
    product.save()
    made = customers(3, "held")
    held = open_ids()
    assert len(held) == 4

    moved = moved_url(billing_sandbox)
    point_at(settings, BASE_URL=moved)
    billing_sandbox.clear_requests()

    # The push (the task's and the inline paths'), and billing_sync --push: all refuse.
    assert {r.status for r in push_open()} == {REFUSED}
    with pytest.raises(CommandError, match="billing_service relink"):
        call_command("billing_sync", "--push", "--no-progress")

    assert billing_sandbox.requests() == []  # not even a token
    for entry in OutboxEntry.objects.filter(pk__in=held):
        assert (entry.state, entry.attempts, entry.in_doubt) == ("pending", 0, False)
        assert billing_sandbox.base_url in entry.last_error and moved in entry.last_error
        assert billing_sandbox.client_id in entry.last_error and "'sandbox'" in entry.last_error
        assert "billing_service relink" in entry.last_error
        assert "billing_service reset" in entry.last_error
        assert billing_sandbox.client_secret not in entry.last_error
    product.refresh_from_db()
    assert product.remote_id == remote_id and product.sync_state == "pending"
    assert all(c.remote_id is None for c in Customer.objects.all())

    # The same service at a new address: relink, and the held entries go out to it.
    recorded_enqueues.clear()
    out = StringIO()
    call_command("billing_service", "relink", "--yes", stdout=out)
    assert moved in out.getvalue()
    row = binding()
    assert row.base_url == moved
    assert [h["base_url"] for h in row.history] == [billing_sandbox.base_url]
    assert row.history[0]["action"] == "relink"
    assert sorted(recorded_enqueues) == held, "the relink enqueues the held entries"
    assert [r.status for r in push_open()] == [PushOutcome.DONE] * 4
    [patch] = billing_sandbox.requests("update_product")
    assert patch["path"].endswith(f"/products/{remote_id}")  # the remote id was kept
    assert patch["body"]["description"] == "Changed while pointed elsewhere"
    assert len(billing_sandbox.requests("create_customer")) == 3
    for customer in made:
        customer.refresh_from_db()
        assert customer.remote_id is not None and customer.sync_state == "synced"
    assert set(OutboxEntry.objects.values_list("state", "last_error")) == {("done", "")}


@pytest.mark.parametrize("key", ["REALM", "CLIENT_ID"])
def test_another_realm_or_client_id_is_another_service(billing_sandbox, settings, key):
    pushed_product()
    customers(1, "c")
    point_at(settings, **{key: "production" if key == "REALM" else "other-client"})
    billing_sandbox.clear_requests()
    assert [push_entry(pk).status for pk in open_ids()] == [REFUSED]
    assert billing_sandbox.requests() == []
    entry = OutboxEntry.objects.get(state="pending")
    assert ("'production'" if key == "REALM" else "'other-client'") in entry.last_error


# --- pulls ------------------------------------------------------------------------------------
def test_pointed_elsewhere_pulls_are_refused_and_nothing_is_sent(billing_sandbox, settings):
    billing_sandbox.seed(customers=2, subscriptions=2)
    pull_products()
    pull_customers()
    pull_subscriptions()
    counts = (Product.objects.count(), Customer.objects.count(), Subscription.objects.count())

    point_at(settings, BASE_URL=moved_url(billing_sandbox))
    billing_sandbox.clear_requests()
    outcomes = []
    for pull in (pull_products, pull_customers, pull_subscriptions, sync_all):
        try:
            pull()
        except BillingError as exc:
            assert "billing_service relink" in str(exc)
            outcomes.append(type(exc).__name__)
        else:
            outcomes.append("pulled")
    assert billing_sandbox.requests() == []
    assert outcomes == ["BillingServiceMismatchError"] * 4
    with pytest.raises(CommandError, match="billing_service reset"):
        call_command("billing_sync", "--no-progress")
    assert billing_sandbox.requests() == []
    assert (
        Product.objects.count(),
        Customer.objects.count(),
        Subscription.objects.count(),
    ) == counts


# --- reset ------------------------------------------------------------------------------------
def test_reset_pushes_products_and_customers_anew_and_detaches_old_subscriptions(
    billing_sandbox, other_sandbox, settings
):
    product = pushed_product()
    old_product_id = product.remote_id
    billing_sandbox.seed(customers=1, subscriptions=1, product=str(old_product_id))
    pull_customers()
    pull_subscriptions()
    customer = Customer.objects.get()
    old_sub = Subscription.objects.get()
    assert Subscription.objects.active().count() == 1 and old_sub.product == product
    # A local subscription still waiting to be created at the old service, and an event.
    unpushed = Subscription.objects.create(
        customer=customer,
        product=product,
        selected_billing_cycle="months-1",
        selected_currency="XOF",
        status="published",
    )
    assert OutboxEntry.objects.filter(state="pending").count() == 1
    WebhookEvent.objects.create(
        event_id=str(uuid.uuid4()), raw_type="invoice.paid", type="invoice.paid", body="{}"
    )

    point_at_sandbox(settings, other_sandbox)  # another service
    assert [r.status for r in push_open()] == [REFUSED]
    billing_sandbox.clear_requests()

    out = StringIO()
    call_command("billing_service", "reset", "--yes", stdout=out)
    assert "1 products and 1 customers" in out.getvalue()
    row = binding()
    assert row.base_url == other_sandbox.base_url and row.client_id == other_sandbox.client_id
    assert row.history[0]["action"] == "reset"

    product.refresh_from_db()
    customer.refresh_from_db()
    for obj in (product, customer):
        assert (obj.remote_id, obj.remote_data, obj.sync_state) == (None, None, "pending")
    assert product.confirmed_cycles == {}  # the new service holds none of its cycles yet
    for sub in Subscription.objects.all():
        assert sub.status == "detached" and "reset" in sub.sync_error
    assert Subscription.objects.active().count() == 0  # no access from the old service
    old_sub.refresh_from_db()
    assert old_sub.remote_id is not None  # kept as history
    assert OutboxEntry.objects.for_object(unpushed).get().state == "done"
    assert WebhookEvent.objects.count() == 1

    assert [r.status for r in push_open()] == [PushOutcome.DONE] * 2
    [created_product] = other_sandbox.objects("product")
    [created_customer] = other_sandbox.objects("customer")
    product.refresh_from_db()
    customer.refresh_from_db()
    assert str(product.remote_id) == created_product["id"] != str(old_product_id)
    assert set(product.confirmed_cycles) == {"months-1"}  # acknowledged by the new service
    assert str(customer.remote_id) == created_customer["id"]
    assert other_sandbox.requests("create_subscription") == []  # never re-pushed
    assert billing_sandbox.requests() == []  # nothing went to the old service


def test_reset_waits_for_entries_a_worker_holds(billing_sandbox, settings):
    from django.utils import timezone

    customers(1, "w")
    OutboxEntry.objects.update(state="in_progress", started_at=timezone.now())
    with pytest.raises(CommandError, match="being pushed by a worker"):
        call_command("billing_service", "reset", "--yes", stdout=StringIO())
    assert OutboxEntry.objects.get().state == "in_progress"


def test_relink_refuses_a_service_that_does_not_know_the_mirror(
    billing_sandbox, other_sandbox, settings
):
    pushed_product()
    point_at_sandbox(settings, other_sandbox)
    with pytest.raises(CommandError, match="does not know the mirror's products"):
        call_command("billing_service", "relink", "--yes", stdout=StringIO())
    assert binding().base_url == billing_sandbox.base_url
    call_command("billing_service", "relink", "--yes", "--force", stdout=StringIO())
    assert binding().base_url == other_sandbox.base_url


def test_relink_and_reset_ask_for_confirmation(billing_sandbox, settings, monkeypatch):
    product = pushed_product()
    point_at(settings, BASE_URL=moved_url(billing_sandbox))

    def no_terminal(prompt=""):
        raise EOFError  # stdin closed: a script that forgot --yes

    for answer in (lambda prompt="": "no", no_terminal):
        monkeypatch.setattr("builtins.input", answer)
        for action in ("relink", "reset"):
            with pytest.raises(CommandError, match="Cancelled"):
                call_command("billing_service", action, stdout=StringIO())
        assert binding().base_url == billing_sandbox.base_url
        product.refresh_from_db()
        assert product.remote_id is not None
    monkeypatch.setattr("builtins.input", lambda prompt="": "yes")
    call_command("billing_service", "relink", stdout=StringIO())
    assert binding().base_url == moved_url(billing_sandbox)


def test_show_tells_recorded_and_configured(billing_sandbox, settings):
    out = StringIO()
    call_command("billing_service", stdout=out)
    assert "none yet" in out.getvalue()
    pushed_product()
    point_at(settings, BASE_URL=moved_url(billing_sandbox))
    out = StringIO()
    call_command("billing_service", "show", stdout=out)
    text = out.getvalue()
    assert billing_sandbox.base_url in text and moved_url(billing_sandbox) in text
    assert "MISMATCH" in text and "1 products" in text
    assert billing_sandbox.client_secret not in text


@pytest.mark.parametrize("action", ["show", "relink", "reset"])
def test_billing_service_names_an_unknown_database_clearly(action):
    with pytest.raises(CommandError, match="nope"):
        call_command("billing_service", action, "--yes", "--database", "nope", stdout=StringIO())


def test_show_counts_failed_outbox_entries_beside_the_pending(billing_sandbox):
    """A push the service refused for good is neither pending nor pushed: show counted only
    the pending, so a mirror whose pushes all fail looked settled."""
    from billing_integration.models import OutboxEntry

    pushed_product()
    make_product("Team plan")
    OutboxEntry.objects.filter(state="pending").update(state="failed")  # refused for good
    out = StringIO()
    call_command("billing_service", stdout=out)
    assert "0 outbox entries pending, 1 failed (billing_sync --retry-failed" in out.getvalue()
