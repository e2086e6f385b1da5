"""Where the sandbox used to differ from the interface or be unsafe: a subscription's currency
as an id string, the checkout page's return URL, the webhook secret over HTTP and on the
command line."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from billing_integration.sandbox.server import SandboxServer

from .test_api import sub_body

ROOT = Path(__file__).resolve().parents[2]
SECRET = "whsec_c2FuZGJveC1lZGdlcy10ZXN0LXNlY3JldC0wMQ=="


# --- POST /subscriptions: selected_currency ---------------------------------------------------
def test_subscription_currency_as_an_id_string(sandbox, api):
    product, customer = api.product(), api.customer()
    response = api.post("/subscriptions", sub_body(customer, product, selected_currency="1"))
    assert response.status_code == 200, response.text
    sub = response.json()["data"][0]
    assert sub["selected_currency"] == "XOF"  # responses carry the code (interface 2.3)
    assert sandbox.object("subscription", sub["id"])["selected_currency"] == "XOF"
    usd = api.post("/subscriptions", sub_body(customer, product, selected_currency="2"))
    assert usd.status_code == 200 and usd.json()["data"][0]["selected_currency"] == "USD"


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (1, "invalid_type"),  # a JSON number: the field is typed string
        ("99", "unknown_currency"),
        ("JPY", "unknown_currency"),
        ("3", "currency_not_offered"),  # EUR: known, not one of the product's currencies
    ],
)
def test_subscription_currency_refusals(sandbox, api, value, code):
    product, customer = api.product(), api.customer()
    response = api.post("/subscriptions", sub_body(customer, product, selected_currency=value))
    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert (error["field"], error["code"]) == ("selected_currency", code)
    if code == "invalid_type":
        assert '"XOF"' in error["message"] and '"1"' in error["message"]
    assert sandbox.objects("subscription") == []


# --- the hosted checkout page: no open redirect -----------------------------------------------
EVIL = "https://evil.example/steal?session={session_id}"


def test_checkout_page_never_follows_an_unknown_return_url(sandbox, api):
    sandbox.config(return_url="http://platform.test/back/?session={session_id}")
    session = api.session(api.customer(), api.product())
    page_url = f"{sandbox.checkout_url}/checkout/{session['id']}"
    shown = requests.get(page_url, params={"return_url": EVIL}, timeout=5)
    assert shown.status_code == 400 and 'data-outcome="invalid_return_url"' in shown.text
    assert "evil.example" not in shown.text
    # Paying through a link carrying it: refused before any effect.
    done = sandbox.complete_checkout(session["id"], "0700000001", return_url=EVIL)
    assert done.status_code == 400 and "evil.example" not in done.text
    assert sandbox.object("checkout_session", session["id"])["status"] == "open"
    assert sandbox.objects("payment") == [] and sandbox.events() == []


def test_checkout_page_accepts_only_the_configured_return_url(sandbox, api):
    configured = "http://platform.test/back/?session={session_id}"
    sandbox.config(return_url=configured)
    customer, product = api.customer(), api.product()
    session = api.session(customer, product)
    expected = f"http://platform.test/back/?session={session['id']}"
    for asked in (configured, expected):  # as configured, or filled in
        page = requests.get(
            f"{sandbox.checkout_url}/checkout/{session['id']}",
            params={"return_url": asked},
            timeout=5,
        )
        assert page.status_code == 200 and 'data-outcome="form"' in page.text
    done = sandbox.complete_checkout(session["id"], "0700000001", return_url=expected)
    assert 'data-outcome="success"' in done.text
    assert f'href="{expected}"' in done.text and f"url={expected}" in done.text
    # Nothing configured: no return URL may be named at all.
    sandbox.config(return_url=None)
    other = api.session(customer, product)
    refused = requests.get(
        f"{sandbox.checkout_url}/checkout/{other['id']}", params={"return_url": expected}, timeout=5
    )
    assert refused.status_code == 400


# --- the webhook secret is never answered over HTTP ------------------------------------------
def test_no_control_answer_carries_the_webhook_secret(sandbox, billing_sandbox_server):
    secret = billing_sandbox_server.config.webhook_secret
    answers = [
        requests.post(
            sandbox.url + "/_sandbox/callback", json={"url": "http://127.0.0.1:9/h"}, timeout=5
        ),
        requests.get(sandbox.url + "/_sandbox/callback", timeout=5),
        requests.delete(sandbox.url + "/_sandbox/callback", timeout=5),
        requests.get(sandbox.url + "/_sandbox/config", timeout=5),
        requests.post(sandbox.url + "/_sandbox/config", json={"max_attempts": 3}, timeout=5),
        requests.post(sandbox.url + "/_sandbox/reset", timeout=5),
        requests.get(sandbox.url + "/_sandbox/", timeout=5),
    ]
    for answer in answers:
        assert answer.status_code == 200
        assert secret not in answer.text and "webhook_secret" not in answer.text
    assert requests.get(sandbox.url + "/_sandbox/callback", timeout=5).json() == {"url": None}
    # The handle knows it from the server object, not over HTTP.
    assert sandbox.webhook_secret == secret


def test_the_webhook_secret_can_be_set_but_not_to_garbage(sandbox, billing_sandbox_server):
    before = billing_sandbox_server.config.webhook_secret
    bad = requests.post(
        sandbox.url + "/_sandbox/config",
        json={"webhook_secret": "not-a-secret", "max_attempts": 2},
        timeout=5,
    )
    assert bad.status_code == 400 and "not-a-secret" not in bad.text
    assert billing_sandbox_server.config.webhook_secret == before
    assert billing_sandbox_server.config.max_attempts != 2  # nothing applied
    sandbox.config(webhook_secret=SECRET)
    assert billing_sandbox_server.config.webhook_secret == SECRET == sandbox.webhook_secret


def test_a_handle_without_the_secret_says_where_to_get_it(billing_sandbox_server):
    from billing_integration.testing.helpers import SandboxHandle

    with pytest.raises(RuntimeError, match="BILLING_SANDBOX_WEBHOOK_SECRET"):
        SandboxHandle(billing_sandbox_server.url).webhook_secret
    assert SandboxHandle(billing_sandbox_server.url, webhook_secret=SECRET).webhook_secret == SECRET


# --- the webhook secret is read from the environment, never the command line -----------------
def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def session_members(sid: int) -> list[int]:
    """The processes of session ``sid`` (a process started with ``start_new_session``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid:  # after "pid (comm)": state, ppid, pgrp, session
            pids.append(int(entry.name))
    return pids


def read_printout(proc: subprocess.Popen) -> dict[str, str]:
    lines = {}
    while len(lines) < 6:
        line = proc.stdout.readline()
        assert line, "the sandbox exited before printing its settings"
        if line.startswith("BILLING_") and "=" in line:
            key, value = line.strip().split("=", 1)
            lines[key] = value
    return lines


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_the_cli_reads_the_secret_from_the_environment(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BILLING_SANDBOX_WEBHOOK_SECRET": SECRET}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "billing_integration.sandbox",
            "--port",
            "0",
            "--quiet",
            "--data",
            str(tmp_path / "s.sqlite3"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        printed = read_printout(proc)
        assert printed["BILLING_WEBHOOK_SECRET"] == SECRET  # what it signs with
        assert SECRET not in cmdline(proc.pid)
        assert "billing_integration.sandbox" in cmdline(proc.pid)
    finally:
        stop(proc)
    # The data file keeps it: a restart without the variable signs with the same secret.
    env.pop("BILLING_SANDBOX_WEBHOOK_SECRET")
    server = SandboxServer("127.0.0.1", 0, tmp_path / "s.sqlite3", quiet=True)
    try:
        assert server.config.webhook_secret == SECRET
    finally:
        server.httpd.server_close()
        server.store.close()


def test_the_cli_refuses_a_secret_on_the_command_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "billing_integration.sandbox",
            "--port",
            "0",
            "--memory",
            "--webhook-secret",
            SECRET,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=30,
    )
    assert done.returncode == 2 and "BILLING_SANDBOX_WEBHOOK_SECRET" in done.stderr
    assert SECRET not in done.stderr + done.stdout
    malformed = subprocess.run(
        [sys.executable, "-m", "billing_integration.sandbox", "--port", "0", "--memory"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
        env={**env, "BILLING_SANDBOX_WEBHOOK_SECRET": "whsec_short-and-wrong"},
    )
    assert malformed.returncode == 2 and "BILLING_SANDBOX_WEBHOOK_SECRET" in malformed.stderr
    assert "short-and-wrong" not in malformed.stderr + malformed.stdout


def test_the_management_command_refuses_a_secret_on_the_command_line(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "manage.py"),
            "billing_sandbox",
            "--port",
            "0",
            "--memory",
            "--webhook-secret",
            SECRET,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode != 0 and "BILLING_SANDBOX_WEBHOOK_SECRET" in done.stderr
    assert SECRET not in done.stderr + done.stdout
    malformed = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "billing_sandbox", "--port", "0", "--memory"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "BILLING_SANDBOX_WEBHOOK_SECRET": "x"},
    )
    assert malformed.returncode != 0 and "CommandError" in malformed.stderr


def test_the_demo_procfile_keeps_the_secret_off_every_command_line(tmp_path):
    """The Procfile's ``sandbox`` line, run the way honcho runs it (``sh -c`` with the
    variables of ``demo.env``): no process of it shows the secret in its command line, and
    the sandbox signs with it."""
    procfile = (ROOT / "Procfile").read_text().splitlines()
    [line] = [entry.split(":", 1)[1].strip() for entry in procfile if entry.startswith("sandbox:")]
    demo_env = dict(
        entry.split("=", 1)
        for entry in (ROOT / "example_project" / "demo.env").read_text().splitlines()
        if entry and not entry.startswith("#")
    )
    secret = demo_env["BILLING_WEBHOOK_SECRET"]
    env = {
        **os.environ,
        **demo_env,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "DEMO_SANDBOX_PORT": "0",
        "DEMO_SANDBOX_DATA": str(tmp_path / "sandbox.sqlite3"),
    }
    proc = subprocess.Popen(
        ["/bin/sh", "-c", line],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        printed = read_printout(proc)
        assert printed["BILLING_WEBHOOK_SECRET"] == secret
        members = session_members(proc.pid)
        lines = [cmdline(pid) for pid in members]
        assert any("billing_sandbox" in text for text in lines), lines
        for text in lines:
            assert secret not in text, shlex.split(text)[:3]
    finally:
        stop(proc)


def test_the_webhook_secret_may_lack_its_base64_padding(sandbox, billing_sandbox_server):
    """As the Standard Webhooks libraries (and the app) read it."""
    unpadded = "whsec_RcMPECmZjbpFWxQAzXWlAQ"
    answer = requests.post(
        sandbox.url + "/_sandbox/config", json={"webhook_secret": unpadded}, timeout=5
    )
    assert answer.status_code == 200, answer.text
    assert billing_sandbox_server.config.webhook_secret == unpadded


# --- the token endpoint: client credentials in the form or with HTTP Basic ---------------------
def _token(sandbox, **kwargs):
    return requests.post(sandbox.token_url, timeout=5, **kwargs)


def test_token_with_http_basic_client_credentials(sandbox, api):
    """``client_secret_basic`` (the default of Authlib and requests-oauthlib), as an OpenID
    Connect server accepts it: the form-urlencoded id and secret in an Authorization header."""
    answer = _token(
        sandbox,
        data={"grant_type": "client_credentials"},
        auth=(sandbox.client_id, sandbox.client_secret),
    )
    assert answer.status_code == 200, answer.text
    token = answer.json()["access_token"]
    assert api.get("/products", headers={"x-kc-token": token}).status_code == 200
    wrong = _token(
        sandbox, data={"grant_type": "client_credentials"}, auth=(sandbox.client_id, "nope")
    )
    assert wrong.status_code == 401 and wrong.json()["error"] == "invalid_client"
    assert sandbox.client_secret not in wrong.text


def test_token_with_form_client_credentials_still_works(sandbox):
    answer = _token(
        sandbox,
        data={
            "grant_type": "client_credentials",
            "client_id": sandbox.client_id,
            "client_secret": sandbox.client_secret,
        },
    )
    assert answer.status_code == 200 and answer.json()["token_type"] == "Bearer"
    missing = _token(sandbox, data={"grant_type": "client_credentials"})
    assert missing.status_code == 401 and missing.json()["error"] == "invalid_client"


# --- the control endpoints: no cross-site request changes the sandbox ------------------------
@pytest.mark.parametrize(
    "headers",
    [
        # a form or fetch() of another site: text/plain needs no preflight, and the body is JSON
        {"Origin": "https://evil.example", "Content-Type": "text/plain"},
        {"Origin": "null", "Content-Type": "text/plain"},
        {"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"},
    ],
)
def test_control_endpoints_refuse_cross_site_requests(sandbox, headers):
    before = sandbox.config()["return_url"]
    evil = json.dumps({"return_url": "https://evil.example/steal"})
    refused = requests.post(f"{sandbox.url}/_sandbox/config", data=evil, headers=headers, timeout=5)
    assert refused.status_code == 403
    assert requests.get(f"{sandbox.url}/_sandbox/config", timeout=5).json()["return_url"] == before
    gone = requests.post(f"{sandbox.url}/_sandbox/reset", data="{}", headers=headers, timeout=5)
    assert gone.status_code == 403


def test_control_endpoints_take_their_own_pages_and_scripts(sandbox):
    own = {"Origin": sandbox.url, "Sec-Fetch-Site": "same-origin"}
    body = {"return_url": "http://platform.test/back/"}
    answer = requests.post(f"{sandbox.url}/_sandbox/config", json=body, headers=own, timeout=5)
    assert answer.status_code == 200 and answer.json()["return_url"] == body["return_url"]
    script = requests.post(f"{sandbox.url}/_sandbox/config", json={"return_url": None}, timeout=5)
    assert script.status_code == 200 and script.json()["return_url"] is None


# --- the Host header: no page of another site, its name pointed here, drives the sandbox ---
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/_sandbox/config"),
        ("POST", "/_sandbox/reset"),
        ("POST", "/auth/realms/sandbox/protocol/openid-connect/token"),
        ("GET", "/v1/api/billing/products"),
        ("GET", "/checkout/anything"),
    ],
)
@pytest.mark.parametrize("host", ["evil.example", "rebind.evil.example:{port}", "10.0.0.1"])
def test_a_request_naming_another_host_is_refused(sandbox, method, path, host):
    """DNS rebinding: a page of ``evil.example``, the name then resolved to 127.0.0.1, is of
    the sandbox's origin for the browser, but sends ``Host: evil.example``."""
    sandbox.config(return_url="http://platform.test/back/")
    headers = {
        "Host": host.format(port=urlsplit(sandbox.url).port),
        "Content-Type": "application/json",
    }
    answer = requests.request(method, f"{sandbox.url}{path}", headers=headers, timeout=5)
    assert answer.status_code == 400
    assert answer.json()["errors"][0]["code"] == "unknown_host"
    assert sandbox.config()["return_url"] == "http://platform.test/back/"  # nothing reset


@pytest.mark.parametrize(
    "host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "app.localhost", "[::1]:{port}"]
)
def test_loopback_names_are_served(sandbox, host):
    headers = {"Host": host.format(port=urlsplit(sandbox.url).port)}
    answer = requests.get(f"{sandbox.url}/_sandbox/health", headers=headers, timeout=5)
    assert answer.status_code == 200


def test_allowed_hosts_are_served():
    server = SandboxServer("127.0.0.1", 0, None, quiet=True, allowed_hosts=["Sandbox.Test"]).start()
    try:
        for host, status in [("sandbox.test", 200), ("SANDBOX.test:80", 200), ("other.test", 400)]:
            answer = requests.get(
                f"{server.url}/_sandbox/health", headers={"Host": host}, timeout=5
            )
            assert answer.status_code == status, host
    finally:
        server.stop()
