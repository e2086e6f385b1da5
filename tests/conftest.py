"""Shared fixtures and markers. The sandbox fixtures come from the ``billing_integration.testing``
plugin.

Four markers name a backend a test cannot do without: ``postgresql`` (the test database must be
PostgreSQL: row locks, concurrent writers), ``redis`` (a ``redis-server`` on the PATH),
``rabbitmq`` (a RabbitMQ answering at ``RABBITMQ_URL``, default
``amqp://guest:guest@127.0.0.1:5672//``, with ``rabbitmqctl`` and ``rabbitmq-server`` on the
PATH to drive it) and ``gettext`` (GNU gettext's ``xgettext`` and ``msgfmt`` on the PATH, for
the translations). Such a test is skipped, with the reason, where the backend is absent; under
CI (the environment variable ``CI`` set, as ``.ci/run`` runs with PostgreSQL, Redis and
RabbitMQ) that skip is a failure, so CI cannot go green without running it.
"""

from __future__ import annotations

import functools
import os
import shutil

import pytest

BACKENDS = ("postgresql", "redis", "rabbitmq", "gettext")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@functools.cache
def missing_rabbitmq() -> str | None:
    """Why the RabbitMQ tests cannot run here, or None."""
    from urllib.parse import urlsplit

    from benchmarks._stack import amqp_answers, rabbitmq_url

    url = rabbitmq_url()
    parts = urlsplit(url)
    where = f"{parts.hostname or '127.0.0.1'}:{parts.port or 5672}"  # no credentials
    if not amqp_answers(url):
        return f"needs RabbitMQ: none answers at {where} (RABBITMQ_URL)"
    if not all(shutil.which(cmd) for cmd in ("rabbitmqctl", "rabbitmq-server")):
        return "needs rabbitmqctl and rabbitmq-server on PATH (to drive RabbitMQ)"
    return None


def missing_backend(item: pytest.Item) -> str | None:
    """Why ``item`` cannot run here (a backend it is marked for is absent), or None."""
    if item.get_closest_marker("postgresql"):
        from django.db import connection

        if connection.vendor != "postgresql":
            return f"needs PostgreSQL (DATABASE_URL=postgres://...), not {connection.vendor}"
    if item.get_closest_marker("redis") and shutil.which("redis-server") is None:
        return "needs redis-server on PATH"
    if item.get_closest_marker("rabbitmq") and (reason := missing_rabbitmq()):
        return reason
    if item.get_closest_marker("gettext") and not all(
        shutil.which(tool) for tool in ("xgettext", "msgfmt", "msgen")
    ):
        return "needs GNU gettext (xgettext, msgfmt, msgen) on PATH"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    reason = missing_backend(item)
    if reason:
        pytest.skip(reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    needs = [name for name in BACKENDS if item.get_closest_marker(name)]
    if report.skipped and needs and not hasattr(report, "wasxfail") and in_ci():
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        reason = str(reason).removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = (
            f"skipped under CI ({reason}): a test marked {', '.join(needs)} must run in CI "
            "(DATABASE_URL pointing at PostgreSQL, redis-server and gettext on the PATH, "
            "RabbitMQ answering at RABBITMQ_URL)"
        )


@pytest.fixture(autouse=True)
def default_language():
    """Each test starts in the default language: a request with ``Accept-Language: fr`` leaves
    French active in the test's thread (``LocaleMiddleware`` activates, nothing deactivates)."""
    from django.utils import translation

    translation.deactivate()
    yield
    translation.deactivate()


@pytest.fixture
def eager():
    """Celery's ``task_always_eager``: a delivery is processed in the request."""
    from celery import current_app

    before = current_app.conf.task_always_eager
    current_app.conf.task_always_eager = True
    yield
    current_app.conf.task_always_eager = before


def mark_pushed(*products):
    """Make each product pushed without a service: a remote id (unless it has one), and its
    cycles and prices (a one-time product's root prices) the service's, as the answer to a
    push of them records them (``Product.confirmed_prices``: checkout sells those only)."""
    import uuid

    from billing_integration.mapping import products as product_map
    from billing_integration.models import Product

    for product in products:
        body = product_map.to_remote(product)
        fields = {"remote_id": product.remote_id or uuid.uuid4()}
        if product.is_one_time:
            fields["remote_data"] = {**(product.remote_data or {}), "prices": body["prices"]}
        else:
            fields["confirmed_cycles"] = product_map.confirmed_cycles(
                body["subscription_blueprint"]
            )
        Product.objects.filter(pk=product.pk).update(**fields)
        product.refresh_from_db()
