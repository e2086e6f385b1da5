"""A private stack for the reliability suite and the benchmarks: an in-process sandbox, a
database of their own, an optional private ``redis-server`` and Celery worker processes.

Import this module *before* Django is set up: ``Stack.start()`` sets the environment the
example project's settings read, then calls ``django.setup()``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    def __init__(
        self,
        name: str,
        *,
        private_redis: bool = False,
        extra: dict | None = None,
        separate_sandbox: bool = False,
    ):
        self.name = name
        #: Run the sandbox as a process of its own, so that a floor measured from this process
        #: does not share the interpreter lock with the server it calls.
        self.separate_sandbox = separate_sandbox
        self.private_redis = private_redis and shutil.which("redis-server") is not None
        self.extra = extra or {}
        self.tmp = Path(tempfile.mkdtemp(prefix=f"billing-{name}-"))
        self.redis: subprocess.Popen | None = None
        self.redis_port: int | None = None
        self.workers: list[subprocess.Popen] = []
        self.queue = f"{name}-{uuid.uuid4().hex[:6]}"

    # -- database ------------------------------------------------------------------------
    def _database_url(self) -> str:
        url = os.environ.get("DATABASE_URL", "")
        if url.startswith("postgres"):
            parts = urlsplit(url)
            dbname = f"{parts.path.lstrip('/') or 'postgres'}_{self.name}"
            import psycopg

            admin = urlunsplit(parts._replace(path="/postgres", scheme="postgresql"))
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{dbname}"')
            self._pg_drop = (admin, dbname)
            return urlunsplit(parts._replace(path=f"/{dbname}"))
        return f"sqlite:///{self.tmp / 'db.sqlite3'}"

    # -- broker --------------------------------------------------------------------------
    def start_redis(self) -> None:
        if self.redis_port is None:
            self.redis_port = free_port()
        self.redis = subprocess.Popen(
            ["redis-server", "--port", str(self.redis_port), "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.redis_port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop_redis(self) -> None:
        if self.redis and self.redis.poll() is None:
            self.redis.send_signal(signal.SIGKILL)
            self.redis.wait(timeout=10)

    def broker_url(self) -> str:
        if self.private_redis:
            return f"redis://127.0.0.1:{self.redis_port}/0"
        return os.environ.get("CELERY_BROKER_URL") or "filesystem://"

    # -- the whole thing -------------------------------------------------------------------
    def start(self) -> Stack:
        from billing_integration.testing.helpers import SandboxHandle, start_sandbox

        if self.separate_sandbox:
            from contextlib import ExitStack

            from sandbox_process import sandbox_process

            self._exit = ExitStack()
            env = self._exit.enter_context(sandbox_process("--token-lifetime", "300"))
            self.server = None
            self.sandbox = SandboxHandle(
                env["BILLING_BASE_URL"], webhook_secret=env["BILLING_WEBHOOK_SECRET"]
            )
        else:
            self.server = start_sandbox(token_lifetime=300)
            self.sandbox = SandboxHandle(self.server.url, server=self.server)
        self.sandbox.reset()
        if self.private_redis:
            self.start_redis()
        self.env = {
            "DJANGO_SETTINGS_MODULE": "example_project.settings",
            "DATABASE_URL": self._database_url(),
            "CELERY_BROKER_URL": self.broker_url(),
            "CELERY_BROKER_FOLDER": str(self.tmp),
            "CACHE_URL": os.environ.get("CACHE_URL") or f"filecache://{self.tmp / 'cache'}",
            "CELERY_TASK_ALWAYS_EAGER": "0",
            "BILLING_BASE_URL": self.sandbox.base_url,
            "BILLING_AUTH_URL": self.sandbox.auth_url,
            "BILLING_CHECKOUT_URL": self.sandbox.checkout_url,
            "BILLING_CLIENT_ID": self.sandbox.client_id,
            "BILLING_CLIENT_SECRET": self.sandbox.client_secret,
            "BILLING_EXTRA": json.dumps({"OUTBOX_QUEUE": self.queue, **self.extra}),
            "PYTHONPATH": str(ROOT),
        }
        os.environ.update(self.env)
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        call_command("createcachetable", verbosity=0)
        from django.core.cache import cache

        cache.clear()  # no token of an earlier run
        return self

    def start_worker(self, concurrency: int = 1, queue: str | None = None) -> subprocess.Popen:
        """A ``celery worker`` process with ``concurrency`` children consuming ``queue`` (by
        default the stack's private one, the outbox's)."""
        log = (self.tmp / f"worker-{len(self.workers)}.log").open("w")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "example_project",
                "worker",
                "-Q",
                queue or self.queue,
                "-c",
                str(concurrency),
                "-l",
                "WARNING",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-n",
                f"{self.queue}-{len(self.workers)}@%h",
            ],
            cwd=ROOT,
            env={**os.environ, **self.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers.append(proc)
        time.sleep(2.0)
        return proc

    def stop_workers(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        self.workers.clear()

    def stop(self) -> None:
        self.stop_workers()
        self.stop_redis()
        if self.server is not None:
            self.server.stop()
        else:
            self._exit.close()
        if hasattr(self, "_pg_drop"):
            from django.db import connections

            connections.close_all()
            import psycopg

            admin, dbname = self._pg_drop
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        shutil.rmtree(self.tmp, ignore_errors=True)

    def worker_logs(self) -> str:
        logs = sorted(self.tmp.glob("worker-*.log"))
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in logs)


def cpu_seconds(match: Callable[[int, str], bool]) -> float | None:
    """CPU time (user + system) of the running processes whose pid and command line
    ``match`` accepts; None where ``/proc`` is not there to read it (not Linux)."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    ticks = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (
                (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            )
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if match(int(entry.name), cmdline):
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def wait(predicate: Any, timeout: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
