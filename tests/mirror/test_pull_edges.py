"""Odd data from the service on the pull and push paths (real HTTP to the sandbox, the answers
then altered the way a service with bugs might send them): a row the mapping cannot store is
not applied and is reported; a pull never moves a subscription back nor nulls its version."""

from __future__ import annotations

import io
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from billing_integration.client import get_client
from billing_integration.models import Customer, OutboxEntry, Subscription
from billing_integration.sync.pull import pull_customers, pull_products, pull_subscriptions
from billing_integration.timestamps import parse_timestamp

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tamper(monkeypatch) -> Callable[[str, Callable[[Any], Any]], None]:
    """``tamper(operation, change)``: the client's answers to ``operation`` (e.g.
    ``list_subscriptions``) pass through ``change`` after the real HTTP call (an empty list,
    the page that ends a list, passes unchanged)."""
    client = get_client()
    real = client._call
    changes: dict[str, Callable[[Any], Any]] = {}

    def call(operation: str, *args: Any, **kwargs: Any) -> Any:
        answer = real(operation, *args, **kwargs)
        change = changes.get(operation)
        return change(answer) if change and answer != [] else answer

    monkeypatch.setattr(client, "_call", call)
    return lambda operation, change: changes.__setitem__(operation, change)


def rows_changed(**by_index: dict[str, Any]) -> Callable[[Any], Any]:
    """Change fields of rows of a list answer, by the row's position in the sandbox's list."""

    def change(items: Any) -> Any:
        return [dict(item, **by_index.get(str(i), {})) for i, item in enumerate(items)]

    return change


def pulled(sandbox) -> list[Subscription]:
    sandbox.seed(customers=2, subscriptions=3)
    pull_products()
    pull_customers()
    assert pull_subscriptions().created == 3
    order = [s["id"] for s in sandbox.objects("subscription")]
    return sorted(Subscription.objects.all(), key=lambda s: order.index(str(s.remote_id)))


def test_a_row_with_a_date_that_does_not_parse_is_not_applied_and_reported(small_pages, tamper):
    subs = pulled(small_pages)
    before = {s.pk: (s.cycle_end_date, s.status, s.remote_updated) for s in subs}
    tamper(
        "list_subscriptions",
        rows_changed(**{"0": {"cycle_end_date": "31/12/2026"}, "1": {"status": "canceled"}}),
    )
    counts = pull_subscriptions()
    subs[0].refresh_from_db()
    assert subs[0].cycle_end_date is not None  # never nulled: no access forever
    assert (subs[0].cycle_end_date, subs[0].status, subs[0].remote_updated) == before[subs[0].pk]
    subs[1].refresh_from_db()
    assert subs[1].status == "canceled"  # the rest of the page is applied
    assert counts.errors == 1 and counts.updated == 1 and counts.unchanged == 1
    (message,) = counts.error_messages
    assert str(subs[0].remote_id) in message and "cycle_end_date" in message
    assert "31/12/2026" in message
    assert "1 not applied (bad data)" in str(counts)


def test_a_row_whose_customer_or_product_is_no_uuid_is_not_applied(small_pages, tamper):
    """It was read as "no customer": the subscription lost its subscriber, silently."""
    subs = pulled(small_pages)
    links = [(s.customer_id, s.product_id) for s in subs]
    tamper("list_subscriptions", rows_changed(**{"0": {"customer": 7}, "1": {"product": "pro"}}))
    counts = pull_subscriptions()
    assert counts.errors == 2
    assert "customer: not a UUID: '7'" in counts.error_messages[0]
    assert "product: not a UUID: 'pro'" in counts.error_messages[1]
    for sub in subs:
        sub.refresh_from_db()
    assert [(s.customer_id, s.product_id) for s in subs] == links


def test_billing_sync_lists_the_rows_not_applied_and_fails(small_pages, tamper):
    pulled(small_pages)
    tamper("list_subscriptions", rows_changed(**{"2": {"trial_end_date": 20261231}}))
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError, match="1 row"):
        call_command("billing_sync", "subscriptions", stdout=out, stderr=err)
    assert "subscriptions: 0 created, 0 updated, 2 unchanged, 1 not applied" in out.getvalue()
    assert "trial_end_date" in err.getvalue() and "20261231" in err.getvalue()


