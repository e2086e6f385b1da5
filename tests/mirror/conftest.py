"""Fixtures of the mirror tests: recorded enqueues, a real Celery worker process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from billing_integration.customers import get_or_create_customer
from billing_integration.models import Product, Subscription

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def recorded_enqueues(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> list:
    """Outside worker tests, enqueued pushes are recorded instead of sent to a broker."""
    calls: list[int] = []
    if request.node.get_closest_marker("worker") is None:
        from billing_integration.outbox import tasks

        monkeypatch.setattr(tasks, "enqueue", lambda pk, countdown=None: calls.append(pk) or True)
    return calls


def subscribe(product: Product, username: str, email: str) -> Subscription:
    """A new user's renewing monthly XOF subscription to ``product``, created here only: its
    outbox entry and its customer's are open (the product's too, unless it was pushed)."""
    user = get_user_model().objects.create(username=username, email=email)
    customer, _ = get_or_create_customer(user)
    return Subscription.objects.create(
        product=product,
        customer=customer,
        selected_currency="XOF",
        selected_billing_cycle="months-1",
        auto_renew=True,
    )


@pytest.fixture
def small_pages(settings, billing_sandbox, monkeypatch):
    """The sandbox, listed by the client in pages of 10 rows (so that a pull reads several)."""
    monkeypatch.setattr("billing_integration.client.client.PAGE_SIZE", 10)
    from billing_integration.client import reset_client

    reset_client()
    return billing_sandbox


def push_open() -> list:
    """Push every open entry once, in primary-key order, in this process; their results."""
    from billing_integration.models import OutboxEntry
    from billing_integration.outbox.push import push_entry

    ids = OutboxEntry.objects.open().order_by("pk").values_list("pk", flat=True)
    return [push_entry(pk) for pk in list(ids)]


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")
        time.sleep(interval)


def database_url() -> str:
    """A URL of the database the tests run on (the test database), for other processes."""
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    if "postgresql" in s["ENGINE"]:
        auth = s["USER"] or "postgres"
        if s.get("PASSWORD"):
            auth += f":{s['PASSWORD']}"
        return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    raise RuntimeError(f"no URL form for {s['ENGINE']}")


class Worker:
    """A real ``celery -A example_project worker`` subprocess on a private queue: Celery's
    ``task_default_queue`` of the worker (``CELERY_TASK_DEFAULT_QUEUE``), so every task it
    sends (retries, beat) goes there too; ``routed_to`` sends this process's tasks there."""

    def __init__(
        self,
        sandbox: Any,
        *,
        concurrency: int = 1,
        extra: dict | None = None,
        broker_url: str | None = None,
        beat: bool = False,
        queues: tuple[str, ...] = (),
    ) -> None:
        self.sandbox = sandbox
        self.queue = f"mirror-test-{uuid.uuid4().hex[:8]}"
        self.concurrency = concurrency
        self.extra = extra or {}
        self.broker_url = broker_url
        self.beat = beat
        #: Queues consumed besides the private one.
        self.queues = queues
        self.proc: subprocess.Popen | None = None
        self.log = Path(tempfile.mkstemp(prefix="celery-worker-", suffix=".log")[1])

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        billing = self.sandbox.django_settings()
        env.update(
            DJANGO_SETTINGS_MODULE="example_project.settings",
            DATABASE_URL=database_url(),
            BILLING_BASE_URL=billing["BASE_URL"],
            BILLING_AUTH_URL=billing["AUTH_URL"],
            BILLING_CHECKOUT_URL=billing["CHECKOUT_URL"],
            BILLING_CLIENT_ID=billing["CLIENT_ID"],
            BILLING_CLIENT_SECRET=billing["CLIENT_SECRET"],
            BILLING_EXTRA=json.dumps(self.extra),
            CELERY_TASK_DEFAULT_QUEUE=self.queue,
            CELERY_TASK_ALWAYS_EAGER="0",
            PYTHONPATH=str(ROOT),
        )
        if billing.get("WEBHOOK_SECRET"):
            env["BILLING_WEBHOOK_SECRET"] = billing["WEBHOOK_SECRET"]
        if self.broker_url:
            env["CELERY_BROKER_URL"] = self.broker_url
        return env

    def start(self) -> Worker:
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "example_project",
            "worker",
            "-Q",
            ",".join([self.queue, *self.queues]),
            "-c",
            str(self.concurrency),
            "-l",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-n",
            f"{self.queue}@%h",
        ]
        if self.beat:
            cmd.append("-B")
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=self.env(),
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(lambda: "ready." in self.output() or self.proc.poll() is not None, timeout=60)
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker exited:\n{self.output()[-3000:]}")
        return self

    @contextmanager
    def routed_to(self) -> Iterator[Worker]:
        """In this process, send every task without a route (the app's) to the worker's queue,
        through Celery's ``task_default_queue`` (its router reads it on each send)."""
        from celery import current_app

        previous = current_app.conf.task_default_queue
        current_app.conf.task_default_queue = self.queue
        try:
            yield self
        finally:
            current_app.conf.task_default_queue = previous

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@pytest.fixture
def celery_worker_process(
    billing_sandbox: Any, transactional_db: None, settings: Any
) -> Iterator[Callable[..., Worker]]:
    """Start real worker processes against the sandbox and the test database; this process
    publishes its tasks to the private queue of the worker started last."""
    started: list[Worker] = []

    def start(**kwargs: Any) -> Worker:
        worker = Worker(billing_sandbox, **kwargs)
        settings.BILLING = {**settings.BILLING, **worker.extra}
        worker.start()
        started.append(worker)
        routes.enter_context(worker.routed_to())
        return worker

    with ExitStack() as routes:
        yield start
    for worker in started:
        worker.stop()
        if os.environ.get("MIRROR_KEEP_WORKER_LOGS"):
            print(worker.output()[-5000:])
        worker.log.unlink(missing_ok=True)
