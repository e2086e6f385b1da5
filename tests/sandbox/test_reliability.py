"""Idempotency, the request log, and every fault knob, observed from a plain HTTP client."""

from __future__ import annotations

import threading
import uuid

import pytest
import requests

from .conftest import product_body


class FakeFaultsClock:
    """Stands in for the fault injector's clock and sleep: time moves only on ``advance``;
    a latency or timeout hold is recorded in ``slept`` instead of waited."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


@pytest.fixture
def fake_faults_clock(billing_sandbox_server, monkeypatch) -> FakeFaultsClock:
    clock = FakeFaultsClock()
    faults = billing_sandbox_server.app.faults
    monkeypatch.setattr(faults, "clock", clock)
    monkeypatch.setattr(faults, "sleep", clock.sleep)
    return clock


# -- idempotency ------------------------------------------------------------------------------


def test_same_key_same_body_replays_the_first_response(sandbox, api):
    key = str(uuid.uuid4())
    first = api.post("/customers", {"identifier": "u1"}, key=key)
    second = api.post("/customers", {"identifier": "u1"}, key=key)
    assert first.status_code == second.status_code == 200
    assert second.json() == first.json()
    assert second.headers["x-idempotent-replay"] == "true"
    assert "x-idempotent-replay" not in first.headers
    assert len(api.get("/customers").json()["data"]) == 1


def test_same_key_other_body_is_422(api):
    key = str(uuid.uuid4())
    assert api.post("/customers", {"identifier": "u1"}, key=key).status_code == 200
    response = api.post("/customers", {"identifier": "u2"}, key=key)
    assert response.status_code == 422
    assert response.json()["errors"][0]["code"] == "idempotency_key_reused"
    assert len(api.get("/customers").json()["data"]) == 1


def test_key_order_of_json_fields_does_not_matter(api):
    key = str(uuid.uuid4())
    api.post("/customers", {"identifier": "u1", "email": "a@b.c"}, key=key)
    again = api.post("/customers", {"email": "a@b.c", "identifier": "u1"}, key=key)
    assert again.status_code == 200 and again.headers["x-idempotent-replay"] == "true"


def test_keys_are_scoped_per_path(api):
    key = str(uuid.uuid4())
    assert api.post("/customers", {"identifier": "u1"}, key=key).status_code == 200
    response = api.post("/products", product_body(), key=key)
    assert response.status_code == 200
    assert "x-idempotent-replay" not in response.headers


def test_patch_replays_too(api):
    product = api.product(status="draft")
    key = str(uuid.uuid4())
    first = api.patch(f"/products/{product['id']}", {"status": "published"}, key=key)
    second = api.patch(f"/products/{product['id']}", {"status": "published"}, key=key)
    assert second.json() == first.json() and second.headers["x-idempotent-replay"] == "true"
    assert (
        api.patch(f"/products/{product['id']}", {"status": "archived"}, key=key).status_code == 422
    )


def test_validation_errors_replay(api):
    key = str(uuid.uuid4())
    first = api.post("/customers", {}, key=key)
    second = api.post("/customers", {}, key=key)
    assert first.status_code == second.status_code == 400
    assert second.json() == first.json()


@pytest.mark.parametrize("method", ["post", "patch"])
def test_missing_idempotency_key_is_400(api, method):
    product = api.product()
    path = "/customers" if method == "post" else f"/products/{product['id']}"
    body = {"identifier": "u"} if method == "post" else {"name": "x"}
    response = getattr(api.http, method)(
        api.base + path, json=body, headers={"x-kc-token": api.token}, timeout=5
    )
    assert response.status_code == 400
    assert response.json()["errors"][0]["code"] == "idempotency_key_required"


def test_concurrent_requests_with_one_key_create_one_object(api):
    key = str(uuid.uuid4())
    statuses = []
    errors: list[BaseException] = []

    def send():
        try:
            session = requests.Session()
            response = session.post(
                api.base + "/customers",
                json={"identifier": "same"},
                headers=api.headers(key),
                timeout=10,
            )
            statuses.append((response.status_code, response.json()["data"]["id"]))
        except BaseException as exc:  # re-raised below: a thread's failure fails the test
            errors.append(exc)

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert [t for t in threads if t.is_alive()] == []  # every thread finished
    if errors:
        raise errors[0]
    assert len(statuses) == 8
    assert {s for s, _ in statuses} == {200}
    assert len({i for _, i in statuses}) == 1
    assert len(api.get("/customers").json()["data"]) == 1


# -- request log ------------------------------------------------------------------------------


def test_request_log_records_what_was_received(sandbox, api):
    sandbox.clear_requests()
    key = str(uuid.uuid4())
    api.post("/customers", {"identifier": "logged"}, key=key)
    api.get("/customers", params={"limit": 5})
    entries = sandbox.requests()
    assert [e["operation"] for e in entries] == ["create_customer", "list_customers"]
    created = sandbox.requests("create_customer")[0]
    assert created["method"] == "POST"
    assert created["path"] == "/v1/api/billing/customers"
    assert created["headers"]["x-idempotency-id"] == key
    assert created["headers"]["x-kc-token"] == api.token
    assert created["body"] == {"identifier": "logged"}
    assert created["status"] == 200 and created["outcome"] == "answered"
    assert sandbox.requests("list_customers")[0]["query"] == {"limit": "5"}
    sandbox.token()
    token = sandbox.requests("token")
    assert token[0]["body"]["grant_type"] == "client_credentials"
    sandbox.clear_requests()
    assert sandbox.requests() == []


# -- faults -----------------------------------------------------------------------------------


def test_error_count_with_retry_after(sandbox, api):
    sandbox.faults(operation="create_customer", status=503, retry_after=2, count=2)
    seen = [api.post("/customers", {"identifier": "x"}) for _ in range(3)]
    assert [r.status_code for r in seen] == [503, 503, 200]
    assert seen[0].headers["Retry-After"] == "2"
    assert seen[0].json()["errors"][0]["code"] == "injected_fault"
    assert len(api.get("/customers").json()["data"]) == 1
    assert [e["outcome"] for e in sandbox.requests("create_customer")] == [
        "fault",
        "fault",
        "answered",
    ]


@pytest.mark.parametrize("status", [500, 502, 429, 401])
def test_each_error_status(sandbox, api, status):
    sandbox.faults(operation="list_products", status=status, count=1)
    response = api.get("/products")
    assert response.status_code == status
    if status == 429:
        assert response.headers["Retry-After"] == "1"
    if status == 401:
        assert response.json()["errors"][0]["code"] == "unauthorized"
    assert api.get("/products").status_code == 200


def test_error_rate_is_random_but_seeded(sandbox, api):
    def run():
        sandbox.clear_faults()
        sandbox.faults(operation="list_products", error_rate=0.5, status=502, seed=7)
        return [api.get("/products").status_code for _ in range(20)]

    first, second = run(), run()
    assert first == second
    assert 502 in first and 200 in first


def test_latency(sandbox, api, fake_faults_clock):
    """The latency knob holds the matching operation's answer, and only that operation's."""
    sandbox.faults(operation="get_product", latency=0.3)
    product = api.product()
    assert fake_faults_clock.slept == []  # create_product: no latency
    assert api.get(f"/products/{product['id']}").status_code == 200
    assert fake_faults_clock.slept == [0.3]
    assert api.get("/products").status_code == 200
    assert fake_faults_clock.slept == [0.3]  # list_products: none added


def test_timeout_holds_the_connection(sandbox, api):
    sandbox.faults(operation="create_customer", timeout_rate=1, timeout_seconds=1, count=1)
    with pytest.raises(requests.exceptions.ReadTimeout):
        api.post("/customers", {"identifier": "slow"}, timeout=0.3)
    assert api.get("/customers").json()["data"] == []  # no effect
    assert sandbox.requests("create_customer")[0]["outcome"] == "timeout"


def test_reset_after_commit_loses_the_answer_and_the_retry_replays(sandbox, api):
    sandbox.faults(operation="create_customer", reset_after_commit_rate=1, count=1)
    key = str(uuid.uuid4())
    with pytest.raises(requests.exceptions.ConnectionError):
        api.post("/customers", {"identifier": "lost"}, key=key)
    stored = api.get("/customers").json()["data"]
    assert [c["identifier"] for c in stored] == ["lost"]  # the effect was committed
    retry = api.post("/customers", {"identifier": "lost"}, key=key)
    assert retry.status_code == 200
    assert retry.headers["x-idempotent-replay"] == "true"
    assert retry.json()["data"]["id"] == stored[0]["id"]
    assert len(api.get("/customers").json()["data"]) == 1


def test_reset_before_effect(sandbox, api):
    sandbox.faults(operation="create_customer", reset_rate=1, count=1)
    with pytest.raises(requests.exceptions.ConnectionError):
        api.post("/customers", {"identifier": "never"})
    assert api.get("/customers").json()["data"] == []


def test_outage_window(sandbox, api, fake_faults_clock):
    sandbox.faults(outage_seconds=0.75)
    response = requests.post(
        sandbox.token_url, data={"grant_type": "client_credentials"}, timeout=5
    )
    assert response.status_code == 503 and "Retry-After" in response.headers
    assert api.get("/products").status_code == 503
    assert sandbox.faults()["outage_remaining"] == 0.75  # control endpoints still answer
    fake_faults_clock.advance(0.5)
    assert api.get("/products").status_code == 503  # still inside the window
    fake_faults_clock.advance(0.25)  # the window ends
    assert sandbox.faults()["outage_remaining"] == 0
    assert api.get("/products").status_code == 200


def test_outage_with_resets(sandbox, api):
    sandbox.faults(outage_seconds=5, outage_mode="reset")
    with pytest.raises(requests.exceptions.ConnectionError):
        api.get("/products")
    sandbox.clear_faults()
    assert api.get("/products").status_code == 200


def test_ignore_paging(sandbox, api):
    sandbox.seed(customers=5)
    sandbox.faults(operation="list_customers", ignore_paging=True)
    for offset in (0, 2, 10):
        response = api.get("/customers", params={"limit": 2, "offset": offset})
        assert len(response.json()["data"]) == 5


def test_wildcard_operation_hits_the_token_endpoint(sandbox):
    sandbox.faults(operation="*", status=500, count=1)
    response = requests.post(
        sandbox.token_url,
        data={
            "grant_type": "client_credentials",
            "client_id": "sandbox-client",
            "client_secret": "sandbox-secret",
        },
        timeout=5,
    )
    assert response.status_code == 500
    assert sandbox.token()


def test_fault_specs_are_validated_and_cleared(sandbox, api):
    bad = requests.post(sandbox.url + "/_sandbox/faults", json={"operation": "nope"}, timeout=5)
    assert bad.status_code == 400
    bad = requests.post(sandbox.url + "/_sandbox/faults", json={"colour": "red"}, timeout=5)
    assert bad.status_code == 400
    sandbox.faults(operation="list_products", status=503)
    assert api.get("/products").status_code == 503
    sandbox.clear_faults()
    assert sandbox.faults()["rules"] == []
    assert api.get("/products").status_code == 200
