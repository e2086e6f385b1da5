"""The request log: every token, billing and checkout-page request the sandbox receives.

Tests across the project assert on what the service received (headers, bodies, keys), so each
entry keeps the method, path, query, headers, parsed body, operation name, response status and
outcome (``answered``, ``fault``, ``timeout``, ``reset``, ``reset_after_commit``). A token
request the sandbox refuses keeps no client secret (``forget_credentials``).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from typing import Any

from werkzeug.wrappers import Request

MAX_ENTRIES = 100_000


def parsed_body(request: Request) -> Any:
    raw = request.get_data(cache=True)
    if not raw:
        return None
    if request.mimetype == "application/x-www-form-urlencoded":
        return request.form.to_dict()
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def forget_credentials(entry: dict[str, Any]) -> None:
    """Replace a token request's client secret in its ``entry`` (the form field or JSON key,
    the ``Authorization`` header) by ``[redacted]``: for a request the sandbox did not answer
    with a token, whose credentials may be real ones sent here by mistake."""
    body = entry.get("body")
    if isinstance(body, dict) and "client_secret" in body:
        entry["body"] = {**body, "client_secret": "[redacted]"}
    if "authorization" in entry["headers"]:
        entry["headers"] = {**entry["headers"], "authorization": "[redacted]"}


class RequestLog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: deque[dict[str, Any]] = deque(maxlen=MAX_ENTRIES)
        self._ids = itertools.count(1)

    def record(self, request: Request, operation: str) -> dict[str, Any]:
        entry = {
            "id": next(self._ids),
            "time": time.time(),
            "method": request.method,
            "path": request.path,
            "query": request.args.to_dict(),
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "body": parsed_body(request),
            "operation": operation,
            "status": None,
            "outcome": None,
            "idempotent_replay": False,
        }
        with self._lock:
            self._entries.append(entry)
        return entry

    def entries(self, operation: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            items = list(self._entries)
        if operation:
            wanted = set(operation.split(","))
            items = [e for e in items if e["operation"] in wanted]
        return items

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
