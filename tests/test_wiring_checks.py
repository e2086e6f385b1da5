"""System checks of the wiring a host project must provide (``check_wiring``): a Celery app
and broker (E020, E021), the shared cache (W020, E023), DRF installed where its API is routed
(E022), CSRF and MANAGERS where the billing forms are routed (W022, W023; W023 is shown with
its effect in tests/checkout/test_changes.py), the beat schedule (W021), USE_TZ on (E025), the
event callback routed (W024).
None of them touches the database, the broker or a cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import celery._state
import pytest
from celery import Celery
from django.contrib import admin
from django.core.checks import run_checks
from django.template import TemplateDoesNotExist
from django.test import modify_settings
from django.urls import path

from billing_integration.checks import check_wiring
from billing_integration.schedule import BEAT_SCHEDULE

ROOT = Path(__file__).resolve().parents[1]
LOCMEM = "django.core.cache.backends.locmem.LocMemCache"
DUMMY = "django.core.cache.backends.dummy.DummyCache"
WIRING = ("E020", "E021", "E022", "E023", "E025", "W020", "W021", "W022", "W023", "W024")


def ids(errors) -> list[str]:
    return sorted(e.id.removeprefix("billing_integration.") for e in errors)


def wiring(errors) -> list[str]:
    return [i for i in ids(errors) if i in WIRING]


@pytest.fixture
def host_app(monkeypatch):
    """Make a Celery app with the given configuration the current one (as a host's
    ``proj/celery.py`` would), for this test only."""
    monkeypatch.setattr(celery._state, "default_app", celery._state.default_app)
    monkeypatch.setattr(celery._state._tls, "current_app", celery._state._tls.current_app)
    for var in ("CELERY_BROKER_URL", "CELERY_BROKER_WRITE_URL"):
        monkeypatch.delenv(var, raising=False)

    def make(**conf) -> Celery:
        app = Celery("host", fixups=[], set_as_current=True)
        app.conf.update(conf)
        return app

    return make


GOOD_CELERY = {"broker_url": "redis://127.0.0.1:6379/0", "beat_schedule": {**BEAT_SCHEDULE}}


def test_the_example_project_produces_none_of_them():
    assert wiring(run_checks()) == []
    # And as a deployment runs it: its own process, its own settings and Celery app.
    proc = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "example_project.settings"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "billing_integration" not in proc.stdout + proc.stderr


def test_a_bare_host_project_is_refused_by_name(tmp_path):
    """A project that never created proj/celery.py, with a per-process cache and no
    rest_framework: ``manage.py check`` fails and names each problem."""
    proc = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.bare_project.settings",
            "BARE_PROJECT_DB": str(tmp_path / "db.sqlite3"),
            "PYTHONPATH": str(ROOT),
        },
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    for check_id in ("E020", "E022", "W020", "W022", "W023"):
        assert f"billing_integration.{check_id}" in out, out
    assert "No Celery app is loaded" in out
    # The hint says what to create, in this project's package (not a hard-coded "proj").
    assert "Create tests/bare_project/celery.py (app = Celery('tests.bare_project')" in out
    assert "tests/bare_project/__init__.py" in out and "proj/" not in out


def test_no_celery_app_E020(monkeypatch):
    # Only Celery's fallback app: what a thread sees when the host's app was never loaded.
    monkeypatch.setattr(celery._state, "default_app", None)
    monkeypatch.setattr(celery._state._tls, "current_app", None)
    errors = check_wiring()
    assert wiring(errors) == ["E020"]
    assert "amqp://guest@localhost//" in errors[0].msg
    assert "Create example_project/celery.py (app = Celery('example_project')" in errors[0].hint
    assert "proj/" not in errors[0].hint


def test_E020_names_the_projects_own_package(monkeypatch, settings):
    monkeypatch.setattr(celery._state, "default_app", None)
    monkeypatch.setattr(celery._state._tls, "current_app", None)
    settings.SETTINGS_MODULE = "acme.config.settings"
    assert "Create acme/config/celery.py (app = Celery('acme.config')" in check_wiring()[0].hint
    settings.SETTINGS_MODULE = None  # settings.configure(): the URLconf's package instead
    settings.ROOT_URLCONF = "shop.urls"
    hint = check_wiring()[0].hint
    assert "Create shop/celery.py" in hint and "shop/__init__.py" in hint


def test_broker_left_at_celerys_default_E021(host_app, monkeypatch):
    host_app(beat_schedule={**BEAT_SCHEDULE})
    errors = check_wiring()
    assert wiring(errors) == ["E021"]
    assert "CELERY_BROKER_URL" in errors[0].hint


@pytest.mark.parametrize(
    "conf",
    [
        GOOD_CELERY,
        {**GOOD_CELERY, "broker_url": "amqp://guest@localhost//"},
        {**GOOD_CELERY, "broker_url": None, "task_always_eager": True},
    ],
    ids=["redis", "explicit-default", "eager"],
)
def test_a_broker_set_explicitly_or_eager_tasks_pass(host_app, conf):
    host_app(**conf)
    assert wiring(check_wiring()) == []


def test_the_broker_from_the_environment_counts(host_app, monkeypatch):
    host_app(beat_schedule={**BEAT_SCHEDULE})
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
    assert wiring(check_wiring()) == []


def test_beat_schedule_without_the_apps_tasks_W021(host_app):
    host_app(
        broker_url="redis://x",
        beat_schedule={
            "mine": {"task": "proj.tasks.cleanup", "schedule": 60},
            "drain": {**BEAT_SCHEDULE["billing-drain-outbox"]},  # kept, under another name
        },
    )
    errors = check_wiring()
    assert wiring(errors) == ["W021"]
    assert "billing_integration.sync_all" in errors[0].msg
    assert "billing_integration.process_pending_webhook_events" in errors[0].msg
    assert "billing_integration.drain_outbox" not in errors[0].msg
    assert "BEAT_SCHEDULE" in errors[0].hint


def test_beat_schedule_without_the_rollups_reconciliation_W021(host_app):
    """The refresh and the reconciliation run the same task: a schedule with the refresh only
    lacks the reconciliation (named once); without either, both are named, each once."""
    without = {k: v for k, v in BEAT_SCHEDULE.items() if k != "billing-reconcile-report-rollups"}
    host_app(broker_url="redis://x", beat_schedule=without)
    errors = check_wiring()
    assert wiring(errors) == ["W021"]
    assert "refresh_report_rollups (with recent_months: the reconciliation)" in errors[0].msg
    neither = {k: v for k, v in without.items() if k != "billing-refresh-report-rollups"}
    host_app(broker_url="redis://x", beat_schedule=neither)
    (error,) = check_wiring()
    assert error.msg.count("billing_integration.refresh_report_rollups") == 2  # each kind once
    assert error.msg.count("the reconciliation") == 1


def test_no_beat_schedule_at_all_W021_but_not_with_another_scheduler(host_app):
    host_app(broker_url="redis://x")
    assert wiring(check_wiring()) == ["W021"]
    host_app(
        broker_url="redis://x", beat_scheduler="django_celery_beat.schedulers:DatabaseScheduler"
    )
    assert wiring(check_wiring()) == []  # its entries live in the database


def test_a_process_local_shared_cache_W020(settings):
    settings.CACHES = {**settings.CACHES, "local": {"BACKEND": LOCMEM}}
    settings.BILLING = {**settings.BILLING, "CACHE": "local"}
    errors = check_wiring()
    assert wiring(errors) == ["W020"]
    assert "BILLING['CACHE']" in errors[0].msg
    assert "LocMemCache" in errors[0].msg and "API token" in errors[0].msg


def test_a_dummy_shared_cache_W020(settings):
    settings.CACHES = {**settings.CACHES, "nowhere": {"BACKEND": DUMMY}}
    settings.BILLING = {**settings.BILLING, "CACHE": "nowhere"}
    errors = check_wiring()
    assert wiring(errors) == ["W020"]
    assert "DummyCache" in errors[0].msg


def test_a_process_local_cache_without_workers_passes(settings, host_app):
    """Tasks run eagerly in the calling process: nothing is shared with another process."""
    host_app(task_always_eager=True, beat_schedule={**BEAT_SCHEDULE})
    settings.CACHES = {**settings.CACHES, "local": {"BACKEND": LOCMEM}}
    settings.BILLING = {**settings.BILLING, "CACHE": "local"}
    assert wiring(check_wiring()) == []


def test_an_unknown_cache_alias_E023(settings):
    settings.BILLING = {**settings.BILLING, "CACHE": "tokens"}
    errors = check_wiring()
    assert wiring(errors) == ["E023"]
    assert "'tokens'" in errors[0].msg and "BILLING['CACHE']" in errors[0].msg


def test_use_tz_off_E025(settings):
    """Without USE_TZ the app cannot store a subscription (its dates are aware): refused at
    the check, not at the first event."""
    settings.USE_TZ = False
    errors = check_wiring()
    assert wiring(errors) == ["E025"]
    assert "USE_TZ" in errors[0].msg and "USE_TZ = True" in errors[0].hint


@pytest.mark.django_db
def test_a_subscription_cannot_be_saved_with_use_tz_off(settings):
    """What E025 prevents: the reporting hooks (and SQLite) refuse a save."""
    from billing_integration.models import Subscription
    from billing_integration.outbox import from_remote

    settings.USE_TZ = False
    with pytest.raises(ValueError), from_remote():
        Subscription.objects.create(status="published")


@pytest.mark.django_db
def test_routed_api_without_rest_framework_installed_E022(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("u", password="p"))
    with modify_settings(INSTALLED_APPS={"remove": ["rest_framework"]}):
        errors = check_wiring()
        # What the check prevents: a browser opening the API gets a server error.
        with pytest.raises(TemplateDoesNotExist):
            client.get("/billing/api/subscriptions/", HTTP_ACCEPT="text/html")
    assert wiring(errors) == ["E022"]
    assert "INSTALLED_APPS" in errors[0].hint
    assert wiring(check_wiring()) == []


CSRF = "django.middleware.csrf.CsrfViewMiddleware"


@pytest.mark.django_db
def test_routed_pages_without_the_csrf_middleware_W022(django_user_model):
    """The billing forms (checkout, trial, change of plan, stop renewal, resume) rely on the
    project's ``CsrfViewMiddleware``: without it another site can post them for a signed-in
    customer (here: a stop-renewal request reaches the view, 404 for want of a
    subscription, where the middleware answers 403). The check says so."""
    from django.test import Client

    user = django_user_model.objects.create_user("u", password="p")

    def cross_site() -> Client:  # a client loads the middleware on its first request
        client = Client(enforce_csrf_checks=True)
        client.force_login(user)
        return client

    stop = "/billing/account/subscriptions/1/stop-renewal/"
    assert cross_site().post(stop).status_code == 403
    with modify_settings(MIDDLEWARE={"remove": [CSRF]}):
        errors = check_wiring()
        assert cross_site().post(stop).status_code == 404
    assert wiring(errors) == ["W022"]
    assert CSRF in errors[0].msg and "MIDDLEWARE" in errors[0].hint
    assert wiring(check_wiring()) == []


def test_a_subclass_of_the_csrf_middleware_counts(settings):
    from django.middleware.csrf import CsrfViewMiddleware

    global SiteCsrf

    class SiteCsrf(CsrfViewMiddleware):
        pass

    settings.MIDDLEWARE = [
        f"{__name__}.SiteCsrf" if name == CSRF else name for name in settings.MIDDLEWARE
    ]
    assert wiring(check_wiring()) == []


def test_an_unrouted_api_needs_no_rest_framework(settings):
    settings.ROOT_URLCONF = __name__  # ``urlpatterns`` below: the admin only
    with modify_settings(INSTALLED_APPS={"remove": ["rest_framework"]}):
        assert wiring(check_wiring()) == ["W024"]  # the event callback is not routed either
    with modify_settings(MIDDLEWARE={"remove": [CSRF]}):  # no billing form routed either
        assert wiring(check_wiring()) == ["W024"]


def test_an_unrouted_event_callback_is_a_warning(settings, client):
    """No URL serves the event callback: every delivery of the service is a 404, nothing
    reaches the app to be refused or counted, and the checks said nothing."""
    settings.ROOT_URLCONF = __name__  # the admin only
    response = client.post("/billing/webhooks/", b"{}", content_type="application/json")
    assert response.status_code == 404
    [warning] = [m for m in check_wiring() if m.id == "billing_integration.W024"]
    assert "billing_integration:webhook" in warning.msg and "404" in warning.msg
    assert "billing_integration.urls" in warning.hint


def test_the_event_callback_routed_by_its_view_is_enough(settings, client):
    """A host may route the view itself, at a path and under a name of its own."""
    settings.ROOT_URLCONF = OwnRoute  # a URLconf may be any object with ``urlpatterns``
    response = client.post("/hooks/billing/", b"{}", content_type="application/json")
    assert response.status_code != 404
    assert wiring(check_wiring()) == []
    # The Health page's hints do not call it unrouted (they named the missing include).
    from billing_integration.health import webhook_path

    assert webhook_path() == "the path your URLconf routes the webhook view at"


class OwnRoute:
    from billing_integration.webhooks.views import webhook

    urlpatterns = [path("hooks/billing/", webhook, name="billing_events")]


urlpatterns = [path("admin/", admin.site.urls)]