def test_a_pull_never_moves_a_subscription_back_nor_nulls_its_version(small_pages, tamper):
    subs = pulled(small_pages)
    # An event newer than the list the pull reads canceled the first one (the seeded rows were
    # never updated: their version is their date_created).
    assert subs[0].remote_updated is None
    newer = timezone.now() + timedelta(minutes=1)  # a service clock ahead, within the tolerance
    assert newer > subs[0].remote_created
    Subscription.objects.filter(pk=subs[0].pk).update(status="canceled", remote_updated=newer)
    counts = pull_subscriptions()
    subs[0].refresh_from_db()
    assert subs[0].status == "canceled" and subs[0].remote_updated == newer
    assert counts.stale == 1 and "1 stale" in str(counts)
    # A row carrying no version at all is applied, but the stored version stays.
    version = subs[1].remote_created + timedelta(minutes=5)
    Subscription.objects.filter(pk=subs[1].pk).update(remote_updated=version)
    tamper(
        "list_subscriptions",
        rows_changed(**{"1": {"date_updated": None, "date_created": None, "status": "paused"}}),
    )
    pull_subscriptions()
    subs[1].refresh_from_db()
    assert subs[1].status == "paused" and subs[1].remote_updated == version


def test_auto_renew_as_text_is_read_as_the_boolean_it_says(small_pages, tamper):
    """ "false" as text means no renewal (``bool("false")`` is True); a value that is no
    boolean is reported, the row not applied."""
    subs = pulled(small_pages)
    Subscription.objects.update(auto_renew=True)
    changed = {"0": {"auto_renew": "false"}, "1": {"auto_renew": " TRUE "}}
    tamper("list_subscriptions", rows_changed(**changed, **{"2": {"auto_renew": "maybe"}}))
    counts = pull_subscriptions()
    renews = dict(Subscription.objects.values_list("pk", "auto_renew"))
    assert [renews[s.pk] for s in subs] == [False, True, True]  # the third unchanged
    assert counts.errors == 1


def test_a_pulled_unknown_currency_id_is_kept_as_received(small_pages, tamper):
    subs = pulled(small_pages)
    tamper("list_subscriptions", rows_changed(**{"0": {"selected_currency": "99"}}))
    counts = pull_subscriptions()
    assert counts.errors == 0 and counts.updated == 1
    subs[0].refresh_from_db()
    assert subs[0].selected_currency == "99"


def test_a_push_answer_with_a_date_that_does_not_parse_keeps_the_id_and_grants_nothing(
    small_pages, tamper
):
    from billing_integration.outbox.push import push_entry

    from .conftest import subscribe
    from .test_outbox import make_product

    product = make_product()
    product.publish()
    sub = subscribe(product, "pusher", "p@example.com")
    others = OutboxEntry.objects.exclude(content_type__model="subscription")
    for entry in others.order_by("pk"):
        assert push_entry(entry.pk).status == "done"  # the product and the customer
    tamper("create_subscription", lambda answer: [dict(answer[0], cycle_end_date="31/12/2026")])
    entry = OutboxEntry.objects.open().get()
    assert push_entry(entry.pk).status == "done"
    sub.refresh_from_db()
    (remote,) = small_pages.objects("subscription")
    assert str(sub.remote_id) == remote["id"]  # linked: never created twice
    assert sub.status == "" and not sub.is_active
    assert not Subscription.objects.active().exists()
    assert "cycle_end_date" in sub.sync_error and "31/12/2026" in sub.sync_error
    assert Customer.objects.get().remote_id is not None


def test_a_nul_anywhere_in_a_pulled_row_never_loses_the_page(small_pages, tamper, caplog):
    """PostgreSQL's ``jsonb`` refuses ``\\u0000`` and a lone surrogate: in a field the app
    ignores, ``remote_data`` keeps U+FFFD and the row is applied; in a mapped field the row is
    reported. The rest of the page is applied either way (it was lost, the pull raising)."""
    subs = pulled(small_pages)
    changed = {
        "0": {"note": "a\x00b", "status": "paused", "extra": {"k\x00": ["\ud800"]}},
        "1": {"selected_billing_cycle": "months\x00-1"},
        "2": {"status": "canceled"},
    }
    tamper("list_subscriptions", rows_changed(**changed))
    counts = pull_subscriptions()
    assert counts.errors == 1 and counts.updated == 2
    (message,) = counts.error_messages
    assert str(subs[1].remote_id) in message and "selected_billing_cycle" in message
    statuses = dict(Subscription.objects.values_list("pk", "status"))
    assert [statuses[s.pk] for s in subs] == ["paused", subs[1].status, "canceled"]
    subs[0].refresh_from_db()
    assert subs[0].remote_data["note"] == "a\ufffdb"
    assert subs[0].remote_data["extra"] == {"k\ufffd": ["\ufffd"]}
    assert "NUL" in caplog.text


