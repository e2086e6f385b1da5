"""A lost answer is in doubt, not failed: against a sandbox that applies each create and then
answers its first attempt (per idempotency key) with a 200 whose body is not JSON
(``lose_first_answer``); the replay of the key answers normally."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
import requests
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from billing_integration.client import get_client
from billing_integration.customers import get_or_create_customer
from billing_integration.exceptions import BillingAnswerLostError
from billing_integration.models import BillingCycle, Customer, OutboxEntry, Price, Product
from billing_integration.outbox import push
from billing_integration.outbox.push import PushOutcome, push_entry
from billing_integration.outbox.retry import retry_failed
from billing_integration.sync.pull import pull_products

pytestmark = pytest.mark.django_db(transaction=True)


def make_product(name: str = "Pro plan") -> Product:
    with transaction.atomic():
        product = Product.objects.create(
            name=name, description="All features", selected_currencies=[1]
        )
        cycle = BillingCycle.objects.create(product=product, unit="months", frequency=1)
        Price.objects.create(cycle=cycle, currency_id=1, amount=Decimal("10000"))
    return product


def retried_with_its_key(entry: OutboxEntry, key: object) -> None:
    """Staff's retry of the failed ``entry`` keeps ``key``, and its push then succeeds."""
    assert retry_failed() == 1
    entry.refresh_from_db()
    assert entry.idempotency_key == key
    assert push_entry(entry.pk).status == PushOutcome.DONE


def keys_of(calls: list[dict]) -> set[str]:
    return {{k.lower(): v for k, v in c["headers"].items()}["x-idempotency-id"] for c in calls}


def test_the_sandbox_applies_then_loses_the_first_answer_of_each_key(billing_sandbox):
    billing_sandbox.faults(operation="create_customer", lose_first_answer=True)
    url = f"{billing_sandbox.api_url}/customers"
    body = {"identifier": "auth.user:1", "first_name": "A", "last_name": "B", "email": "a@b.c"}
    headers = {"x-kc-token": billing_sandbox.token(), "x-idempotency-id": str(uuid.uuid4())}
    first = requests.post(url, json=body, headers=headers, timeout=10)
    assert first.status_code == 200
    with pytest.raises(ValueError):
        first.json()
    assert len(billing_sandbox.objects("customer")) == 1  # applied all the same
    replay = requests.post(url, json=body, headers=headers, timeout=10)
    assert replay.status_code == 200 and replay.headers["x-idempotent-replay"] == "true"
    assert replay.json()["data"]["id"] == billing_sandbox.objects("customer")[0]["id"]
    outcomes = [c["outcome"] for c in billing_sandbox.requests(operation="create_customer")]
    assert outcomes == ["answer_lost", "answered"]


def test_the_client_resends_a_lost_answer_with_the_same_key(billing_sandbox):
    billing_sandbox.faults(operation="create_customer", lose_first_answer=True)
    body = {"identifier": "auth.user:7", "first_name": "A", "last_name": "B", "email": "a@b.c"}
    created = get_client().create_customer(body)
    calls = billing_sandbox.requests(operation="create_customer")
    assert [c["outcome"] for c in calls] == ["answer_lost", "answered"]
    assert len(keys_of(calls)) == 1
    assert [c["id"] for c in billing_sandbox.objects("customer")] == [created["id"]]


def test_a_lost_answer_is_an_in_doubt_error_without_retries(billing_sandbox, settings, monkeypatch):
    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    billing_sandbox.faults(operation="create_customer", lose_first_answer=True)
    body = {"identifier": "auth.user:8", "first_name": "A", "last_name": "B", "email": "a@b.c"}
    with pytest.raises(BillingAnswerLostError) as info:
        get_client().create_customer(body)
    assert info.value.retryable and info.value.status == 200
    assert "not JSON" in str(info.value) and "<" not in str(info.value)


