"""A private stack for the reliability suite and the benchmarks: an in-process sandbox, a
database of their own, an optional broker of their own (a private ``redis-server``, or a
virtual host of their own on the machine's RabbitMQ) and Celery worker processes.

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
from urllib.parse import quote, unquote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


#: The machine's RabbitMQ (``RABBITMQ_URL`` overrides it; its virtual host is replaced by one
#: of the stack's own).
RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"

#: Seconds to wait for RabbitMQ to stop, or to boot and accept connections again.
RABBITMQ_TIMEOUT = 180.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rabbitmq_url() -> str:
    return os.environ.get("RABBITMQ_URL") or RABBITMQ_URL


def amqp_answers(url: str, timeout: float = 3.0) -> bool:
    """True if a RabbitMQ at ``url`` accepts an AMQP connection (login and virtual host)."""
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=timeout) as conn:
            conn.ensure_connection(max_retries=1)
        return True
    except Exception:
        return False


def port_open(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1.0).close()
        return True
    except OSError:
        return False


class RabbitMQ:
    """The machine's RabbitMQ server, driven through its own commands (``rabbitmqctl``,
    ``rabbitmq-server``, as root or the ``rabbitmq`` user): a virtual host of the stack's own
    (so its queues disturb nothing else), and a full restart of the server (the Erlang node
    halted, then booted again)."""

    def __init__(self, base_url: str, vhost: str) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 5672
        self.user = unquote(parts.username or "guest")
        self.base_url = base_url
        self.vhost = vhost
        self.url = urlunsplit(parts._replace(path="/" + quote(vhost, safe="")))
        self.vhost_created = False

    @staticmethod
    def available() -> bool:
        return all(shutil.which(cmd) for cmd in ("rabbitmqctl", "rabbitmq-server"))

    def ctl(self, *args: str) -> str:
        """Run ``rabbitmqctl -q *args``; returns what it printed."""
        return subprocess.run(
            ["rabbitmqctl", "-q", *args],
            check=True,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=RABBITMQ_TIMEOUT,
        ).stdout

    def create_vhost(self) -> None:
        self.ctl("add_vhost", self.vhost)
        self.vhost_created = True
        self.ctl("set_permissions", "-p", self.vhost, self.user, ".*", ".*", ".*")

    def delete_vhost(self) -> None:
        if self.vhost_created:
            self.ctl("delete_vhost", self.vhost)
            self.vhost_created = False

    def stop(self) -> None:
        """Halt the RabbitMQ node (``rabbitmqctl stop``) and wait until its port is closed.
        ``rabbitmqctl`` may lose the node as it halts and exit 69 (unavailable): the closed port
        decides, and the error is raised only if the node still answers."""
        try:
            self.ctl("stop")
            failure: subprocess.CalledProcessError | None = None
        except subprocess.CalledProcessError as exc:
            failure = exc
        if not _wait_for(lambda: not port_open(self.host, self.port), RABBITMQ_TIMEOUT):
            if failure is not None:
                raise failure
            raise RuntimeError("RabbitMQ did not stop")

    def start(self) -> None:
        """Boot the node (``rabbitmq-server -detached``, as the machine's own start command)
        unless it answers already, and wait until it accepts an AMQP connection (to the
        stack's virtual host once created)."""
        if not port_open(self.host, self.port):
            subprocess.run(
                ["rabbitmq-server", "-detached"],
                check=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                timeout=RABBITMQ_TIMEOUT,
            )
        url = self.url if self.vhost_created else self.base_url
        if not _wait_for(lambda: amqp_answers(url), RABBITMQ_TIMEOUT):
            raise RuntimeError(
                f"RabbitMQ at {self.host}:{self.port} did not accept a connection "
                f"within {RABBITMQ_TIMEOUT:g}s"
            )

    def ensure_running(self) -> None:
        """Start the server again if it is down (after a failed run); never raises."""
        try:
            if not port_open(self.host, self.port):
                self.start()
        except Exception as exc:
            print(f"RabbitMQ could not be started again: {exc}", file=sys.stderr)


class Stack:
    def __init__(
        self,
        name: str,
        *,
        broker: str | None = None,
        extra: dict | None = None,
        separate_sandbox: bool = False,
    ):
        self.name = name
        #: Run the sandbox as a process of its own, so that a floor measured from this process
        #: does not share the interpreter lock with the server it calls.
        self.separate_sandbox = separate_sandbox
        #: "redis": a private ``redis-server`` (when one is on the PATH); "rabbitmq": a virtual
        #: host of its own on the machine's RabbitMQ (``RABBITMQ_URL``); None: the environment's
        #: ``CELERY_BROKER_URL`` (or the filesystem broker). The first two can be restarted.
        self.broker = broker
        self.private_redis = broker == "redis" and shutil.which("redis-server") is not None
        self.extra = extra or {}
        self.tmp = Path(tempfile.mkdtemp(prefix=f"billing-{name}-"))
        self.redis: subprocess.Popen | None = None
        self.redis_port: int | None = None
        self.workers: list[subprocess.Popen] = []
        self.queue = f"{name}-{uuid.uuid4().hex[:6]}"
        self.rabbitmq: RabbitMQ | None = None
        if broker == "rabbitmq":
            if not RabbitMQ.available():
                raise RuntimeError("--broker rabbitmq needs rabbitmqctl and rabbitmq-server")
            self.rabbitmq = RabbitMQ(rabbitmq_url(), f"billing-{self.queue}")

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
        if self.rabbitmq is not None:
            return self.rabbitmq.url
        return os.environ.get("CELERY_BROKER_URL") or "filesystem://"

    def broker_label(self) -> str:
        """The broker URL without its password."""
        parts = urlsplit(self.broker_url())
        if parts.password:
            netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
            return urlunsplit(parts._replace(netloc=netloc))
        return self.broker_url()

    @property
    def broker_restartable(self) -> bool:
        return self.private_redis or self.rabbitmq is not None

    def stop_broker(self) -> None:
        """Stop the stack's broker: SIGKILL the private redis-server, or halt RabbitMQ."""
        if self.rabbitmq is not None:
            self.rabbitmq.stop()
        else:
            self.stop_redis()

    def start_broker(self) -> None:
        """Start it again; returns once it accepts connections."""
        if self.rabbitmq is not None:
            self.rabbitmq.start()
        else:
            self.start_redis()

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
        if self.rabbitmq is not None:
            self.rabbitmq.start()  # boots it if it is down; waits until it answers
            self.rabbitmq.create_vhost()
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
            "BILLING_EXTRA": json.dumps(self.extra),
            # Every task, the app's included, to the stack's private queue (this process's too).
            "CELERY_TASK_DEFAULT_QUEUE": self.queue,
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

    def start_worker(
        self, concurrency: int = 1, queue: str | None = None, pool: str | None = None
    ) -> subprocess.Popen:
        """A ``celery worker`` process with ``concurrency`` children (or threads: ``pool``)
        consuming ``queue`` (by default the stack's private one, every task's)."""
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
                *(["--pool", pool] if pool else []),
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
        if self.rabbitmq is not None:
            self.rabbitmq.ensure_running()
            try:
                self.rabbitmq.delete_vhost()
            except Exception as exc:
                print(f"vhost {self.rabbitmq.vhost} not deleted: {exc}", file=sys.stderr)
        if getattr(self, "server", None) is not None:
            self.server.stop()
        elif hasattr(self, "_exit"):
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

    def worker_log_count(self, text: str) -> int:
        """How many lines of the workers' logs contain ``text``."""
        return sum(
            line.count(text)
            for p in self.tmp.glob("worker-*.log")
            for line in p.read_text(errors="replace").splitlines()
        )


def _wait_for(predicate: Any, timeout: float) -> bool:
    return wait(predicate, timeout, interval=0.2)


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