def test_a_push_answer_with_a_nul_in_a_mapped_field_keeps_the_id_and_reports(small_pages, tamper):
    """The answer the mapping refuses keeps its id and the raw answer (U+FFFD for the NUL);
    on PostgreSQL the entry stayed in progress, the push raising ``DataError``."""
    from django.contrib.auth import get_user_model

    from billing_integration.customers import get_or_create_customer
    from billing_integration.outbox.push import push_entry

    user = get_user_model().objects.create(username="nul", email="nul@example.com")
    customer, _ = get_or_create_customer(user)
    tamper("create_customer", lambda answer: dict(answer, first_name="A\x00", x="\x00"))
    entry = OutboxEntry.objects.open().get()
    assert push_entry(entry.pk).status == "done"
    entry.refresh_from_db()
    assert entry.state == "done"
    customer.refresh_from_db()
    (remote,) = small_pages.objects("customer")
    assert str(customer.remote_id) == remote["id"]  # linked: never created twice
    assert "first_name" in customer.sync_error and "NUL" in customer.sync_error
    assert customer.remote_data["first_name"] == "A\ufffd"
    assert customer.remote_data["x"] == "\ufffd"


def test_a_lone_surrogate_in_a_mapped_field_is_reported_not_the_page_lost(small_pages, tamper):
    """A JSON escape such as ``"\\ud800"`` gives a string no database driver encodes: the row
    is reported like one with a NUL (the pull raised ``UnicodeEncodeError``, on SQLite too)."""
    small_pages.seed(customers=3)
    assert pull_customers().created == 3
    order = [c["id"] for c in small_pages.objects("customer")]
    tamper(
        "list_customers",
        rows_changed(**{"0": {"first_name": "Jo\ud800"}, "1": {"last_name": "New"}}),
    )
    counts = pull_customers()
    assert counts.errors == 1 and counts.updated == 1
    (message,) = counts.error_messages
    assert order[0] in message and "first_name" in message and "surrogate" in message
    assert Customer.objects.get(remote_id=order[1]).last_name == "New"
    assert "\ud800" not in Customer.objects.get(remote_id=order[0]).first_name


def test_a_value_nested_too_deeply_is_cut_in_remote_data_and_the_row_applied(
    small_pages, tamper, caplog
):
    """A value nested 950 levels deep (Python's JSON reader takes it) made the pull raise
    ``RecursionError`` when the row was written, the page and the pull lost."""
    from billing_integration.mapping.common import MAX_JSON_DEPTH

    small_pages.seed(customers=2)
    assert pull_customers().created == 2
    order = [c["id"] for c in small_pages.objects("customer")]
    deep: Any = []
    for _ in range(950):
        deep = [deep]
    changed = {"0": {"first_name": "Deep", "extra": {"a": deep}}, "1": {"last_name": "New"}}
    tamper("list_customers", rows_changed(**changed))
    counts = pull_customers()
    assert counts.errors == 0 and counts.updated == 2
    first = Customer.objects.get(remote_id=order[0])
    assert first.first_name == "Deep"
    assert Customer.objects.get(remote_id=order[1]).last_name == "New"
    kept, level = first.remote_data["extra"]["a"], 3  # the answer, "extra", "a"
    while kept is not None:
        (kept,) = kept
        level += 1
    assert level == MAX_JSON_DEPTH + 1  # the levels past the limit are stored as null
    assert "nested deeper than" in caplog.text


def test_a_row_that_is_no_object_or_has_no_usable_id_is_reported(small_pages, tamper):
    """A list where the row's object should be, or an id that is no UUID (an integer beyond
    2**63): the row cannot be applied, so it is counted and reported (it was dropped without a
    word), and the rest of the page applied."""
    small_pages.seed(customers=3)
    assert pull_customers().created == 3
    order = [c["id"] for c in small_pages.objects("customer")]

    def change(items: list[Any]) -> list[Any]:
        return [[items[0]], dict(items[1], id=2**70), dict(items[2], last_name="New")]

    tamper("list_customers", change)
    counts = pull_customers()
    assert counts.errors == 2 and counts.updated == 1
    first, second = counts.error_messages
    assert "not an object" in first and "list" in first
    assert str(2**70) in second and "id" in second
    assert Customer.objects.get(remote_id=order[2]).last_name == "New"
    assert Customer.objects.count() == 3