def test_a_failed_entry_whose_answer_was_lost_is_retried_with_its_key(
    billing_sandbox, settings, monkeypatch
):
    """The issue's story: the entry ends failed, is retried (billing_sync --retry-failed or
    the admin action), and the service must still hold one product, the pull import none."""
    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    monkeypatch.setattr(push, "MAX_ATTEMPTS", 1)
    product = make_product()
    entry = OutboxEntry.objects.get()
    billing_sandbox.faults(operation="create_product", lose_first_answer=True)
    assert push_entry(entry.pk).status == PushOutcome.FAILED
    entry.refresh_from_db()
    assert entry.state == "failed" and entry.in_doubt
    key = entry.idempotency_key

    retried_with_its_key(entry, key)

    remote = billing_sandbox.objects("product")
    assert len(remote) == 1
    assert keys_of(billing_sandbox.requests(operation="create_product")) == {str(key)}
    product.refresh_from_db()
    assert str(product.remote_id) == remote[0]["id"]
    pull_products()
    assert Product.objects.count() == 1


def test_an_entry_once_in_doubt_keeps_its_key_after_a_refusal(
    billing_sandbox, settings, monkeypatch
):
    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    make_product()
    entry = OutboxEntry.objects.get()
    billing_sandbox.faults(operation="create_product", lose_first_answer=True)
    assert push_entry(entry.pk).status == PushOutcome.RETRY
    billing_sandbox.faults(operation="create_product", status=400, count=1)
    assert push_entry(entry.pk).status == PushOutcome.FAILED
    entry.refresh_from_db()
    assert entry.state == "failed" and entry.in_doubt  # the first attempt may have created it
    key = entry.idempotency_key
    retried_with_its_key(entry, key)
    assert len(billing_sandbox.objects("product")) == 1


def test_a_refusal_after_a_lost_answer_within_one_push_keeps_the_entry_in_doubt(
    billing_sandbox, settings, monkeypatch
):
    """The client's own retry: its first attempt is applied and the connection reset before
    the answer; its retry, same key, is refused (401, and again with a fresh token). The push
    fails in doubt: a retry keeps the key, and the service holds one product."""
    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 1)
    monkeypatch.setattr("billing_integration.client.retry.BACKOFF_BASE", 0.01)
    make_product()
    entry = OutboxEntry.objects.get()
    billing_sandbox.faults(operation="create_product", reset_after_commit_rate=1, count=1)
    billing_sandbox.faults(operation="create_product", status=401, count=3)  # 2nd and 3rd calls
    assert push_entry(entry.pk).status == PushOutcome.FAILED
    outcomes = [c["outcome"] for c in billing_sandbox.requests(operation="create_product")]
    assert len(outcomes) == 3 and len(billing_sandbox.objects("product")) == 1
    entry.refresh_from_db()
    assert entry.state == "failed" and entry.in_doubt
    key = entry.idempotency_key

    retried_with_its_key(entry, key)
    assert keys_of(billing_sandbox.requests(operation="create_product")) == {str(key)}
    assert len(billing_sandbox.objects("product")) == 1


def test_a_status_change_whose_answer_was_lost_is_retried_with_its_key_before_the_next(
    billing_sandbox, settings, monkeypatch
):
    """The admin's publish (then archive) of a product: the PATCH is applied, its answer lost
    and its entry fails in doubt; the archive waits behind it, and staff's retry resends the
    publish with its key before the archive goes with its own."""
    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    monkeypatch.setattr(push, "MAX_ATTEMPTS", 1)
    product = make_product()
    assert push_entry(OutboxEntry.objects.get().pk).status == PushOutcome.DONE
    product.refresh_from_db()
    billing_sandbox.faults(operation="update_product", lose_first_answer=True, count=1)
    assert product.status == "draft"
    product.publish()
    publish = OutboxEntry.objects.open().get()
    assert push_entry(publish.pk).status == PushOutcome.FAILED
    product.archive()
    archive = OutboxEntry.objects.open().get()
    assert push_entry(archive.pk).status == PushOutcome.BUSY  # behind the one in doubt

    assert retry_failed() == 1
    assert push_entry(publish.pk).status == PushOutcome.DONE
    assert push_entry(archive.pk).status == PushOutcome.DONE
    calls = billing_sandbox.requests(operation="update_product")
    keys = [{k.lower(): v for k, v in c["headers"].items()}["x-idempotency-id"] for c in calls]
    assert [c["body"]["status"] for c in calls] == ["published", "published", "archived"]
    assert keys[0] == keys[1] == str(publish.idempotency_key) != keys[2]
    assert billing_sandbox.object("product", str(product.remote_id))["status"] == "archived"


