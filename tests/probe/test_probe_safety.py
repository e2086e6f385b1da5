"""``billing_probe`` facing answers that could make it unsafe or dishonest: what it sends to the
service, what it reports, and that it ends with a clear message rather than a traceback."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO

import pytest
import responses
from django.core.management import CommandError, call_command

from billing_integration.client import BillingClient, RetryPolicy
from billing_integration.probe import run_probe, save_answers

pytestmark = pytest.mark.django_db

API = r"http://billing\.test/v1/api/billing"
TOKEN = {"access_token": "probe-token-0123456789", "expires_in": 300}


def a_client() -> BillingClient:
    return BillingClient(
        base_url="http://billing.test",
        auth_url="http://auth.test",
        checkout_url="http://pay.test",
        client_id="app",
        client_secret="the-secret",
        retry=RetryPolicy(max_retries=0),
    )


def answer_lists(products=(), customers=(), subscriptions=()) -> None:
    responses.post(re.compile(r"http://auth\.test/.*"), json=TOKEN)
    responses.get(re.compile(API + r"/products/.+"), status=404, json={})
    for name, items in (
        ("products", products),
        ("customers", customers),
        ("subscriptions", subscriptions),
    ):
        responses.get(re.compile(API + rf"/{name}(\?.*)?$"), json={"data": list(items)})


@pytest.mark.parametrize("auto_renew", ["false", None, "missing"])
@responses.activate
def test_patch_subscription_never_sends_a_renewal_it_did_not_read(auto_renew):
    """The subscription's auto_renew is not a boolean: sending one would change it (true
    resumes renewal, and charges the customer), so nothing is sent."""
    subscription = {"id": "9d0c4bd6-6a4b-4c4e-9d0e-3b1f1c0e6a01", "auto_renew": auto_renew}
    if auto_renew == "missing":
        del subscription["auto_renew"]
    answer_lists(subscriptions=[subscription])
    responses.post(re.compile(API + r"/.*"), status=400, json={})
    responses.patch(re.compile(API + r"/.*"), json={"data": subscription})
    report = run_probe(a_client(), write=True)
    patches = [c for c in responses.calls if c.request.method == "PATCH"]
    assert patches == []
    found = {f.guess: f for f in report.findings}
    assert found["patch_subscription"].verdict == "unknown"
    assert "auto_renew" in found["patch_subscription"].seen


def probe_products(sandbox) -> dict[str, str]:
    return {
        p["name"]: p["status"]
        for p in sandbox.objects("product")
        if p["name"].startswith("billing-probe")
    }


@pytest.mark.django_db(transaction=True)
def test_a_published_probe_product_is_archived_when_a_call_after_publishing_fails(
    billing_sandbox,
):
    """The connection drops on the checkout session: product B, published for it, is still
    archived (a published product can be sold), and the session is unknown, not a crash of
    the whole products check."""
    billing_sandbox.seed(customers=3, subscriptions=2)
    billing_sandbox.faults(operation="create_checkout_session", reset_rate=1.0, count=1)
    report = run_probe(write=True)
    found = {f.guess: f for f in report.findings}
    assert set(probe_products(billing_sandbox).values()) == {"archived"}
    assert found["checkout_session"].verdict == "unknown"
    assert found["status_moves"].verdict == "confirmed", found["status_moves"]
    assert report.exit_code == 0


@pytest.mark.django_db(transaction=True)
def test_an_output_file_that_cannot_be_written_is_refused_before_anything_is_sent(
    billing_sandbox, tmp_path
):
    """Refused up front with a clear message, not a traceback once the writes are done."""
    missing = tmp_path / "no such folder" / "answers.json"
    with pytest.raises(CommandError, match="no such folder") as refused:
        call_command("billing_probe", "--write", "--output", str(missing))
    assert refused.value.returncode == 2
    assert billing_sandbox.requests() == []
    with pytest.raises(CommandError, match="cannot write") as refused:
        call_command("billing_probe", "--output", str(tmp_path))  # a folder
    assert refused.value.returncode == 2


@pytest.mark.parametrize(
    ("products", "check", "seen"),
    [
        ([{"selected_currencies": [{"id": 1}]}], "currencies", "did not expect"),  # unhashable
        ([{"selected_currencies": 1}], "currencies", "did not expect"),  # not a list
        # JSON too deep for Python to parse: read as text, so not a JSON object
        ("[" * 100_000, "token_header", "not a JSON object"),
    ],
)
@responses.activate
def test_an_answer_of_an_unexpected_shape_is_unknown_not_a_traceback(
    products, check, seen, tmp_path
):
    """The check that met it is unknown (with what it met), and the others still run. (A
    currency "²", which ``int()`` refuses, is a code now: the test of the one rule below.)"""
    if isinstance(products, str):
        responses.get(re.compile(API + r"/products(\?.*)?$"), body=products)
    answer_lists(products=[] if isinstance(products, str) else products)
    report = run_probe(a_client())
    found = {f.guess: f for f in report.findings}
    assert found[check].verdict == "unknown" and seen in found[check].seen
    assert {f.guess for f in report.findings} >= {"unknown_id_status", "signing"}
    save_answers(report, tmp_path / "answers.json")


@responses.activate
def test_an_answer_nested_too_deep_to_keep_is_named_not_a_traceback(tmp_path):
    """Parsed, but too deep to scrub and save: a note in its place."""
    answer_lists()  # the first GET /products (the token's check), then the list:
    responses.get(re.compile(API + r"/products(\?.*)?$"), body="[" * 700 + "]" * 700)
    report = run_probe(a_client())
    found = {f.guess: f for f in report.findings}
    assert "nested deeper than" in found["data_wrapping"].seen
    save_answers(report, tmp_path / "answers.json")


class _Endless(BaseHTTPRequestHandler):
    """The token, then GET /products answered with a huge (64 MB) or a slow (a byte every
    0.1 s for 8 s) body; any other list is empty."""

    protocol_version = "HTTP/1.1"
    mode = "huge"

    def log_message(self, *args) -> None:
        pass

    def _json(self, value) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self._json({"access_token": "endless-token-0123456789", "expires_in": 300})

    def do_GET(self) -> None:
        if not self.path.startswith("/v1/api/billing/products"):
            return self._json({"data": []})
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        chunks = [b"x" * 65536] * 1024 if self.mode == "huge" else [b" "] * 80
        try:
            for chunk in [b'{"data": [], "pad": "', *chunks, b'"}']:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                if self.mode == "slow":
                    self.wfile.flush()
                    time.sleep(0.1)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the probe hung up
            pass


@pytest.mark.parametrize("mode", ["huge", "slow"])
def test_a_huge_or_slow_answer_is_not_read_to_its_end(mode, monkeypatch):
    """Bounded memory and time: an answer over the size limit, or still coming after the time
    limit, is dropped (the check is unknown), never read whole."""
    import billing_integration.client.client as client_module

    monkeypatch.setattr(client_module, "RAW_MAX_SECONDS", 1.0, raising=False)
    handler = type("Handler", (_Endless,), {"mode": mode})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        client = BillingClient(
            base_url=url,
            auth_url=url,
            checkout_url=url,
            client_id="app",
            client_secret="the-secret",
            retry=RetryPolicy(max_retries=0),
        )
        started = time.monotonic()
        report = run_probe(client)
        elapsed = time.monotonic() - started
    finally:
        server.shutdown()
        server.server_close()
    found = {f.guess: f for f in report.findings}
    assert found["token"].verdict == "unknown", found
    assert ("bytes" if mode == "huge" else "took over") in found["token"].seen
    assert elapsed < 5


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("status", [503, 429])
@pytest.mark.parametrize(
    ("operation", "guess", "write"),
    [
        ("token", "token_fields", False),
        ("list_products", "token_header", False),  # the first GET /products
        ("list_customers", "data_wrapping", False),
        ("get_product", "unknown_id_status", False),
        ("create_customer", "idempotency_replay", True),
        ("create_product", "product_create", True),
    ],
)
def test_an_unavailable_service_is_no_evidence(billing_sandbox, operation, guess, write, status):
    """One 503 (or 429) answered where a guess is checked: that guess is unknown, not
    contradicted, and the exit status stays 0."""
    billing_sandbox.seed(customers=3, subscriptions=2)
    billing_sandbox.faults(operation=operation, status=status, count=1)
    report = run_probe(write=write)
    found = {f.guess: f for f in report.findings}
    assert found[guess].verdict == "unknown", found[guess]
    assert f"HTTP {status}" in found[guess].seen
    assert report.exit_code == 0, [f for f in report.findings if f.breaks_the_app]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("operation", "guess"),
    [
        ("create_customer", "idempotency_replay"),
        ("create_product", "product_create"),
        ("update_product", "status_moves"),
        ("create_checkout_session", "checkout_session"),
    ],
)
def test_a_lost_write_answer_is_no_evidence(billing_sandbox, operation, guess):
    """A write applied whose answer is lost (200, not JSON): the guess is unknown, not
    contradicted; and a product published that way is archived all the same."""
    billing_sandbox.seed(customers=3, subscriptions=2)
    billing_sandbox.faults(operation=operation, lose_first_answer=True)
    report = run_probe(write=True)
    found = {f.guess: f for f in report.findings}
    assert found[guess].verdict == "unknown", found[guess]
    assert report.exit_code == 0, [f for f in report.findings if f.breaks_the_app]
    assert "published" not in probe_products(billing_sandbox).values()
    if operation == "create_customer":  # the replay named it: the checkout is still probed
        assert found["checkout_session"].verdict == "confirmed", found["checkout_session"]


@pytest.mark.django_db(transaction=True)
def test_a_guesses_setting_is_named_as_it_is_written(billing_sandbox, tmp_path):
    """The text output names BILLING['GUESSES']['patch_auto_renew'], a setting one can write."""
    billing_sandbox.seed(customers=3, subscriptions=2)
    out = StringIO()
    call_command("billing_probe", "--write", "--output", str(tmp_path / "a.json"), stdout=out)
    line = next(x for x in out.getvalue().splitlines() if " patch_subscription:" in x)
    assert "setting: BILLING['GUESSES']['patch_auto_renew']]" in line, line


@pytest.mark.parametrize(
    ("answered", "verdict"), [("upgrade", "confirmed"), ("new", "contradicted")]
)
@responses.activate
def test_a_plan_change_action_holds_only_when_the_session_carries_it(answered, verdict, settings):
    """A service that takes the session but makes it a plain new subscription (the action and
    upgrade_to dropped) would sell a second plan: that is not a confirmation."""
    settings.BILLING = {**settings.BILLING, "GUESSES": {"change_plan_action": "upgrade"}}
    answer_lists()
    ids = iter(f"00000000-0000-4000-8000-{n:012d}" for n in range(1, 100))

    def created(request):
        return 200, {}, json.dumps({"data": {**json.loads(request.body), "id": next(ids)}})

    def session(request):
        body = json.loads(request.body)
        if answered == "new":
            body.update(action="new_subscription", upgrade_to=None)
        return 200, {}, json.dumps({"data": {**body, "id": next(ids), "status": "open"}})

    responses.add_callback("POST", re.compile(API + r"/(customers|products)$"), created)
    responses.add_callback("PATCH", re.compile(API + r"/products/.+"), created)
    responses.add_callback("POST", re.compile(API + r"/checkout_sessions$"), session)
    report = run_probe(a_client(), write=True)
    found = {f.guess: f for f in report.findings}
    assert found["change_plan_action"].verdict == verdict, found["change_plan_action"]


@responses.activate
def test_a_page_is_no_sign_the_token_header_was_read():
    """BASE_URL answering a web page (200, HTML) to GET /products: the token may never have
    been looked at, so token_header is unknown, not confirmed."""
    page = "<html><body>Welcome to our site</body></html>"
    responses.get(re.compile(API + r"/products(\?.*)?$"), body=page, content_type="text/html")
    answer_lists()
    report = run_probe(a_client())
    found = {f.guess: f for f in report.findings}
    assert found["token_header"].verdict == "unknown", found["token_header"]


PRODUCT = "00000000-0000-4000-8000-0000000000aa"


@pytest.mark.parametrize(
    ("subscriptions", "verdict"),
    [
        ([{"product": PRODUCT, "selected_currency": "XOF"}], "confirmed"),
        ([{"product": PRODUCT, "selected_currency": "USD"}], "contradicted"),  # 1 is not XOF
        ([], "unknown"),  # nothing says what 1 stands for
    ],
)
@responses.activate
def test_currency_ids_hold_only_when_a_subscription_names_the_currency(subscriptions, verdict):
    """The ids being in BILLING['CURRENCIES'] does not show they mean the same currencies: a
    subscription of the product, in a currency code, does."""
    products = [{"id": PRODUCT, "selected_currencies": ["1"], "prices": None}]
    answer_lists(products=products, subscriptions=subscriptions)
    report = run_probe(a_client())
    found = {f.guess: f for f in report.findings}
    assert found["currency_ids"].verdict == verdict, found["currency_ids"]


@pytest.mark.parametrize(("status", "verdict"), [(404, "unknown"), (401, "contradicted")])
@responses.activate
def test_a_missing_path_says_nothing_of_the_token_header_or_of_unknown_ids(status, verdict):
    """BASE_URL off by a segment: every path answers 404. That refutes neither the token
    header (a 401 or 403 would) nor confirms an unknown id's 404; and an id asked for with a
    refused token says nothing of its status either."""
    responses.post(re.compile(r"http://auth\.test/.*"), json=TOKEN)
    no_route = {"errors": [{"message": "No route.", "code": "not_found"}]}
    responses.get(re.compile(API + r"/.*"), status=status, json=no_route)
    report = run_probe(a_client())
    found = {f.guess: f for f in report.findings}
    assert found["token_header"].verdict == verdict, found["token_header"]
    assert found["unknown_id_status"].verdict == "unknown", found["unknown_id_status"]


@responses.activate
def test_a_refused_probe_customer_says_nothing_of_replays():
    """POST /customers refused (400, the email say): no object, so no replay to judge."""
    answer_lists()
    refused = {"errors": [{"message": "Invalid email.", "code": "invalid", "field": "email"}]}
    responses.post(re.compile(API + r"/.*"), status=400, json=refused)
    report = run_probe(a_client(), write=True)
    found = {f.guess: f for f in report.findings}
    assert found["idempotency_replay"].verdict == "unknown", found["idempotency_replay"]
    assert found["idempotency_conflict"].verdict == "unknown", found["idempotency_conflict"]
    assert "Invalid email" in found["idempotency_replay"].seen


@responses.activate
def test_a_superscript_digit_is_a_currency_code_not_an_id():
    """A currency "²" passes ``str.isdigit()`` but not ``int()``: the probe reads ids with the
    one rule of ``currencies`` (ASCII digits), so such a value is an unknown currency and the
    checks give their verdicts instead of "could not be checked"."""
    products = [{"id": PRODUCT, "selected_currencies": ["²"], "prices": None}]
    subscriptions = [{"product": PRODUCT, "selected_currency": "²"}]
    answer_lists(products=products, subscriptions=subscriptions)
    report = run_probe(a_client())
    found = {f.guess: f for f in report.findings}
    assert found["currency_ids"].verdict == "contradicted", found["currency_ids"]
    assert "²" in found["currency_ids"].seen
    assert found["subscription_currency_form"].verdict == "contradicted"


@responses.activate
def test_the_report_quotes_the_service_urls_without_their_user_info(tmp_path):
    """A password written in BASE_URL or AUTH_URL (``http://user:pw@host``) is in no report."""
    responses.post(re.compile(r"http://auth\.test/.*"), json=TOKEN)
    responses.get(re.compile(API + r"/.*"), json={"data": []})
    client = BillingClient(
        base_url="http://ops:base-pw@billing.test",
        auth_url="http://ops:auth-pw@auth.test",
        checkout_url="http://pay.test",
        client_id="app",
        client_secret="the-secret",
        retry=RetryPolicy(max_retries=0),
    )
    report = run_probe(client)
    saved = save_answers(report, tmp_path / "answers.json").read_text()
    assert report.base_url == "http://billing.test"
    assert "billing.test" in saved
    for secret in ("base-pw", "auth-pw", "ops:", "the-secret"):
        assert secret not in saved and secret not in str(report.as_dict())
