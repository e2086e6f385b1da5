"""The billing API client, the only code that speaks HTTP to the service:
``get_client().create_product(payload, idempotency_key=key)``."""

from __future__ import annotations

import os
import threading
from typing import Any

from django.core.signals import setting_changed

from ..conf import DEADLINE, checked, deadline_ok
from .backoff import SharedBackoff, clear_shared_backoff
from .client import API_PREFIX, BillingClient, RawAnswer
from .retry import PAGE_MARGIN, Deadline, RetryPolicy

__all__ = [
    "API_PREFIX",
    "BillingClient",
    "Deadline",
    "RawAnswer",
    "RetryPolicy",
    "SharedBackoff",
    "clear_shared_backoff",
    "get_client",
    "interactive_deadline",
    "reset_client",
]

_lock = threading.Lock()
_client: BillingClient | None = None
_pid: int | None = None


def get_client() -> BillingClient:
    """The process's client (one ``requests.Session`` per process, a new one after a fork)."""
    global _client, _pid
    with _lock:
        if _client is None or _pid != os.getpid():
            _client, _pid = BillingClient(), os.getpid()
        return _client


def interactive_deadline() -> Deadline:
    """The deadline of a request a person waits on, started now (call it first in the view):
    ``INTERACTIVE_DEADLINE`` less ``PAGE_MARGIN`` kept for the page after the last call."""
    seconds = checked("INTERACTIVE_DEADLINE", deadline_ok, DEADLINE)
    return Deadline(max(seconds - PAGE_MARGIN, seconds / 2))


def reset_client() -> None:
    """Forget the process's client (after a settings change; tests)."""
    global _client
    with _lock:
        if _client is not None:
            _client.session.close()
        _client = None


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("BILLING", "CACHES"):
        reset_client()


setting_changed.connect(_on_setting_changed)