def test_a_number_beyond_a_float_is_stored_as_null_and_the_row_applied(small_pages, tamper):
    """The client reads ``1e400`` as infinity (and ``NaN``), which no JSON column takes: the
    write raised (PostgreSQL's ``jsonb``, SQLite's ``JSON_VALID`` check) and the page was
    lost. Big numbers that are numbers (``1e30``, an integer beyond 2**63) are kept."""
    subs = pulled(small_pages)
    changed = {
        "0": {"amount_due": float("inf"), "status": "paused"},
        "1": {"discount_coupon": {"amount": float("nan"), "big": 2**70, "huge": 1e30}},
        "2": {"status": "canceled"},
    }
    tamper("list_subscriptions", rows_changed(**changed))
    counts = pull_subscriptions()
    assert counts.errors == 0 and counts.updated == 3
    for sub in subs:
        sub.refresh_from_db()
    assert subs[0].status == "paused" and subs[0].remote_data["amount_due"] is None
    coupon = subs[1].discount_coupon
    assert (coupon["amount"], coupon["big"], float(coupon["huge"])) == (None, 2**70, 1e30)
    assert subs[1].remote_data["discount_coupon"] == coupon
    assert subs[2].status == "canceled"


@pytest.mark.parametrize("newer_first", [True, False])
def test_the_same_subscription_twice_in_a_page_applies_its_newer_version(
    small_pages, tamper, newer_first
):
    """The last of the two won, whatever its version: a cancel read first was undone by an
    older copy of the row later in the page."""
    subs = pulled(small_pages)
    base = subs[0].remote_created
    newer = {"status": "canceled", "date_updated": (base + timedelta(hours=2)).isoformat()}
    older = {"status": "paused", "date_updated": (base + timedelta(hours=1)).isoformat()}

    def change(items: list[Any]) -> list[Any]:
        copies = [dict(items[0], **newer), dict(items[0], **older)]
        return [*(copies if newer_first else copies[::-1]), *items[1:]]

    tamper("list_subscriptions", change)
    counts = pull_subscriptions()
    assert counts.errors == 0 and counts.updated == 1 and counts.unchanged == 2
    subs[0].refresh_from_db()
    assert subs[0].status == "canceled"
    assert subs[0].remote_updated == base + timedelta(hours=2)


@pytest.mark.parametrize("resource", ["customers", "subscriptions"])
def test_a_row_on_two_pages_applies_its_newer_copy(small_pages, tamper, resource):
    """The list moved while it was read: a row of the first page comes again on the second,
    changed since. The copy on the first page was kept, the newer one dropped (the client
    skipped ids it had seen): the phone or the cancel was lost until the next pull."""
    small_pages.seed(customers=12, subscriptions=12)
    pull_products(), pull_customers(), pull_subscriptions()
    pages: list[list[Any]] = []
    change = {
        "customers": {"phone": "+221770000001"},
        "subscriptions": {"status": "canceled"},
    }[resource]

    def moved(items: list[Any]) -> list[Any]:
        pages.append(items)
        if len(pages) == 2:  # the second page: the first page's first row, changed since
            first = pages[0][0]
            stamp = parse_timestamp(first["date_updated"] or first["date_created"])
            later = (stamp + timedelta(minutes=1)).isoformat()
            return [*items, dict(first, **change, date_updated=later)]
        return items

    tamper(f"list_{resource}", moved)
    counts = (pull_customers if resource == "customers" else pull_subscriptions)()
    assert len(pages) == 2 and counts.errors == 0
    model = Customer if resource == "customers" else Subscription
    row = model.objects.get(remote_id=pages[0][0]["id"])
    assert {name: getattr(row, name) for name in change} == change
    assert counts.updated == 1 and counts.created == 0


def test_a_page_repeated_with_a_row_that_is_no_object_ends_the_list(
    small_pages, tamper, monkeypatch
):
    """A server that ignores ``offset`` sends its one page again and again, one of its rows
    not an object: that row counted as new each time, so the list went on to ``MAX_PAGES``
    requests (100,000)."""
    monkeypatch.setattr("billing_integration.client.client.MAX_PAGES", 50)
    small_pages.seed(customers=20)
    pages: list[list[Any]] = []

    def stuck(items: list[Any]) -> list[Any]:
        pages.append(items)
        return ["not a customer", *pages[0][1:]]  # always the first page

    tamper("list_customers", stuck)
    counts = pull_customers()
    assert len(pages) == 2  # the repeat ended the list
    assert counts.created == 9 and counts.errors == 1
    assert "not an object" in counts.error_messages[0]


