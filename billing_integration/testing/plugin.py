"""pytest plugin: ``billing_sandbox_server``, ``billing_sandbox`` and ``billing_inline``
(Django imported lazily: it loads in every pytest run)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from .helpers import TEST_SETTINGS, SandboxHandle, start_sandbox

STARTED: dict[str, Any] = {**TEST_SETTINGS, "token_lifetime": 300}
#: What each test starts from: the guessed behaviours off (as the sandbox starts).
SESSION_DEFAULTS = {"callback_url": None, "return_url": None, "dialects": [], **STARTED}
SESSION_DEFAULTS |= {"trial_end": "renew", "change_actions": [], "patch_subscriptions": False}


@pytest.fixture(scope="session")
def billing_sandbox_server() -> Iterator[Any]:
    server = start_sandbox(**STARTED)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def billing_sandbox(billing_sandbox_server: Any, request: pytest.FixtureRequest) -> SandboxHandle:
    handle = SandboxHandle(
        billing_sandbox_server.url, defaults=SESSION_DEFAULTS, server=billing_sandbox_server
    )
    billing_sandbox_server.app.delivery.wait_idle(timeout=2)  # let a previous test's queue go
    handle.reset()
    _point_django_at(handle, request)
    return handle


@pytest.fixture
def billing_inline(request: pytest.FixtureRequest, transactional_db: None) -> Iterator[None]:
    from .inline import after_commit_inline

    with after_commit_inline(_settings(request)):
        yield


def _point_django_at(handle: SandboxHandle, request: pytest.FixtureRequest) -> None:
    try:
        from django.conf import settings as django_settings
    except ImportError:
        return
    if not django_settings.configured or (settings := _settings(request)) is None:
        return
    billing = dict(getattr(settings, "BILLING", None) or {})
    billing.update(handle.django_settings())
    settings.BILLING = billing
    _forget_tokens(billing.get("CACHE", "default"))


def _settings(request: pytest.FixtureRequest) -> Any:
    try:
        return request.getfixturevalue("settings")  # pytest-django
    except pytest.FixtureLookupError:
        return None


def _forget_tokens(alias: str) -> None:
    from django.core.cache import caches

    with contextlib.suppress(Exception):  # e.g. a database cache in a test without DB access
        from django.db import transaction

        cache = caches[alias]
        in_db = cache.__class__.__name__ == "DatabaseCache"
        db = getattr(cache, "_db", None) or "default"
        with transaction.atomic(using=db) if in_db else contextlib.nullcontext():
            cache.clear()
    with contextlib.suppress(ImportError):
        from billing_integration.client import reset_client

        reset_client()