def test_a_customer_that_may_exist_is_looked_up_before_it_is_created_again(
    billing_sandbox, settings, monkeypatch
):
    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    user = get_user_model().objects.create_user("carol", email="carol@example.com")
    customer, _ = get_or_create_customer(user)
    entry = OutboxEntry.objects.for_object(customer).get()
    billing_sandbox.faults(operation="create_customer", lose_first_answer=True)
    assert push_entry(entry.pk).status == PushOutcome.RETRY
    entry.refresh_from_db()
    assert entry.in_doubt
    billing_sandbox.clear_requests()

    assert push_entry(entry.pk).status == PushOutcome.DONE
    assert billing_sandbox.requests(operation="create_customer") == []  # found, not re-sent
    assert billing_sandbox.requests(operation="list_customers") != []
    (remote,) = billing_sandbox.objects("customer")
    customer.refresh_from_db()
    assert str(customer.remote_id) == remote["id"]
    assert remote["identifier"] == customer.identifier
    assert Customer.objects.count() == 1


def test_a_customer_listed_with_its_identifier_as_a_number_is_found_not_created_again(
    billing_sandbox, monkeypatch
):
    """The service may answer an identifier of digits as a JSON number: the lookup compared
    42 with "42", found nothing, and created the customer a second time."""
    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    customer = Customer.objects.create(identifier="1042", first_name="Ann")
    entry = OutboxEntry.objects.for_object(customer).get()
    billing_sandbox.faults(operation="create_customer", lose_first_answer=True)
    assert push_entry(entry.pk).status == PushOutcome.RETRY
    client = get_client()
    real = client._call

    def as_numbers(operation: str, *args: object, **kwargs: object) -> object:
        answer = real(operation, *args, **kwargs)
        if operation == "list_customers" and isinstance(answer, list):
            answer = [dict(row, identifier=int(row["identifier"])) for row in answer]
        return answer

    monkeypatch.setattr(client, "_call", as_numbers)
    billing_sandbox.clear_requests()
    assert push_entry(entry.pk).status == PushOutcome.DONE
    assert billing_sandbox.requests(operation="create_customer") == []  # found, not re-sent
    (remote,) = billing_sandbox.objects("customer")
    customer.refresh_from_db()
    assert str(customer.remote_id) == remote["id"]


def test_sync_error_keeps_an_excerpt_of_an_html_error_page(billing_sandbox, settings, monkeypatch):
    """A proxy's 500 page (the sandbox answers JSON, so ``responses`` plays the proxy): the
    entry and the product keep the status, the request id and a bounded excerpt."""
    import responses

    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    monkeypatch.setattr(push, "MAX_ATTEMPTS", 1)
    product = make_product()
    entry = OutboxEntry.objects.get()
    page = "<html><head><style>p {}</style></head><body>" + "<p>Oops</p>" * 2000 + "</body></html>"
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        mock.add_passthru(billing_sandbox.token_url)
        mock.add(
            responses.POST,
            f"{billing_sandbox.api_url}/products",
            body=page,
            status=500,
            content_type="text/html",
            headers={"x-request-id": "req-500"},
        )
        assert push_entry(entry.pk).status == PushOutcome.FAILED
    entry.refresh_from_db()
    product.refresh_from_db()
    for text in (entry.last_error, product.sync_error):
        assert text.startswith("create_product failed with HTTP 500: Oops Oops")
        assert text.endswith("(request id req-500)")
        assert len(text) <= 400 and "<" not in text