def test_a_service_answering_fewer_rows_a_page_than_asked_is_read_to_the_end(
    billing_sandbox, monkeypatch
):
    """The service caps its pages below the ``limit`` asked (100): its first page, shorter
    than asked, was taken for the last one; the rows after it were never pulled, and the
    pull reported success."""
    billing_sandbox.seed(customers=25)
    client = get_client()
    real = client._call

    def capped(operation, *args, params=None, **kwargs):
        if params is not None:
            params = {**params, "limit": min(int(params["limit"]), 10)}
        return real(operation, *args, params=params, **kwargs)

    monkeypatch.setattr(client, "_call", capped)
    counts = pull_customers()
    assert counts.created == 25 and Customer.objects.count() == 25
    offsets = [r["query"]["offset"] for r in billing_sandbox.requests("list_customers")]
    assert offsets == ["0", "10", "20", "25"]  # the empty page ends the list


def test_a_page_past_the_end_given_as_null_ends_the_list(billing_sandbox, monkeypatch):
    """``{"data": null}`` for an empty page (an empty list, or an offset past the end): the
    pull failed ("data is not a list") and billing_sync with it, every time."""
    billing_sandbox.seed(customers=3)
    client = get_client()
    real = client._call

    def null_when_empty(operation, *args, **kwargs):
        answer = real(operation, *args, **kwargs)
        return None if answer == [] else answer

    monkeypatch.setattr(client, "_call", null_when_empty)
    assert pull_customers().created == 3
    out = io.StringIO()
    call_command("billing_sync", "customers", "--no-progress", stdout=out)
    assert "0 created, 0 updated, 3 unchanged" in out.getvalue()


def test_a_list_longer_than_max_pages_fails_the_pull_after_storing_what_was_read(
    small_pages, monkeypatch
):
    """The list still went on at ``MAX_PAGES`` pages: the pull stopped there and reported
    success, the rows after never pulled."""
    monkeypatch.setattr("billing_integration.client.client.MAX_PAGES", 2)
    small_pages.seed(customers=25)
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError, match="pull failed for customers"):
        call_command("billing_sync", "customers", "--no-progress", stdout=out, stderr=err)
    assert "more than 2 pages" in err.getvalue()
    assert Customer.objects.count() == 20  # the pages read are kept


def test_a_full_page_of_rows_that_are_no_objects_does_not_end_the_list(small_pages, tamper):
    """Rows that are no objects are reported; the pages after theirs are still read."""
    small_pages.seed(customers=15)
    pages: list[list[Any]] = []

    def junk_first(items: list[Any]) -> list[Any]:
        pages.append(items)
        return [[n] for n in range(len(items))] if len(pages) == 1 else items

    tamper("list_customers", junk_first)
    counts = pull_customers()
    assert len(pages) == 2 and counts.errors == 10 and counts.created == 5


def test_a_new_one_time_product_with_its_id_in_capitals_gets_its_prices(billing_sandbox, tamper):
    """A UUID is the same in capitals: the product was created without its root prices (they
    were looked up by the id's text), and shown "not sent" from then on."""
    from billing_integration.models import Product

    body = {"status": "published", "name": "Setup fee", "description": "", "prices": []}
    body.update(selected_currencies=["1"], prices=[{"currency": 1, "amount": 2500}])
    created = get_client().create_product(body)
    tamper("list_products", lambda items: [dict(i, id=str(i["id"]).upper()) for i in items])
    assert pull_products().created == 1
    product = Product.objects.get()
    assert str(product.remote_id) == created["id"]
    assert [(p.currency_id, int(p.amount)) for p in product.root_prices.all()] == [(1, 2500)]


def test_a_push_answered_with_an_array_of_one_links_the_object(small_pages, tamper):
    """The service answers a new subscription as an array of one; a product or customer
    answered so was left unlinked ("the answer carries no id"), and the next change of the
    product created it a second time on the service."""
    from billing_integration.outbox.push import push_entry

    from .test_outbox import make_product

    product = make_product()
    tamper("create_product", lambda answer: [answer])
    entry = OutboxEntry.objects.open().get()
    assert push_entry(entry.pk).status == "done"
    product.refresh_from_db()
    (remote,) = small_pages.objects("product")
    assert str(product.remote_id) == remote["id"]
    assert product.sync_state == "synced" and product.sync_error == ""


