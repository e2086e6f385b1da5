"""Persistence: one SQLite database (a file in WAL mode, or in memory for tests).

Resources are JSON documents in one ``objects`` table, ordered by insertion (``seq``), with an
optional indexed ``due`` timestamp (next billing date of a subscription, expiry of an open
checkout session) so the clock finds due work without scanning. Keys starting with ``_`` in a
document are the sandbox's own (a customer's test phone number, an owning account, ...) and
are never sent on the wire.

One connection guarded by a re-entrant lock: simple, thread-safe, and fast enough for tens of
thousands of rows.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    due TEXT,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS objects_kind_seq ON objects (kind, seq);
CREATE INDEX IF NOT EXISTS objects_kind_due ON objects (kind, due);
CREATE TABLE IF NOT EXISTS idempotency (
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status INTEGER NOT NULL,
    body TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE TABLE IF NOT EXISTS tokens (
    token TEXT PRIMARY KEY,
    client_id TEXT NOT NULL,
    account TEXT NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS config (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS deliveries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    event_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    url TEXT NOT NULL,
    body TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt REAL,
    created REAL NOT NULL,
    delivered REAL,
    log TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX IF NOT EXISTS deliveries_pending ON deliveries (status, next_attempt);
"""


def public(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """The wire form of a stored document: without the sandbox's ``_`` keys."""
    if doc is None:
        return None
    return {k: v for k, v in doc.items() if not k.startswith("_")}


def refuse_other_file(path: Path) -> None:
    """``ValueError`` when ``path`` holds something other than a sandbox data file: a file that
    is not SQLite, or a SQLite database with tables and no ``objects`` and ``config`` ones
    (e.g. the project's own database). The sandbox neither writes into it nor, on reset,
    deletes it. A missing or empty file, or a database without tables, is fine."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            tables = {row[0] for row in rows}
        ours = not tables or {"objects", "config"} <= tables
    except sqlite3.DatabaseError:  # not a SQLite database
        ours = False
    if not ours:
        raise ValueError(
            f"{path} is not a sandbox data file (it holds other data): it is neither used nor "
            "deleted. Choose another --data."
        )


class Store:
    """The sandbox's database. ``path`` ``None`` or ``":memory:"`` keeps it in memory."""

    def __init__(self, path: str | Path | None = None, *, reset: bool = False) -> None:
        self.path = None if path in (None, ":memory:") else Path(path)
        if self.path is not None:
            refuse_other_file(self.path)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if reset:
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        self.lock = threading.RLock()
        self._depth = 0
        self.conn = sqlite3.connect(
            ":memory:" if self.path is None else str(self.path),
            check_same_thread=False,
            isolation_level=None,
            timeout=30,
        )
        if self.path is not None:
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(SCHEMA)

    # -- transactions ------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (re-entrant: nested blocks join the outer one)."""
        with self.lock:
            if self._depth:
                self._depth += 1
                try:
                    yield self.conn
                finally:
                    self._depth -= 1
                return
            self._depth = 1
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            else:
                self.conn.execute("COMMIT")
            finally:
                self._depth = 0

    def execute(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        with self.lock:
            return self.conn.execute(sql, tuple(params)).fetchall()

    def close(self) -> None:
        with self.lock:
            self.conn.close()

    # -- documents -----------------------------------------------------------------------
    def insert(self, kind: str, doc: dict[str, Any], due: str | None = None) -> dict[str, Any]:
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO objects (id, kind, due, data) VALUES (?, ?, ?, ?)",
                (doc["id"], kind, due, json.dumps(doc)),
            )
        return doc

    def insert_many(self, kind: str, docs: Sequence[tuple[dict[str, Any], str | None]]) -> None:
        with self.transaction() as conn:
            conn.executemany(
                "INSERT INTO objects (id, kind, due, data) VALUES (?, ?, ?, ?)",
                [(d["id"], kind, due, json.dumps(d)) for d, due in docs],
            )

    def save(self, kind: str, doc: dict[str, Any], due: str | None = None) -> dict[str, Any]:
        with self.transaction() as conn:
            conn.execute(
                "UPDATE objects SET data = ?, due = ? WHERE id = ? AND kind = ?",
                (json.dumps(doc), due, doc["id"], kind),
            )
        return doc

    def get(self, kind: str, obj_id: str) -> dict[str, Any] | None:
        rows = self.execute("SELECT data FROM objects WHERE id = ? AND kind = ?", (obj_id, kind))
        return json.loads(rows[0][0]) if rows else None

    def must(self, kind: str, obj_id: str) -> dict[str, Any]:
        """``get`` of an object the caller knows exists."""
        doc = self.get(kind, obj_id)
        if doc is None:
            raise LookupError(f"No {kind} {obj_id}.")
        return doc

    def kind_of(self, obj_id: str) -> str | None:
        rows = self.execute("SELECT kind FROM objects WHERE id = ?", (obj_id,))
        return rows[0][0] if rows else None

    def page(self, kind: str, limit: int | None, offset: int = 0) -> list[dict[str, Any]]:
        rows = self.execute(
            "SELECT data FROM objects WHERE kind = ? ORDER BY seq LIMIT ? OFFSET ?",
            (kind, -1 if limit is None else limit, offset),
        )
        return [json.loads(r[0]) for r in rows]

    def count(self, kind: str) -> int:
        return int(self.execute("SELECT COUNT(*) FROM objects WHERE kind = ?", (kind,))[0][0])

    def due(self, kind: str, before: str, limit: int = 1000) -> list[dict[str, Any]]:
        """Documents of ``kind`` whose ``due`` is set and not after ``before``."""
        rows = self.execute(
            "SELECT data FROM objects WHERE kind = ? AND due IS NOT NULL AND due <= ? "
            "ORDER BY due, seq LIMIT ?",
            (kind, before, limit),
        )
        return [json.loads(r[0]) for r in rows]

    # -- config --------------------------------------------------------------------------
    def get_config(self, key: str, default: Any = None) -> Any:
        rows = self.execute("SELECT value FROM config WHERE key = ?", (key,))
        return json.loads(rows[0][0]) if rows else default

    def set_config(self, key: str, value: Any) -> None:
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO config (key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, json.dumps(value)),
            )

    # -- reset ---------------------------------------------------------------------------
    def wipe(self, *, config: bool = False) -> None:
        """Delete all state; the config (credentials, secret, callback) too if asked."""
        with self.transaction() as conn:
            for table in ("objects", "idempotency", "tokens", "deliveries"):
                conn.execute(f"DELETE FROM {table}")  # noqa: S608 - fixed table names
            if config:
                conn.execute("DELETE FROM config")
