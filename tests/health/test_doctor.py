"""``manage.py billing_doctor``: healthy against a running stack (the sandbox over HTTP, a
real worker), and each fault, one at a time, named on its own line with exit status 1."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse
from django.utils import timezone

from billing_integration.health import (
    FACTS,
    PERIODIC_JOBS,
    REFUSALS_WINDOW,
    record_refused,
    record_run,
    refused_deliveries,
)
from billing_integration.models import (
    Customer,
    Heartbeat,
    OutboxEntry,
    Subscription,
    WebhookEvent,
)

from ..mirror.conftest import ROOT, wait_for
from ..webhooks.conftest import OTHER_SECRET, SECRET, envelope, post_signed

pytestmark = pytest.mark.django_db(transaction=True)

#: No worker runs in these tests (except the running-stack ones): leave the ping out.
NO_PING = ("--skip", "workers")


def doctor(*args: str) -> tuple[int, str]:
    """Run the command in this process: (exit status, stdout)."""
    out = io.StringIO()
    try:
        call_command("billing_doctor", *args, stdout=out)
    except CommandError as exc:
        assert str(exc).startswith("unhealthy: ")
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def line(output: str, fact: str) -> str:
    """The one line of ``output`` about ``fact`` (its summary starts with ``fact:``)."""
    (found,) = [row for row in output.splitlines() if row[5:].startswith(f"{fact}:")]
    return found


def failing(output: str) -> list[str]:
    return [row for row in output.splitlines() if row.startswith("FAIL")]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ago(**kwargs: float):
    return timezone.now() - timedelta(**kwargs)


def new_customer(tag: str = "c") -> Customer:
    return Customer.objects.create(
        identifier=tag, first_name="A", last_name="B", email=f"{tag}@example.com"
    )


def new_event(state: str, received_at, n: int = 1) -> WebhookEvent:
    return WebhookEvent.objects.create(
        event_id=f"evt-{state}-{n}",
        raw_type="payment.failed",
        type="payment.failed",
        state=state,
        received_at=received_at,
    )


# --- healthy --------------------------------------------------------------------------------
def test_every_fact_is_healthy_on_a_healthy_stack(healthy, issued_tokens):
    tokens_before = len(healthy.requests(operation="token"))
    status, out = doctor(*NO_PING)
    assert status == 0, out
    assert failing(out) == [] and out.rstrip().endswith("healthy")
    assert "a new token was fetched" in line(out, "token")
    assert len(healthy.requests(operation="token")) == tokens_before + 1  # a fresh one
    assert issued_tokens and not any(t in out for t in issued_tokens)
    assert healthy.client_secret not in out
    assert "is reachable" in line(out, "broker")
    for job in PERIODIC_JOBS:
        assert job in line(out, "beat")
    assert line(out, "pull").startswith("OK") and "subscriptions" in line(out, "pull")


@pytest.mark.worker
@pytest.mark.slow
def test_a_running_stack_with_a_worker_answers_the_ping_and_exits_0(healthy, celery_worker_process):
    worker = celery_worker_process()
    new_customer("pushed")  # through the real worker
    wait_for(lambda: not OutboxEntry.objects.exclude(state="done").exists())
    status, out = doctor("--ping-timeout", "5")
    assert status == 0, out
    assert worker.queue in line(out, "workers") and "answered a ping" in line(out, "workers")
    # As a deployment probe runs it: its own process, exit status 0.
    proc = subprocess.run(
        [sys.executable, "manage.py", "billing_doctor", "--ping-timeout", "5", "--json"],
        cwd=ROOT,
        env=worker.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["healthy"] is True
    facts = {f["key"]: f for f in report["facts"]}
    assert worker.queue in " ".join(facts["workers"]["data"]["workers"])
    assert facts["outbox"]["data"]["open"] == 0


# --- faults, one at a time --------------------------------------------------------------------
def test_token_endpoint_down(healthy):
    healthy.faults(operation="token", status=503)
    before = len(healthy.requests(operation="token"))
    status, out = doctor(*NO_PING)
    assert status == 1
    assert failing(out) == [line(out, "token")]
    assert "could not be fetched" in line(out, "token") and "503" in line(out, "token")
    assert len(healthy.requests(operation="token")) == before + 1  # a probe does not retry


def test_a_wrong_client_secret_fails_the_token_naming_the_settings(healthy, settings):
    settings.BILLING = {**settings.BILLING, "CLIENT_SECRET": "wrong-" + "s3cr3t"}
    status, out = doctor(*NO_PING)
    assert status == 1
    assert failing(out) == [line(out, "token")]
    assert "HTTP 401" in line(out, "token") and "CLIENT_SECRET" in line(out, "token")
    assert line(out, "service").startswith("WARN") and "no token" in line(out, "service")
    assert "s3cr3t" not in out


def test_token_endpoint_unreachable(healthy, settings):
    port = closed_port()
    settings.BILLING = {**settings.BILLING, "AUTH_URL": f"http://127.0.0.1:{port}/auth"}
    status, out = doctor(*NO_PING)
    assert status == 1
    assert failing(out) == [line(out, "token")]
    assert f"127.0.0.1:{port}" in line(out, "token") and "connection failed" in line(out, "token")


def facts_of(out: str) -> dict[str, dict]:
    """The facts of a ``--json`` report by key."""
    return {fact["key"]: fact for fact in json.loads(out)["facts"]}


def test_the_token_fact_quotes_its_url_without_user_info(healthy, settings):
    from billing_integration.conf import billing_settings

    auth = f"127.0.0.1:{closed_port()}/auth"
    settings.BILLING = {**settings.BILLING, "AUTH_URL": f"http://user:pw@{auth}"}
    status, out = doctor(*NO_PING, "--json")
    assert status == 1
    token = f"http://{auth}/realms/{billing_settings.REALM}/protocol/openid-connect/token"
    fact = facts_of(out)["token"]
    assert fact["summary"].startswith(f"token: could not be fetched from {token}: ")
    assert fact["data"]["url"] == token
    assert "pw" not in out and "user" not in out


def test_the_service_fact_quotes_its_url_without_user_info(healthy, settings):
    from billing_integration.models import ServiceBinding

    ServiceBinding.objects.all().delete()
    base = healthy.base_url.split("://", 1)[1] + "/billing"
    settings.BILLING = {**settings.BILLING, "BASE_URL": f"http://user:pw@{base}"}
    status, out = doctor(*NO_PING, "--json")
    assert status == 1
    url = f"http://{base}/v1/api/billing/products"
    fact = facts_of(out)["service"]
    assert fact["summary"].startswith(f"service: {url} could not be read: ")
    assert fact["data"] == {"url": url}
    assert "pw" not in out and "user" not in out


@pytest.mark.parametrize(
    ("setting", "value", "error"),
    [
        (
            "AUTH_URL",
            "closed port",
            "token: connection failed (ConnectionError): check BILLING['AUTH_URL']",
        ),
        (
            "REALM",
            "nowhere",
            "token failed with HTTP 404: no token endpoint at this URL "
            "(check BILLING['AUTH_URL'] and BILLING['REALM']): ",
        ),
        (
            "CLIENT_SECRET",
            "wrong-s3cr3t",
            "token failed with HTTP 401: credentials refused "
            "(check BILLING['CLIENT_ID'] and BILLING['CLIENT_SECRET']): ",
        ),
    ],
)
def test_the_token_fact_names_the_settings_to_check(healthy, settings, setting, value, error):
    from billing_integration.conf import billing_settings

    if setting == "AUTH_URL":
        value = f"http://127.0.0.1:{closed_port()}/auth"
    settings.BILLING = {**settings.BILLING, setting: value}
    status, out = doctor(*NO_PING, "--json")
    assert status == 1
    fact = facts_of(out)["token"]
    url = f"{billing_settings.AUTH_URL}/realms/{billing_settings.REALM}"
    url += "/protocol/openid-connect/token"
    assert fact["summary"].startswith(f"token: could not be fetched from {url}: {error}")
    assert fact["data"]["error"].startswith(error)
    assert "s3cr3t" not in out


def test_a_wrong_base_url_fails_naming_the_setting(healthy, settings):
    """The token comes from AUTH_URL: a BASE_URL with a typo (a new install, nothing recorded
    yet) left every fact healthy while no push or pull could reach the service."""
    from billing_integration.models import ServiceBinding

    ServiceBinding.objects.all().delete()
    wrong = settings.BILLING["BASE_URL"] + "/billing"
    settings.BILLING = {**settings.BILLING, "BASE_URL": wrong}
    status, out = doctor(*NO_PING)
    assert status == 1, out
    assert failing(out) == [line(out, "service")]
    row = line(out, "service")
    assert f"{wrong}/v1/api/billing/products" in row and "HTTP 404" in row
    assert "BILLING['BASE_URL']" in row
    assert line(out, "token").startswith("OK")
    assert healthy.client_secret not in out
    assert not ServiceBinding.objects.exists()  # the doctor records nothing


def test_a_mirror_bound_to_another_service_address_fails_naming_the_way_out(healthy, settings):
    """BASE_URL now names another address than the mirror's service: every push, pull and
    checkout is refused (E010, checked only by migrate), and the doctor said healthy. A mirror
    that holds nothing yet follows the settings: no failure then."""
    from billing_integration.sync.pull import pull_customers

    moved = settings.BILLING["BASE_URL"].replace("127.0.0.1", "localhost")
    settings.BILLING = {**settings.BILLING, "BASE_URL": moved}
    status, out = doctor(*NO_PING)
    assert status == 0 and line(out, "service").startswith("OK"), out

    settings.BILLING = {**settings.BILLING, "BASE_URL": healthy.base_url}
    healthy.seed(customers=1)
    assert pull_customers().created == 1  # the mirror now holds the service's customer
    settings.BILLING = {**settings.BILLING, "BASE_URL": moved}
    status, out = doctor(*NO_PING)
    assert status == 1, out
    assert failing(out) == [line(out, "service")]
    row = line(out, "service")
    assert "BILLING['BASE_URL']" in row and moved in row
    assert "billing_service relink" in row and "billing_service reset" in row


def test_broker_unreachable_in_its_own_process(healthy, tmp_path):
    from ..mirror.conftest import database_url

    port = closed_port()
    billing = healthy.django_settings()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "DATABASE_URL": database_url(),
        "BILLING_BASE_URL": billing["BASE_URL"],
        "BILLING_AUTH_URL": billing["AUTH_URL"],
        "BILLING_CHECKOUT_URL": billing["CHECKOUT_URL"],
        "BILLING_CLIENT_ID": billing["CLIENT_ID"],
        "BILLING_CLIENT_SECRET": billing["CLIENT_SECRET"],
        "CELERY_BROKER_URL": f"amqp://guest:broker-password@127.0.0.1:{port}//",
        "CELERY_TASK_ALWAYS_EAGER": "0",
    }
    proc = subprocess.run(
        [sys.executable, "manage.py", "billing_doctor"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert failing(out) == [line(out, "broker")]
    assert f"127.0.0.1:{port}" in line(out, "broker") and "unreachable" in line(out, "broker")
    assert "broker-password" not in out + proc.stderr
    assert line(out, "workers").startswith("WARN")  # not pinged
    assert "unhealthy: broker" in proc.stderr


def test_no_beat_run_recorded(healthy):
    Heartbeat.objects.filter(name__in=PERIODIC_JOBS).delete()
    status, out = doctor(*NO_PING)
    assert status == 1
    assert failing(out) == [line(out, "beat")]
    assert "no periodic run recorded" in line(out, "beat")


def test_beat_last_ran_too_long_ago(healthy):
    Heartbeat.objects.filter(name__in=PERIODIC_JOBS).update(at=ago(minutes=20))
    status, out = doctor(*NO_PING)
    assert status == 1
    assert failing(out) == [line(out, "beat")]
    assert "20 min ago, more than 5 min" in line(out, "beat")
    assert doctor(*NO_PING, "--max-beat-age", "3600")[0] == 0
    record_run("drain_outbox")  # one job running again is enough
    assert doctor(*NO_PING)[0] == 0


def test_outbox_backlog_too_old(healthy):
    new_customer()
    OutboxEntry.objects.update(created_at=ago(hours=1))
    status, out = doctor(*NO_PING)
    assert status == 1
    assert failing(out) == [line(out, "outbox")]
    assert "1 open entries" in line(out, "outbox") and "waited 60 min" in line(out, "outbox")
    assert doctor(*NO_PING, "--max-outbox-age", "7200")[0] == 0


def test_a_fresh_backlog_is_healthy(healthy):
    new_customer()
    status, out = doctor(*NO_PING)
    assert status == 0, out
    assert "1 open entries" in line(out, "outbox")


def test_failed_outbox_entries(healthy):
    new_customer()
    OutboxEntry.objects.update(state="failed")
    status, out = doctor(*NO_PING)
    assert status == 1
    assert failing(out) == [line(out, "failed entries")]
    assert "1 in the outbox" in line(out, "failed entries")
    assert doctor(*NO_PING, "--max-failed-entries", "1")[0] == 0


def test_failed_events(healthy):
    new_event("failed", ago(minutes=1))
    status, out = doctor(*NO_PING)
    assert status == 1
    assert failing(out) == [line(out, "failed events")]
    assert line(out, "failed events").startswith("FAIL failed events: 1 ")


def test_processing_lag(healthy):
    new_event("processed", ago(minutes=10), n=1)
    new_event("received", ago(minutes=30), n=2)
    status, out = doctor(*NO_PING)
    assert status == 1
    assert failing(out) == [line(out, "events")]
    assert "the oldest unprocessed has waited 30 min, more than 5 min" in line(out, "events")
    assert "the last was received 10 min ago" in line(out, "events")
    assert doctor(*NO_PING, "--max-event-lag", "3600")[0] == 0


def test_last_pull_too_old(healthy):
    Heartbeat.objects.filter(name="pull:customers").update(at=ago(hours=5))
    status, out = doctor(*NO_PING)
    assert status == 1
    assert failing(out) == [line(out, "pull")]
    assert "customers 5.0 h ago" in line(out, "pull")


def test_no_worker_answers_the_ping(healthy):
    status, out = doctor("--ping-timeout", "0.5")
    assert status == 1
    assert failing(out) == [line(out, "workers")]
    assert "no worker answered a ping" in line(out, "workers")


def test_a_broker_without_broadcast_is_said_so_not_failed(healthy, monkeypatch):
    from kombu.transport import filesystem, redis

    from billing_integration.health import celery_app

    transport = type(celery_app().connection_for_write().transport)
    assert transport in (filesystem.Transport, redis.Transport)
    monkeypatch.setattr(
        transport,
        "implements",
        transport.implements.extend(exchange_type=frozenset({"direct", "topic"})),
    )
    status, out = doctor()
    assert status == 0, out
    assert (
        line(out, "workers") == "WARN workers: cannot ping workers with this broker (no broadcast)"
    )


def test_json_output(healthy, issued_tokens):
    new_event("failed", ago(minutes=1))
    out = io.StringIO()
    with pytest.raises(CommandError) as info:
        call_command("billing_doctor", "--json", *NO_PING, stdout=out)
    assert info.value.returncode == 1
    report = json.loads(out.getvalue())
    assert report["healthy"] is False
    facts = {f["key"]: f for f in report["facts"]}
    assert list(facts) == [
        "token",
        "service",
        "broker",
        "beat",
        "outbox",
        "outbox_failed",
        "events",
        "events_failed",
        "events_unrecognised",
        "notices",
        "refused",
        "pull",
        "guesses",
        "plans",
    ]
    assert [k for k, f in facts.items() if f["status"] == "fail"] == ["events_failed"]
    assert facts["events_failed"]["data"] == {"failed": 1}
    assert facts["token"]["data"]["expires_in"] > 0
    assert set(facts["beat"]["data"]["last_runs"]) == set(PERIODIC_JOBS)
    assert not any(t in out.getvalue() for t in issued_tokens)


def test_a_database_it_cannot_read_is_a_failure_not_a_crash(healthy, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(OutboxEntry.objects, "open", broken)
    status, out = doctor(*NO_PING)
    assert status == 1
    assert failing(out) == [line(out, "outbox")]
    assert "could not be checked: database went away" in line(out, "outbox")
    assert line(out, "events").startswith("OK")  # the other facts are still reported


def test_a_binding_it_cannot_read_fails_the_service_fact_alone(healthy, monkeypatch):
    from billing_integration import service

    def broken(*args, **kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(service, "recorded_service", broken)
    status, out = doctor(*NO_PING)
    assert status == 1
    assert failing(out) == [line(out, "service")]
    assert "service: could not be checked: database went away" in out
    assert line(out, "token").startswith("OK")


# --- issue 23: refused deliveries are reported, and fail while they keep coming ---------------
def refused(client, **kwargs) -> None:
    """A delivery the callback refuses (the sender's secret or clock differs from ours)."""
    payload = envelope("ping.test", {"id": str(uuid.uuid4())})
    response = post_signed(client, payload, **kwargs)
    assert response.status_code == 401, response.content


def accepted(client) -> None:
    response = post_signed(client, envelope("ping.test", {"id": str(uuid.uuid4())}))
    assert response.status_code == 200, response.content


def test_deliveries_refused_for_a_wrong_secret_fail_until_one_is_accepted(
    healthy, client, webhook_settings
):
    for _ in range(3):
        refused(client, secret=OTHER_SECRET)  # the service signs with another secret
    status, out = doctor(*NO_PING)
    assert status == 1, out
    assert failing(out) == [line(out, "refused deliveries")]
    row = line(out, "refused deliveries")
    assert "3 in the last hour (bad signature 3)" in row and "none accepted since" in row
    assert "BILLING['WEBHOOK_SECRET']" in row and "registered" in row
    assert SECRET not in out and OTHER_SECRET not in out

    accepted(client)  # the secret fixed: deliveries get through again
    status, out = doctor(*NO_PING)
    assert status == 0, out
    row = line(out, "refused deliveries")
    assert row.startswith("WARN") and "3 in the last hour" in row
    assert "none accepted since" not in row


def test_deliveries_refused_for_a_stale_timestamp_name_the_clock(healthy, client, webhook_settings):
    refused(client, timestamp=int(time.time()) - 3600)  # a server clock an hour off
    status, out = doctor(*NO_PING, "--json")
    assert status == 1
    assert status == 1
    fact = {f["key"]: f for f in json.loads(out)["facts"]}["refused"]
    assert fact["status"] == "fail"
    assert fact["data"]["reasons"] == {"stale_timestamp": 1}
    assert "stale timestamp 1" in fact["summary"] and "clock" in fact["summary"]


def test_deliveries_refused_for_their_size_name_the_setting(healthy, client, webhook_settings):
    """A body over DATA_UPLOAD_MAX_MEMORY_SIZE is neither read nor stored: until one is
    accepted, the fact fails and names the setting."""
    webhook_settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    payload = envelope("ping.test", {"id": str(uuid.uuid4()), "note": "x" * 2000})
    assert post_signed(client, payload).status_code == 413
    status, out = doctor(*NO_PING, "--json")
    assert status == 1
    assert status == 1
    fact = {f["key"]: f for f in json.loads(out)["facts"]}["refused"]
    assert fact["status"] == "fail"
    assert fact["data"]["reasons"] == {"too_large": 1}
    assert "body too large 1" in fact["summary"]
    assert "DATA_UPLOAD_MAX_MEMORY_SIZE" in fact["summary"]


def test_refusals_older_than_the_hour_still_fail_while_none_is_accepted_since(
    healthy, client, webhook_settings, monkeypatch
):
    """The service retries less often than hourly, or gave up: the refusals leave the hour's
    count, but no delivery got through since, so the fact still fails (it was green)."""
    from django.utils import timezone as tz

    for _ in range(3):
        refused(client, secret=OTHER_SECRET)
    real_now = tz.now
    monkeypatch.setattr(tz, "now", lambda: real_now() + timedelta(minutes=70))  # cache too
    status, out = doctor(*NO_PING, "--max-beat-age", "0")
    assert status == 1, out
    assert failing(out) == [line(out, "refused deliveries")]
    row = line(out, "refused deliveries")
    assert "none in the last hour" in row and "70 min ago" in row
    assert "none accepted since" in row and "BILLING['WEBHOOK_SECRET']" in row
    assert SECRET not in out and OTHER_SECRET not in out

    accepted(client)  # the secret fixed: a delivery gets through
    status, out = doctor(*NO_PING, "--max-beat-age", "0")
    assert status == 0, out
    assert line(out, "refused deliveries") == "OK   refused deliveries: none in the last hour"


def test_requests_without_signature_headers_only_warn(healthy, client, webhook_settings):
    response = client.post(reverse("billing_integration:webhook"), data=b"{}", content_type="x")
    assert response.status_code == 400
    status, out = doctor(*NO_PING)
    assert status == 0, out
    row = line(out, "refused deliveries")
    assert row.startswith("WARN") and "missing signature headers 1" in row


@pytest.mark.parametrize("backend", ["locmem.LocMemCache", "dummy.DummyCache"])
def test_refusals_in_a_cache_each_process_keeps_to_itself_are_not_reported_as_none(
    settings, backend
):
    """The web server counts refusals in BILLING['CACHE']; with a local-memory cache the
    doctor (another process) saw none and said "OK ... none in the last hour" while every
    delivery was refused for a wrong secret. It says it cannot see them."""
    settings.CACHES = {
        **settings.CACHES,
        "local": {"BACKEND": f"django.core.cache.backends.{backend}"},
    }
    settings.BILLING = {**settings.BILLING, "CACHE": "local"}
    others = [fact for fact in FACTS if fact != "refused"]
    status, out = doctor("--skip", *others)
    assert status == 0, out
    row = line(out, "refused deliveries")
    assert row.startswith("WARN"), row
    assert backend.split(".")[1] in row and "BILLING['CACHE']" in row and "shared" in row


def test_refusals_are_counted_per_minute_for_the_last_hour_only(healthy, monkeypatch):
    from django.conf import settings
    from django.core.cache import caches

    written: set[str] = set()
    for alias in settings.CACHES:  # whichever cache is the shared one: the keys it is given
        cache = caches[alias]
        for name in ("add", "set", "incr"):
            method = getattr(cache, name)

            def spy(key, *args, _method=method, **kwargs):
                written.add(key)
                return _method(key, *args, **kwargs)

            monkeypatch.setattr(cache, name, spy)
    now = 1_800_000_000.0
    record_refused("bad_signature", now=now - REFUSALS_WINDOW - 120)  # over an hour ago
    record_refused("stale_timestamp", now=now - REFUSALS_WINDOW + 90)
    for _ in range(200):  # a flood: one counter, not one row per request
        record_refused("bad_signature", now=now - 30)
    counts = refused_deliveries(now=now)
    assert counts["bad_signature"] == {"count": 200, "last": now - 30}
    assert counts["stale_timestamp"] == {"count": 1, "last": now - REFUSALS_WINDOW + 90}
    assert counts["missing_headers"] == {"count": 0, "last": None}
    assert 0 < len(written) <= 5  # 3 minutes counted, 2 "last" times


def test_a_minute_of_refusals_is_counted_for_the_hour_on_the_database_cache(settings):
    """The database cache's ``incr`` (the README's cache) writes the key with the cache's
    default timeout (300 s): a minute's counter lost its hour once a second refusal came in
    that minute. ``TIMEOUT: 0`` stands for those 300 s having passed."""
    from django.core.cache import caches

    backend = "django.core.cache.backends.db.DatabaseCache"
    settings.CACHES = {**settings.CACHES, "db": {"BACKEND": backend, "LOCATION": "ttl_cache"}}
    settings.CACHES["db"]["TIMEOUT"] = 0
    settings.BILLING = {**settings.BILLING, "CACHE": "db"}
    call_command("createcachetable", "ttl_cache")
    caches["db"].clear()
    now = 1_800_000_000.0
    for _ in range(3):
        record_refused("bad_signature", now=now - 30)
    assert refused_deliveries(now=now)["bad_signature"] == {"count": 3, "last": now - 30}


def test_help_says_zero_means_no_limit_only_for_the_ages():
    """0 turns an age limit off; for a count it means "none allowed", and a timeout of 0 is
    no wait at all: only the ages say "0 = no limit"."""
    from billing_integration.management.commands.billing_doctor import Command

    parser = Command().create_parser("manage.py", "billing_doctor")
    helps = {a.dest: a.help or "" for a in parser._actions}
    for age in ("max_beat_age", "max_outbox_age", "max_event_lag", "max_pull_age"):
        assert "0 = no limit" in helps[age]
    for other in ("max_failed_entries", "max_failed_events", "timeout", "ping_timeout"):
        assert "no limit" not in helps[other]


@pytest.mark.parametrize(
    "option, value",
    [("--max-beat-age", "-5"), ("--timeout", "nan"), ("--ping-timeout", "inf"),
     ("--max-failed-entries", "-1")],
)  # fmt: skip
def test_a_negative_or_not_finite_limit_is_a_usage_error(option, value):
    with pytest.raises(CommandError, match="non-negative number"):
        call_command("billing_doctor", option, value)


def test_signed_deliveries_refused_for_want_of_a_secret_fail(healthy, client, webhook_settings):
    """Only basic credentials are set, and the service signs its deliveries instead: every
    delivery is refused. It is no scanner's request (it carries a signature), so the fact
    fails until one is accepted, as for a wrong secret; it did only warn, then turned green."""
    webhook_settings.BILLING = {
        **{k: v for k, v in webhook_settings.BILLING.items() if k != "WEBHOOK_SECRET"},
        "WEBHOOK_BASIC_AUTH": "billing:s3cret",
    }
    response = post_signed(client, envelope("ping.test", {"id": str(uuid.uuid4())}))
    assert response.status_code == 401, response.content
    status, out = doctor(*NO_PING)
    assert status == 1, out
    row = line(out, "refused deliveries")
    assert "bad signature 1" in row and "none accepted since" in row
    assert "s3cret" not in out


def test_basic_credentials_refused_for_want_of_the_setting_fail(healthy, client, webhook_settings):
    """Only a secret is set, and the service sends basic credentials, unsigned: refused, and
    the fact fails (it did only warn, as for a scanner's request without headers)."""
    response = client.post(
        reverse("billing_integration:webhook"),
        data=json.dumps(envelope("ping.test", {"id": str(uuid.uuid4())})),
        content_type="application/json",
        HTTP_AUTHORIZATION="Basic YmlsbGluZzpzM2NyZXQ=",  # billing:s3cret
    )
    assert response.status_code == 401, response.content
    status, out = doctor(*NO_PING)
    assert status == 1, out
    row = line(out, "refused deliveries")
    assert "bad signature 1" in row and "none accepted since" in row


def test_a_delivery_redirected_into_a_get_is_refused_and_fails_naming_the_callback_path(
    healthy, live_server, eager
):
    """The callback is registered without its trailing slash: Django redirects the POST
    (APPEND_SLASH), and the service's HTTP client follows the redirect as a GET, without the
    body. That GET was answered 200, like a reachability probe: the service counted the event
    delivered, the event was lost, and every fact stayed green."""
    healthy.set_callback(live_server.url + "/billing/webhooks")  # no trailing slash
    healthy.seed(customers=1, subscriptions=1)
    sub = healthy.objects("subscription")[0]
    envelope_sent = healthy.trigger("subscription.renewal", sub["id"])

    def first_attempt():
        (delivery,) = healthy.deliveries()
        return delivery["log"][0] if delivery["log"] else None

    attempt = wait_for(first_attempt, timeout=20)
    assert attempt["status_code"] == 400  # not 200: the service retries, and can tell
    assert not WebhookEvent.objects.filter(event_id=envelope_sent["id"]).exists()
    status, out = doctor(*NO_PING)
    assert status == 1, out
    row = line(out, "refused deliveries")
    assert row.startswith("FAIL") and "(redirected into a GET " in row  # and its retries
    assert "none accepted since" in row and "/billing/webhooks/" in row
    assert healthy.webhook_secret not in out


def test_customers_back_from_checkout_with_no_event_since_warn_naming_the_callback_path(
    healthy, live_server, eager, product, logged_in, monkeypatch
):
    """The callback is registered at a path the site does not route: every delivery is a 404,
    nothing reaches the app, so nothing is refused. The customer pays and comes back (the return
    page pulls the subscription), and the events fact said 'none received yet', in green."""
    from django.utils import timezone as tz

    from ..checkout.test_return import RETURN, start

    healthy.set_callback(live_server.url + "/billing/hooks/")  # not routed here: 404
    session = start(logged_in, product)
    page = healthy.complete_checkout(str(session.remote_id), "0700000001")
    assert 'data-outcome="success"' in page.text
    assert logged_in.get(RETURN, {"session_id": str(session.remote_id)}).status_code == 200
    attempts = wait_for(lambda: [d["log"][0] for d in healthy.deliveries() if d["log"]])
    assert {a["status_code"] for a in attempts} == {404}
    assert not WebhookEvent.objects.exists()
    real_now = tz.now
    monkeypatch.setattr(tz, "now", lambda: real_now() + timedelta(minutes=10))
    limits = ("--max-beat-age", "0", "--max-pull-age", "0")

    _, out = doctor(*NO_PING, *limits)
    row = line(out, "events")
    assert row.startswith("WARN"), out
    assert "none received yet" in row and "1 checkout" in row
    assert "/billing/webhooks/" in row and "registered" in row
    assert line(out, "refused deliveries").startswith("OK")

    healthy.set_callback(live_server.url + "/billing/webhooks/")  # fixed: one gets through
    pulled = Subscription.objects.get()  # by the return page
    renewal = healthy.trigger("subscription.renewal", str(pulled.remote_id))
    wait_for(lambda: WebhookEvent.objects.filter(event_id=renewal["id"]).exists())
    _, out = doctor(*NO_PING, *limits)
    assert line(out, "events").startswith("OK"), out


def test_a_checkout_left_unpaid_is_no_sign_of_lost_deliveries(
    healthy, live_server, eager, product, logged_in, monkeypatch
):
    """A customer who came back without paying may have nothing for the service to tell: the
    events fact warned 'its deliveries do not seem to reach this site' on a quiet site."""
    from django.utils import timezone as tz

    from ..checkout.test_return import RETURN, start

    session = start(logged_in, product)
    assert logged_in.get(RETURN, {"session_id": str(session.remote_id)}).status_code == 200
    assert not Subscription.objects.exists()
    real_now = tz.now
    monkeypatch.setattr(tz, "now", lambda: real_now() + timedelta(minutes=10))
    _, out = doctor(*NO_PING, "--max-beat-age", "0", "--max-pull-age", "0")
    assert line(out, "events").startswith("OK"), out


def test_skip_given_twice_skips_both_facts(healthy):
    """``--skip workers --skip beat`` skipped the beat only (the last one given): the worker
    ping still failed the run of an operator who asked to leave it out."""
    status, out = doctor("--skip", "workers", "--skip", "beat", "--max-pull-age", "0")
    assert "workers:" not in out and "beat:" not in out
    assert status == 0, out


def test_a_minute_job_that_never_ran_beside_the_others_is_named(healthy):
    """Beat runs, but its schedule lacks the event sweep (another scheduler than Celery's own,
    where W021 cannot look): the newest run was fresh, so the fact was green and the job's
    absence unsaid; a lost event message would never be retried."""
    Heartbeat.objects.filter(name="process_pending_webhook_events").delete()
    status, out = doctor(*NO_PING)
    row = line(out, "beat")
    assert row.startswith("WARN"), out
    assert "process_pending_webhook_events never ran" in row and "schedule" in row
    assert status == 0, out