def test_a_billing_cycle_given_as_an_object_is_reported_not_stored_as_python_text(
    small_pages, tamper
):
    """``{"cycle": "months", "frequency": 1}`` where the code ``months-1`` is expected was
    stored as Python's text of it (``{'cycle': 'months', ...}``, when it fit the column)."""
    subs = pulled(small_pages)
    cycles = {"0": {"selected_billing_cycle": {"cycle": "months"}}, "1": {"status": "paused"}}
    tamper("list_subscriptions", rows_changed(**cycles))
    counts = pull_subscriptions()
    assert counts.errors == 1 and counts.updated == 1
    (message,) = counts.error_messages
    assert "selected_billing_cycle: not a string" in message
    subs[0].refresh_from_db()
    assert subs[0].selected_billing_cycle == "months-1"


def test_a_subscription_currency_given_as_a_list_is_reported_not_stored_as_python_text(
    small_pages, tamper
):
    """``["XOF"]`` was stored as ``['XOF']`` (Python's text of it fits the 8 characters), a
    currency no setting or report knows."""
    pulled(small_pages)
    changed = {"0": {"selected_currency": ["XOF"]}, "1": {"selected_currency": True}}
    tamper("list_subscriptions", rows_changed(**changed, **{"2": {"status": "paused"}}))
    counts = pull_subscriptions()
    assert counts.errors == 2 and counts.updated == 1
    assert all("selected_currency: not a currency" in m for m in counts.error_messages)
    currencies = set(Subscription.objects.values_list("selected_currency", flat=True))
    assert currencies == {"XOF"}


def test_a_version_from_the_future_does_not_make_every_later_pulled_row_stale(small_pages):
    """A stored ``remote_updated`` of 2099 (a service clock gone wrong, an event that said so)
    made every pulled row of that subscription ``stale`` until 2099: a cancel the service made
    was never pulled. A stored version more than the tolerance ahead of the pull does not make
    it stale; one a little ahead (within the tolerance) still does."""
    subs = pulled(small_pages)
    far = subs[0].remote_created.replace(year=2099)
    ahead = timezone.now() + timedelta(minutes=2)
    Subscription.objects.filter(pk=subs[0].pk).update(status="paused", remote_updated=far)
    Subscription.objects.filter(pk=subs[1].pk).update(status="paused", remote_updated=ahead)
    counts = pull_subscriptions()
    subs[0].refresh_from_db(), subs[1].refresh_from_db()
    assert subs[0].status == "published"
    assert subs[1].status == "paused" and subs[1].remote_updated == ahead
    assert counts.stale == 1


def test_statuses_in_capitals_or_padded_are_read_as_the_interface_spells_them(
    billing_sandbox, tamper
):
    """The interface spells statuses in lower case (``draft``, ``published``, ``archived``); a
    product answered ``" Published "`` is on sale, one answered ``"ARCHIVED"`` is archived, and
    a customer's status is stored the same way."""
    from billing_integration.models import Product

    client = get_client()
    body = {"name": "Plan", "description": "", "prices": [{"currency": 1, "amount": 100}]}
    on_sale = client.create_product({**body, "status": "published", "selected_currencies": ["1"]})
    gone = client.create_product({**body, "status": "archived", "selected_currencies": ["1"]})
    spelled = {on_sale["id"]: " Published ", gone["id"]: "ARCHIVED"}
    tamper("list_products", lambda rows: [dict(r, status=spelled[r["id"]]) for r in rows])
    pull_products()
    statuses = dict(Product.objects.values_list("remote_id", "status"))
    assert {str(k): v for k, v in statuses.items()} == {
        on_sale["id"]: "published",
        gone["id"]: "archived",
    }
    assert list(Product.objects.on_sale().values_list("name", flat=True)) == ["Plan"]
    client.create_customer({"identifier": "c1", "first_name": "A", "last_name": "B", "email": ""})
    tamper("list_customers", lambda rows: [dict(r, status="Published") for r in rows])
    pull_customers()
    assert list(Customer.objects.values_list("status", flat=True)) == ["published"]


