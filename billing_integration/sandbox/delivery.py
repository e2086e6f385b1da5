"""Background delivery of queued events to the registered callback, with retries.

One thread takes due deliveries in order, POSTs the signed body, and on a non-2xx answer,
a timeout or a connection error schedules the next attempt after ``retry_schedule[n]`` seconds
(real time; the last value repeats) until ``max_attempts`` is reached (status ``failed``).
The queue lives in the store, so a restarted sandbox resumes it.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from .config import SandboxConfig
from .events import sign_headers
from .store import Store

COLUMNS = (
    "seq",
    "id",
    "event_id",
    "event_type",
    "url",
    "status",
    "attempts",
    "next_attempt",
    "created",
    "delivered",
    "log",
)


class DeliveryWorker:
    def __init__(self, store: Store, config: SandboxConfig) -> None:
        self.store = store
        self.config = config
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: The wall clock attempts and retries are scheduled on (replaceable: tests use a fake).
        self.clock: Callable[[], float] = time.time

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sandbox-delivery", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def notify(self) -> None:
        self._wake.set()

    # -- queue -----------------------------------------------------------------------------
    def _next_due(self) -> tuple[dict[str, Any] | None, float | None]:
        rows = self.store.execute(
            "SELECT id, url, body, event_id, attempts, log, next_attempt FROM deliveries "
            "WHERE status = 'pending' ORDER BY next_attempt, seq LIMIT 1"
        )
        if not rows:
            return None, None
        row = dict(
            zip(
                ("id", "url", "body", "event_id", "attempts", "log", "next_attempt"),
                rows[0],
                strict=True,
            )
        )
        if row["next_attempt"] > self.clock():
            return None, row["next_attempt"] - self.clock()
        return row, None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                row, wait = self._next_due()
            except Exception:  # the store was closed under us (shutdown)
                if self._stop.is_set():
                    return
                raise
            if row is not None:
                self._attempt(row)
                continue
            self._wake.wait(timeout=min(wait if wait is not None else 1.0, 1.0))
            self._wake.clear()

    def _attempt(self, row: dict[str, Any]) -> None:
        attempt_no = row["attempts"] + 1
        headers = sign_headers(row["body"], self.config.webhook_secret, msg_id=row["event_id"])
        headers["user-agent"] = "billing-sandbox/1"
        started = self.clock()
        status_code, error = None, None
        request = urllib.request.Request(  # noqa: S310 - the registered callback (http/https)
            row["url"], data=row["body"].encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(  # noqa: S310
                request, timeout=self.config.delivery_timeout
            ) as response:
                status_code = response.status
                response.read()
        except urllib.error.HTTPError as exc:
            status_code = exc.code
            error = f"HTTP {exc.code}"
        except Exception as exc:  # timeouts, refused connections, resets
            error = f"{type(exc).__name__}: {exc}"
        ok = status_code is not None and 200 <= status_code < 300
        log = json.loads(row["log"])
        log.append(
            {
                "attempt": attempt_no,
                "at": started,
                "status_code": status_code,
                "error": None if ok else error,
                "duration": round(self.clock() - started, 4),
                "webhook-timestamp": headers["webhook-timestamp"],
            }
        )
        if ok:
            status, next_attempt = "delivered", None
        elif attempt_no >= self.config.max_attempts:
            status, next_attempt = "failed", None
        else:
            schedule = self.config.retry_schedule or [1.0]
            delay = schedule[min(attempt_no - 1, len(schedule) - 1)]
            status, next_attempt = "pending", self.clock() + delay
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE deliveries SET status = ?, attempts = ?, next_attempt = ?, "
                "delivered = ?, log = ? WHERE id = ?",
                (
                    status,
                    attempt_no,
                    next_attempt,
                    self.clock() if ok else None,
                    json.dumps(log),
                    row["id"],
                ),
            )

    # -- inspection ------------------------------------------------------------------------
    def pending(self) -> int:
        return int(
            self.store.execute("SELECT COUNT(*) FROM deliveries WHERE status = 'pending'")[0][0]
        )

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until no delivery is pending (True) or ``timeout`` passes (False)."""
        deadline = time.monotonic() + timeout
        self.notify()
        while time.monotonic() < deadline:
            if self.pending() == 0:
                return True
            time.sleep(0.02)
        return self.pending() == 0

    def list(self, status: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        cols = ", ".join(COLUMNS) + ", body"
        if status:
            rows = self.store.execute(
                f"SELECT {cols} FROM deliveries WHERE status = ? ORDER BY seq LIMIT ?",  # noqa: S608
                (status, limit),
            )
        else:
            rows = self.store.execute(
                f"SELECT {cols} FROM deliveries ORDER BY seq LIMIT ?",  # noqa: S608
                (limit,),
            )
        result = []
        for row in rows:
            item = dict(zip((*COLUMNS, "body"), row, strict=True))
            item["log"] = json.loads(item["log"])
            item["event"] = json.loads(item.pop("body"))
            result.append(item)
        return result
