"""Running the sandbox: persistence across restarts, the CLI printout, management commands."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from io import StringIO
from pathlib import Path

import pytest
import requests
from django.core.management import call_command

from billing_integration.sandbox.server import SandboxServer

ROOT = Path(__file__).resolve().parents[2]


def token(url: str) -> str:
    return requests.post(
        url + "/auth/realms/sandbox/protocol/openid-connect/token",
        data={
            "grant_type": "client_credentials",
            "client_id": "sandbox-client",
            "client_secret": "sandbox-secret",
        },
        timeout=5,
    ).json()["access_token"]


def test_state_persists_across_restarts(tmp_path):
    data = tmp_path / "sandbox.sqlite3"
    server = SandboxServer("127.0.0.1", 0, data, quiet=True).start()
    try:
        headers = {"x-kc-token": token(server.url), "x-idempotency-id": str(uuid.uuid4())}
        created = requests.post(
            server.url + "/v1/api/billing/customers",
            headers=headers,
            json={"identifier": "kept"},
            timeout=5,
        ).json()["data"]
        secret = server.config.webhook_secret
        requests.post(server.url + "/_sandbox/clock/advance", json={"seconds": 100}, timeout=5)
    finally:
        server.stop()
    server = SandboxServer("127.0.0.1", 0, data, quiet=True).start()
    try:
        headers = {"x-kc-token": token(server.url)}
        listed = requests.get(
            server.url + "/v1/api/billing/customers", headers=headers, timeout=5
        ).json()["data"]
        assert listed == [created]
        assert server.config.webhook_secret == secret  # generated once, then kept
        assert requests.get(server.url + "/_sandbox/clock", timeout=5).json()["offset"] == 100
        # the idempotency record survived too
        replay = requests.post(
            server.url + "/v1/api/billing/customers",
            headers={**headers, "x-idempotency-id": "k1"},
            json={"identifier": "x"},
            timeout=5,
        )
        assert replay.status_code == 200
    finally:
        server.stop()
    server = SandboxServer("127.0.0.1", 0, data, quiet=True, reset=True).start()
    try:
        listed = requests.get(
            server.url + "/v1/api/billing/customers",
            headers={"x-kc-token": token(server.url)},
            timeout=5,
        ).json()
        assert listed == {"data": []}
    finally:
        server.stop()


def test_reset_keeps_config_unless_asked(sandbox):
    sandbox.set_callback("http://127.0.0.1:9/hook")
    secret = sandbox.webhook_secret
    requests.post(sandbox.url + "/_sandbox/reset", timeout=5)
    sandbox._config = None
    assert sandbox.config()["callback_url"] == "http://127.0.0.1:9/hook"
    assert sandbox.webhook_secret == secret
    requests.post(sandbox.url + "/_sandbox/reset", json={"config": True}, timeout=5)
    sandbox._config = None
    assert sandbox.config()["callback_url"] is None
    assert sandbox.webhook_secret != secret


def test_cli_prints_the_settings_to_paste(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "BILLING_SANDBOX_WEBHOOK_SECRET": "whsec_dGVzdHNlY3JldHRlc3RzZWNyZXQ=",
    }
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
            "--client-id",
            "cli-client",
            "--client-secret",
            "cli-secret",
            "--token-lifetime",
            "42",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        lines = dict(proc.stdout.readline().strip().split("=", 1) for _ in range(6))
        assert set(lines) == {
            "BILLING_BASE_URL",
            "BILLING_AUTH_URL",
            "BILLING_CHECKOUT_URL",
            "BILLING_CLIENT_ID",
            "BILLING_CLIENT_SECRET",
            "BILLING_WEBHOOK_SECRET",
        }
        assert lines["BILLING_AUTH_URL"] == lines["BILLING_BASE_URL"] + "/auth"
        assert lines["BILLING_CLIENT_ID"] == "cli-client"
        assert lines["BILLING_WEBHOOK_SECRET"] == "whsec_dGVzdHNlY3JldHRlc3RzZWNyZXQ="
        response = requests.post(
            lines["BILLING_AUTH_URL"] + "/realms/sandbox/protocol/openid-connect/token",
            data={
                "grant_type": "client_credentials",
                "client_id": "cli-client",
                "client_secret": "cli-secret",
            },
            timeout=5,
        )
        assert response.json()["expires_in"] == 42
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def test_trigger_command(sandbox, api):
    sub = api.post(
        "/subscriptions",
        {
            "customer": api.customer()["id"],
            "product": api.product()["id"],
            "selected_currency": "XOF",
            "selected_billing_cycle": "months-1",
        },
    ).json()["data"][0]
    out = StringIO()
    call_command(
        "billing_trigger",
        "subscription.canceled",
        sub["id"],
        "--sandbox-url",
        sandbox.url,
        stdout=out,
    )
    assert '"subscription.canceled"' in out.getvalue()
    assert sandbox.events()[0]["data"]["status"] == "canceled"


def test_trigger_command_at_a_web_page_is_a_command_error():
    """``--sandbox-url`` naming a web site that answers 200 with HTML: a CommandError that
    says so, not a traceback."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from django.core.management.base import CommandError

    class Page(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>Welcome</html>")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(CommandError, match="without JSON: is it the sandbox"):
            call_command("billing_trigger", "subscription.canceled", "x", "--sandbox-url", url)
    finally:
        server.shutdown()


def test_fixture_points_django_settings_at_the_sandbox(sandbox, settings):
    from billing_integration.conf import billing_settings

    assert settings.BILLING["BASE_URL"] == sandbox.url
    assert sandbox.url + "/auth" == billing_settings.AUTH_URL
    assert sandbox.url == billing_settings.CHECKOUT_URL
    assert billing_settings.CLIENT_ID == "sandbox-client"
    assert sandbox.webhook_secret == billing_settings.WEBHOOK_SECRET


@pytest.mark.parametrize("_", range(2))
def test_fixture_resets_between_tests(sandbox, api, _):
    assert api.get("/customers").json()["data"] == []
    assert sandbox.requests("create_customer") == []
    assert sandbox.faults()["rules"] == []
    api.post("/customers", {"identifier": "left-behind"})
    sandbox.faults(operation="list_products", status=503)
    sandbox.advance(10)
    time.sleep(0)


@pytest.mark.parametrize("reset", [False, True])
def test_data_naming_another_file_is_refused_and_kept(tmp_path, reset):
    """``--data db.sqlite3 --reset`` (the project's database) or a source file: refused with
    a message, the file neither written into nor deleted."""
    import sqlite3

    from billing_integration.sandbox.server import SandboxStartError

    project_db = tmp_path / "db.sqlite3"
    conn = sqlite3.connect(project_db)
    conn.execute("CREATE TABLE auth_user (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    source = tmp_path / "settings.py"
    source.write_text("DEBUG = True\n")
    for path in (project_db, source):
        before = path.read_bytes()
        with pytest.raises(SandboxStartError, match="not a sandbox data file"):
            SandboxServer("127.0.0.1", 0, path, quiet=True, reset=reset)
        assert path.read_bytes() == before
    conn = sqlite3.connect(project_db)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    conn.close()
    assert tables == {"auth_user"}