def test_a_pulled_subscription_with_a_null_or_missing_customer_or_status_keeps_the_stored_one(
    small_pages, tamper
):
    """A pulled row with ``customer`` or ``status`` null, empty or left out keeps what is stored
    (the rule of the events, ``handlers.carried``): the service never takes those away."""
    subs = pulled(small_pages)
    before = [(s.status, s.customer_id, s.customer_remote_id) for s in subs]
    assert all(status and customer for status, customer, _ in before)

    def change(items: Any) -> Any:
        rows = [dict(item) for item in items]
        rows[0].update(customer=None, status=None)
        rows[1].update(customer="", status="")
        for key in ("customer", "status"):
            rows[2].pop(key)
        return rows

    tamper("list_subscriptions", change)
    counts = pull_subscriptions()
    assert counts.errors == 0
    for s in subs:
        s.refresh_from_db()
    assert [(s.status, s.customer_id, s.customer_remote_id) for s in subs] == before


@pytest.mark.parametrize("empty", [None, ""])
def test_a_pulled_null_auto_renew_keeps_the_stored_one_and_a_new_row_renews(
    small_pages, tamper, empty
):
    """``auto_renew`` null or "" is read as "not sent": a stored subscription keeps its flag,
    and a new one takes the interface's default (true), as when the field is left out. ""
    was an error ("not a boolean"): the row was not pulled."""
    subs = pulled(small_pages)
    Subscription.objects.filter(pk=subs[0].pk).update(auto_renew=False)
    assert Subscription.objects.get(pk=subs[1].pk).auto_renew is True

    def nulled(items: Any) -> Any:
        return [dict(item, auto_renew=empty) for item in items]

    tamper("list_subscriptions", nulled)
    Subscription.objects.filter(pk=subs[2].pk).delete()
    counts = pull_subscriptions()
    assert counts.errors == 0 and counts.created == 1
    flags = dict(Subscription.objects.values_list("remote_id", "auto_renew"))
    assert [flags[s.remote_id] for s in subs] == [False, True, True]


@pytest.mark.parametrize("status", [None, "", "left out"])
def test_a_pulled_product_with_a_null_or_missing_status_keeps_the_stored_one(
    billing_sandbox, tamper, status
):
    """The service never takes a product's status away: a row with a null, empty or missing
    status keeps the stored one (a published product stays on sale); a new one is a draft."""
    from billing_integration.models import Product

    client = get_client()
    body = {"name": "Plan", "description": "", "prices": [{"currency": 1, "amount": 100}]}
    client.create_product({**body, "status": "published", "selected_currencies": ["1"]})
    pull_products()
    assert list(Product.objects.on_sale().values_list("name", flat=True)) == ["Plan"]
    client.create_product(
        {**body, "name": "New", "status": "published", "selected_currencies": ["1"]}
    )

    def no_status(rows: Any) -> Any:
        return [
            {k: v for k, v in r.items() if k != "status"}
            if status == "left out"
            else dict(r, status=status)
            for r in rows
        ]

    tamper("list_products", no_status)
    counts = pull_products()
    assert counts.errors == 0
    assert dict(Product.objects.values_list("name", "status")) == {
        "Plan": "published",
        "New": "draft",
    }


def test_a_pulled_product_leaving_out_its_fields_or_with_a_null_name_keeps_the_stored_ones(
    billing_sandbox, tamper
):
    """A list answer of another shape (a summary without ``description`` or the currencies,
    ``name`` null) keeps the stored values; a field sent (a description emptied) applies."""
    from billing_integration.models import Product

    client = get_client()
    body = {"prices": [{"currency": 1, "amount": 100}], "status": "published"}
    for name in ("One", "Two"):
        client.create_product(
            {**body, "name": name, "description": f"{name} plan", "selected_currencies": ["1"]}
        )
    pull_products()
    stored = {p.name: (p.description, p.selected_currencies) for p in Product.objects.all()}
    assert stored == {"One": ("One plan", [1]), "Two": ("Two plan", [1])}

    def summary(rows: Any) -> Any:
        out = []
        for r in rows:
            r = {k: v for k, v in r.items() if k not in ("description", "selected_currencies")}
            out.append(dict(r, name=None) if r["name"] == "One" else dict(r, description=""))
        return out

    tamper("list_products", summary)
    assert pull_products().errors == 0
    after = {p.name: (p.description, p.selected_currencies) for p in Product.objects.all()}
    assert after == {"One": ("One plan", [1]), "Two": ("", [1])}