def test_retrying_a_refused_create_does_not_jump_ahead_of_a_later_create_in_doubt(
    billing_sandbox, settings, monkeypatch
):
    """A create refused, the product corrected (a second entry), whose create is applied but
    its answer lost; then every failed entry is retried (``billing_sync --retry-failed``).
    The refused entry, older, must not create the product again with a new key before the
    one in doubt is resent with its own."""
    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    product = make_product(name="")
    refused = OutboxEntry.objects.get()
    assert push_entry(refused.pk).status == PushOutcome.FAILED  # the sandbox wants a name
    assert not billing_sandbox.objects("product")
    product.name = "Pro plan (corrected)"
    product.save()
    corrected = OutboxEntry.objects.open().get()
    billing_sandbox.faults(operation="create_product", lose_first_answer=True, count=1)
    assert push_entry(corrected.pk).status == PushOutcome.RETRY
    assert len(billing_sandbox.objects("product")) == 1  # applied, answer lost

    retry_failed()
    for pk in OutboxEntry.objects.open().order_by("pk").values_list("pk", flat=True):
        push_entry(pk)  # what billing_sync --push (or the worker) does, oldest first
    OutboxEntry.objects.filter(pk=corrected.pk).update(next_attempt_at=None)
    for pk in OutboxEntry.objects.open().order_by("pk").values_list("pk", flat=True):
        push_entry(pk)

    (remote,) = billing_sandbox.objects("product")
    product.refresh_from_db()
    assert str(product.remote_id) == remote["id"] and remote["name"] == "Pro plan (corrected)"
    assert not OutboxEntry.objects.filter(state__in=["pending", "in_progress", "failed"]).exists()


def first_answer_changed(monkeypatch, path: str, change) -> None:
    """The sandbox applies the first POST to ``path``; ``change(response)`` alters the answer
    the client gets. Later answers are left as sent."""
    session = get_client().session
    real = session.request
    seen: list[str] = []

    def request(method, url, **kwargs):
        response = real(method, url, **kwargs)
        if method == "POST" and url.endswith(path) and not seen:
            seen.append(url)
            change(response)
        return response

    monkeypatch.setattr(session, "request", request)


def first_answer_without_id(monkeypatch, path: str) -> None:
    """The first answer reaches the client without the object's id (``{"data": {...}}``)."""

    def drop_id(response) -> None:
        body = response.json()
        body["data"].pop("id")
        response._content = json.dumps(body).encode()

    first_answer_changed(monkeypatch, path, drop_id)


def test_a_create_answered_without_its_id_is_resent_with_its_key_not_created_again(
    billing_sandbox, monkeypatch
):
    """A 2xx with no id was recorded done, the product left unlinked: its next change made
    a new create entry, with a new key, and a second product on the service."""
    first_answer_without_id(monkeypatch, "/products")
    product = make_product()
    push_entry(OutboxEntry.objects.get().pk)
    product.refresh_from_db()
    product.name = "Pro plan, renamed"
    product.save()
    for entry in OutboxEntry.objects.open():
        push_entry(entry.pk)

    (remote,) = billing_sandbox.objects("product")
    product.refresh_from_db()
    assert str(product.remote_id) == remote["id"] and remote["name"] == "Pro plan, renamed"
    assert len(keys_of(billing_sandbox.requests(operation="create_product"))) == 1


def first_answer_replaced(monkeypatch, path: str, status: int, body: dict) -> None:
    """The client gets ``status`` and ``body`` instead of the first answer."""

    def replace(response) -> None:
        response.status_code, response._content = status, json.dumps(body).encode()

    first_answer_changed(monkeypatch, path, replace)


