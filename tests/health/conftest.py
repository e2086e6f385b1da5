"""Fixtures of the health tests: a stack whose every fact is healthy, faults added one at a time."""

from __future__ import annotations

from typing import Any

import pytest

from tests.checkout.conftest import logged_in, product, user  # noqa: F401  (a checkout)
from tests.mirror.conftest import celery_worker_process  # noqa: F401  (a real worker)
from tests.webhooks.conftest import webhook_settings  # noqa: F401  (signed deliveries)


@pytest.fixture(autouse=True)
def recorded_enqueues(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> list:
    """Outside worker tests, outbox wake-ups are recorded instead of sent to a broker."""
    calls: list[int] = []
    if request.node.get_closest_marker("worker") is None:
        from billing_integration.outbox import tasks

        monkeypatch.setattr(tasks, "enqueue", lambda pk, countdown=None: calls.append(pk) or True)
    return calls


@pytest.fixture
def issued_tokens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every access token the client receives in this process (to prove none is shown)."""
    from billing_integration.client.client import BillingClient

    tokens: list[str] = []
    real = BillingClient._request_token

    def spy(self: Any) -> dict[str, Any]:
        data = real(self)
        tokens.append(data["access_token"])
        return data

    monkeypatch.setattr(BillingClient, "_request_token", spy)
    return tokens


@pytest.fixture
def healthy(billing_sandbox: Any, transactional_db: None) -> Any:
    """The sandbox answering, and the periodic jobs run once, as beat would (they record their
    runs, and sync_all its pulls); no refused delivery counted (the shared cache outlives the
    tests that refused some)."""
    from billing_integration.conf import shared_cache
    from billing_integration.outbox.tasks import sweep_outbox
    from billing_integration.sync.tasks import sync_all
    from billing_integration.webhooks.tasks import process_pending_webhook_events

    shared_cache().clear()
    sweep_outbox()
    process_pending_webhook_events()
    sync_all()
    return billing_sandbox