def test_a_pulled_customer_leaving_out_its_fields_keeps_the_stored_ones(billing_sandbox, tamper):
    """A customer row without ``email``, ``phone`` or ``status`` keeps the stored ones; a field
    sent applies."""
    client = get_client()
    client.create_customer(
        {"identifier": "c1", "first_name": "Ada", "last_name": "B", "email": "ada@example.com"}
    )
    pull_customers()
    customer = Customer.objects.get()
    Customer.objects.filter(pk=customer.pk).update(phone="+22500000000")
    status = customer.status
    assert status

    def summary(rows: Any) -> Any:
        left_out = ("email", "phone", "status", "address_line_1")
        return [
            dict({k: v for k, v in r.items() if k not in left_out}, first_name="Al") for r in rows
        ]

    tamper("list_customers", summary)
    assert pull_customers().errors == 0
    customer.refresh_from_db()
    kept = (customer.first_name, customer.email, customer.phone, customer.status)
    assert kept == ("Al", "ada@example.com", "+22500000000", status)


def test_a_pulled_product_with_null_currencies_keeps_the_stored_ones(billing_sandbox, tamper):
    """``selected_currencies`` is an array in the interface: null is "not sent" (a service may
    answer null for a list the account may not read), as a field left out is. It emptied the
    stored list, and checkout then refused the product ("no price in any currency")."""
    from billing_integration.models import Product

    body = {"prices": [{"currency": 1, "amount": 100}], "status": "published"}
    get_client().create_product({**body, "name": "One", "selected_currencies": ["1"]})
    pull_products()
    tamper("list_products", lambda rows: [dict(r, selected_currencies=None) for r in rows])
    assert pull_products().errors == 0
    assert Product.objects.get().selected_currencies == [1]


def test_currency_ids_written_with_a_zero_fraction_are_those_ids(billing_sandbox, tamper):
    """1.0 is the JSON number 1 as some writers put it: the product was not applied
    ("Currency 1.0 is not in BILLING['CURRENCIES']") and a subscription stored "1.0"."""
    from billing_integration.models import Product

    body = {"prices": [{"currency": 1, "amount": 100}], "status": "published"}
    get_client().create_product({**body, "name": "One", "selected_currencies": ["1"]})
    tamper("list_products", lambda rows: [dict(r, selected_currencies=[1.0, 99.0]) for r in rows])
    assert pull_products().errors == 0
    assert Product.objects.get().selected_currencies == [1, 99]  # 99 kept, as an id 99 is
    billing_sandbox.seed(customers=1, subscriptions=1)
    pull_products()
    pull_customers()
    tamper("list_subscriptions", rows_changed(**{"0": {"selected_currency": 1.0}}))
    assert pull_subscriptions().errors == 0
    assert Subscription.objects.get().selected_currency == "XOF"


@pytest.mark.parametrize("currency", [1.5, True])
def test_a_root_price_in_a_currency_that_is_no_id_is_reported_not_read_as_another(
    billing_sandbox, tamper, currency
):
    """int() read 1.5 and true as the currency 1: the product was stored with a price in a
    currency the service never named."""
    from billing_integration.models import Price, Product

    body = {"prices": [{"currency": 1, "amount": 100}], "status": "published"}
    get_client().create_product({**body, "name": "One", "selected_currencies": ["1"]})
    prices = [{"currency": currency, "amount": 100}]
    tamper("list_products", lambda rows: [dict(r, prices=prices) for r in rows])
    counts = pull_products()
    assert counts.errors == 1 and "prices" in counts.error_messages[0]
    assert not Product.objects.exists() and not Price.objects.exists()


def test_a_pulled_product_status_the_interface_does_not_list_is_stored_and_logged(
    billing_sandbox, tamper, caplog
):
    """A status other than draft, published or archived is stored as received and the product
    is not sold; the log says so (it was silent: the product just vanished from sale)."""
    from billing_integration.models import Product

    body = {"prices": [{"currency": 1, "amount": 100}], "selected_currencies": ["1"]}
    get_client().create_product({**body, "name": "One", "status": "published"})
    tamper("list_products", lambda rows: [dict(r, status="Active") for r in rows])
    with caplog.at_level(logging.WARNING, logger="billing_integration.mapping"):
        assert pull_products().errors == 0
    assert Product.objects.get().status == "active"
    assert not Product.objects.on_sale().exists()
    assert "Unknown product status 'active'" in caplog.text