def test_a_409_idempotency_conflict_leaves_the_entry_in_doubt(billing_sandbox, monkeypatch):
    """A 409 naming the idempotency key was a plain refusal: the entry failed not in doubt,
    and its retry was built again with a new key, a second product on the service."""
    conflict = {"errors": [{"code": "idempotency_conflict", "message": "Key in use."}]}
    first_answer_replaced(monkeypatch, "/products", 409, conflict)
    product = make_product()
    entry = OutboxEntry.objects.get()
    assert push_entry(entry.pk).status == PushOutcome.FAILED
    entry.refresh_from_db()
    assert entry.in_doubt and "409" in entry.last_error
    retried_with_its_key(entry, entry.idempotency_key)
    (remote,) = billing_sandbox.objects("product")
    product.refresh_from_db()
    assert str(product.remote_id) == remote["id"]
    assert keys_of(billing_sandbox.requests(operation="create_product")) == {
        str(entry.idempotency_key)
    }


def test_an_entry_claimed_again_after_its_worker_died_is_in_doubt(billing_sandbox, monkeypatch):
    """The worker died after its create reached the service; the sweep's push was refused
    (a 400 to the resend): the entry failed not in doubt, and its retry, built again with a
    new key, made a second product."""
    product = make_product()
    entry = OutboxEntry.objects.get()
    real_call = push._call

    def dies(entry, obj, client):
        real_call(entry, obj, client)  # applied, then the worker is gone
        raise SystemExit

    monkeypatch.setattr(push, "_call", dies)
    with pytest.raises(SystemExit):
        push_entry(entry.pk)
    monkeypatch.setattr(push, "_call", real_call)
    OutboxEntry.objects.filter(pk=entry.pk).update(started_at=timezone.now() - timedelta(hours=1))
    billing_sandbox.faults(operation="create_product", status=400, count=1)
    assert push_entry(entry.pk).status == PushOutcome.FAILED
    entry.refresh_from_db()
    assert entry.in_doubt
    retried_with_its_key(entry, entry.idempotency_key)
    (remote,) = billing_sandbox.objects("product")
    product.refresh_from_db()
    assert str(product.remote_id) == remote["id"]


def test_a_create_whose_answer_cannot_be_linked_fails_in_doubt_and_is_not_created_again(
    billing_sandbox, monkeypatch
):
    """The service created the product but answered an id that is no UUID: the entry was
    marked done with the product unlinked and still 'pending', and its next change made a new
    create entry, with a new key, and a second product on the service."""
    session = get_client().session
    real = session.request

    def request(method, url, **kwargs):
        response = real(method, url, **kwargs)
        if method == "POST" and url.endswith("/products"):
            body = response.json()
            body["data"]["id"] = "not-a-uuid"
            response._content = json.dumps(body).encode()
        return response

    monkeypatch.setattr(session, "request", request)
    product = make_product()
    entry = OutboxEntry.objects.get()
    assert push_entry(entry.pk).status == PushOutcome.FAILED
    product.refresh_from_db()
    assert product.sync_state == "failed" and "could not be stored" in product.sync_error
    product.name = "Pro plan, renamed"
    product.save()
    for open_entry in OutboxEntry.objects.open():
        push_entry(open_entry.pk)
    assert len(billing_sandbox.objects("product")) == 1
    entry.refresh_from_db()
    product.refresh_from_db()
    assert entry.state == "failed" and entry.in_doubt
    assert "could not be stored" in entry.last_error
    assert OutboxEntry.objects.open().count() == 1  # the change waits behind it


