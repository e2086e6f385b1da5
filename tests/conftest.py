"""Shared fixtures and markers. The sandbox fixtures come from the ``billing_integration.testing``
plugin.

Three markers name a backend a test cannot do without: ``postgresql`` (the test database must be
PostgreSQL: row locks, concurrent writers), ``redis`` (a ``redis-server`` on the PATH) and
``gettext`` (GNU gettext's ``xgettext`` and ``msgfmt`` on the PATH, for the translations). Such
a test is skipped, with the reason, where the backend is absent; under CI (the environment
variable ``CI`` set, as ``.ci/run`` runs with PostgreSQL and Redis) that skip is a failure, so
CI cannot go green without running it.
"""

from __future__ import annotations

import os
import shutil

import pytest

BACKENDS = ("postgresql", "redis", "gettext")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing_backend(item: pytest.Item) -> str | None:
    """Why ``item`` cannot run here (a backend it is marked for is absent), or None."""
    if item.get_closest_marker("postgresql"):
        from django.db import connection

        if connection.vendor != "postgresql":
            return f"needs PostgreSQL (DATABASE_URL=postgres://...), not {connection.vendor}"
    if item.get_closest_marker("redis") and shutil.which("redis-server") is None:
        return "needs redis-server on PATH"
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
            "(DATABASE_URL pointing at PostgreSQL, redis-server and gettext on the PATH)"
        )


@pytest.fixture(autouse=True)
def default_language():
    """Each test starts in the default language: a request with ``Accept-Language: fr`` leaves
    French active in the test's thread (``LocaleMiddleware`` activates, nothing deactivates)."""
    from django.utils import translation

    translation.deactivate()
    yield
    translation.deactivate()