def test_a_create_answered_303_is_in_doubt_and_retried_with_its_key(
    billing_sandbox, settings, monkeypatch
):
    """A 303 See Other to a create ("done, look there"; not followed: the token stays here) may
    mean the create was applied: the entry fails in doubt, and staff's retry resends its key."""
    import responses

    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    make_product()
    entry = OutboxEntry.objects.get()
    url = f"{billing_sandbox.api_url}/products"
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        mock.add_passthru(billing_sandbox.token_url)
        mock.add(responses.POST, url, status=303, headers={"Location": url + "/p-elsewhere"})
        assert push_entry(entry.pk).status == PushOutcome.FAILED
        (first,) = [c.request for c in mock.calls if c.request.url == url]
    entry.refresh_from_db()
    assert entry.state == "failed" and entry.in_doubt
    assert "redirected to" in entry.last_error and "p-elsewhere" in entry.last_error
    key = entry.idempotency_key
    assert first.headers["x-idempotency-id"] == str(key)

    retried_with_its_key(entry, key)
    assert keys_of(billing_sandbox.requests(operation="create_product")) == {str(key)}
    assert len(billing_sandbox.objects("product")) == 1


def test_a_pull_while_a_product_create_is_in_doubt_makes_no_second_local_product(
    billing_sandbox, monkeypatch
):
    """The create was applied and its answer lost; a pull then read the new product: it made a
    second local product for it, and the create's retry (same key, replayed) could not link the
    first one (its remote id taken) and failed in doubt at every retry. The pull now leaves a
    new product named as a create in doubt to that create's retry."""
    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    billing_sandbox.faults(operation="create_product", lose_first_answer=True)
    product = make_product()
    entry = OutboxEntry.objects.get()
    assert push_entry(entry.pk).status == PushOutcome.RETRY
    (remote,) = billing_sandbox.objects("product")  # applied, answer lost
    product.name = "Pro plan, renamed"  # the name sent is the one the service holds
    product.save()

    counts = pull_products()
    assert counts.skipped == 1 and Product.objects.count() == 1

    OutboxEntry.objects.filter(pk=entry.pk).update(next_attempt_at=None)
    assert push_entry(entry.pk).status == PushOutcome.DONE
    for pk in OutboxEntry.objects.open().values_list("pk", flat=True):  # the rename
        assert push_entry(pk).status == PushOutcome.DONE
    product.refresh_from_db()
    assert str(product.remote_id) == remote["id"] and product.sync_state == "synced"
    assert len(keys_of(billing_sandbox.requests(operation="create_product"))) == 1
    assert billing_sandbox.object("product", remote["id"])["name"] == "Pro plan, renamed"
    assert pull_products().created == 0 and Product.objects.count() == 1


def test_a_pull_still_makes_a_product_of_another_name_beside_a_create_in_doubt(
    billing_sandbox, monkeypatch
):
    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    billing_sandbox.faults(operation="create_product", lose_first_answer=True, count=1)
    make_product()
    assert push_entry(OutboxEntry.objects.get().pk).status == PushOutcome.RETRY
    (sent,) = billing_sandbox.requests(operation="create_product")
    other = get_client().create_product({**sent["body"], "name": "Made on the service"})

    counts = pull_products()
    assert (counts.created, counts.skipped) == (1, 1)
    assert Product.objects.get(remote_id=other["id"]).name == "Made on the service"


def test_a_pull_during_a_product_create_makes_no_second_local_product(billing_sandbox, monkeypatch):
    """A pull that reads the new product while its create's answer is on its way (the entry in
    progress): the row it made took the remote id, and the push failed in doubt."""
    session = get_client().session
    real = session.request
    pulled = []

    def request(method, url, **kwargs):
        response = real(method, url, **kwargs)
        if method == "POST" and url.endswith("/products") and not pulled:
            pulled.append(pull_products())
        return response

    monkeypatch.setattr(session, "request", request)
    product = make_product()
    assert push_entry(OutboxEntry.objects.get().pk).status == PushOutcome.DONE
    assert pulled[0].skipped == 1
    (remote,) = billing_sandbox.objects("product")
    product.refresh_from_db()
    assert str(product.remote_id) == remote["id"] and Product.objects.count() == 1
