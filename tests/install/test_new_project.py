"""The README's "Installing into your project", followed as a newcomer would, on a new project.

1. Build the sdist and the wheel (``python -m build``) and check them (``twine check``).
2. Make a fresh virtual environment and ``pip install`` the wheel into it (the dependencies
   come from PyPI, or pip's cache), then ``django-admin startproject proj``.
3. Apply the README's marked blocks as written (``tests/install/readme.py``): the settings, the
   URLs, the Celery app, ``pytest.ini`` and the host project's test file.
4. Run the README's commands (each one asserted to be in the README): ``migrate``,
   ``createcachetable``, ``createsuperuser``, the sandbox (its printed ``BILLING_*`` lines go
   into ``.env``), ``check``, then ``runserver``, a Celery worker and Celery beat.
5. Save the README's product in ``manage.py shell``: the worker pushes it (the sandbox's
   request log says so); log in through the project's login page and POST the checkout form
   with its CSRF token: 302 to ``{CHECKOUT_URL}/checkout/<id>``; pay on the sandbox's hosted
   page: its signed events reach the project's callback and the worker applies them (the
   subscription row appears in the project's database); a ``subscription.canceled`` event
   updates that row.
6. Run ``pytest`` in the new project: the README's host test file passes there.

The new project gets the README's development set-up whatever the outer environment holds:
its processes run with an environment built from scratch (PATH, HOME, locale, pip's and the
proxies' variables), so the ``DATABASE_URL``, ``CELERY_BROKER_URL`` and ``CACHE_URL`` that
``.ci/run`` exports for this suite's own PostgreSQL and Redis never reach it. It always runs on
SQLite, the filesystem broker and the database cache, on free ports, in a temporary folder.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from billing_integration.testing import SandboxHandle

from . import readme

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
README_WEB, README_SANDBOX = "127.0.0.1:8000", "--port 8100"
PASSWORD = "install-test-pw"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 90.0) -> Any:
    """Poll ``predicate`` until it returns something true (a deadline for a stuck stack, not
    a measurement)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except (requests.RequestException, sqlite3.Error, KeyError, ValueError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


class NewProject:
    """A virtual environment, a project made by startproject in it, and its processes."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.venv = base / "venv"
        self.dir = base / "proj"  # `django-admin startproject proj` makes it
        self.logs = base / "logs"
        self.logs.mkdir()
        self.web_port, self.sandbox_port = free_port(), free_port()
        self.web = f"http://127.0.0.1:{self.web_port}"
        self.sandbox_url = f"http://127.0.0.1:{self.sandbox_port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.timings: dict[str, float] = {}

    # -- environment and commands ----------------------------------------------------------
    def env(self, **extra: str) -> dict[str, str]:
        keep = ("HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ", "USER", "LOGNAME")
        env = {k: os.environ[k] for k in keep if k in os.environ}
        env.update(
            {
                k: v
                for k, v in os.environ.items()
                if k.startswith("PIP_") or k.lower() in ("http_proxy", "https_proxy", "no_proxy")
            }
        )
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"
        env["VIRTUAL_ENV"] = str(self.venv)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra)
        return env

    def argv(self, line: str) -> list[str]:
        """A README command line on this project's ports, run with the venv's programs."""
        line = line.replace(README_WEB, f"127.0.0.1:{self.web_port}")
        line = line.replace(README_SANDBOX, f"--port {self.sandbox_port}")
        args = shlex.split(line)
        program = self.venv / "bin" / args[0]
        if program.exists():
            args[0] = str(program)
        return args

    def run(
        self, args: list[str], *, cwd: Path | None = None, timeout: float = 600, **env: str
    ) -> str:
        started = time.monotonic()
        done = subprocess.run(
            args,
            cwd=cwd or self.dir,
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        name = " ".join(Path(a).name if i == 0 else a for i, a in enumerate(args[:3]))
        self.timings[name] = self.timings.get(name, 0.0) + time.monotonic() - started
        assert done.returncode == 0, (
            f"{shlex.join(args)} exited {done.returncode}\n{done.stdout[-3000:]}\n"
            f"{done.stderr[-5000:]}"
        )
        return done.stdout + done.stderr

    def readme(self, prefix: str, *more: str, **env: str) -> str:
        return self.run([*self.argv(readme.command(prefix)), *more], **env)

    def start(self, name: str, prefix: str, *more: str) -> subprocess.Popen:
        log = (self.logs / f"{name}.log").open("w")
        proc = subprocess.Popen(
            [*self.argv(readme.command(prefix)), *more],
            cwd=self.dir,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def alive(self, name: str) -> bool:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited {proc.returncode}:\n{self.log(name)[-4000:]}")
        return True

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def report(self) -> str:
        return "\n".join(f"--- {name} ---\n{self.log(name)[-4000:]}" for name in self.procs)

    # -- the project's database (SQLite, read directly) -------------------------------------
    def rows(self, sql: str, *params: Any) -> list[tuple]:
        with sqlite3.connect(self.dir / "db.sqlite3", timeout=20) as db:
            return db.execute(sql, params).fetchall()


def apply_file_blocks(project: Path) -> list[str]:
    """Write the README's blocks into the project as they say (append or create)."""
    done = []
    for block in readme.files():
        path = project / block.target
        if block.mode == "append":
            assert path.exists(), f"the README appends to {block.target}, which startproject made"
            path.write_text(path.read_text() + "\n" + block.code)
        else:
            assert not path.exists(), f"the README creates {block.target}, which exists"
            path.write_text(block.code)
        done.append(block.target)
    return done


def csrf_of(page: str) -> str:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert match, "no CSRF token on the page"
    return match.group(1)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, float]]]:
    """The wheel, built (with the sdist) from this checkout and checked by twine."""
    out = tmp_path_factory.mktemp("dist")
    timings = {}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    timings["python -m build"] = time.monotonic() - started
    [wheel] = out.glob("billing_integration-*.whl")
    [sdist] = out.glob("billing_integration-*.tar.gz")
    check = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    yield wheel, timings


def test_the_wheel_ships_its_type_information(built) -> None:
    import zipfile

    wheel, _timings = built
    assert "billing_integration/py.typed" in zipfile.ZipFile(wheel).namelist()


def test_the_readme_install_path_on_a_new_project(built, tmp_path: Path) -> None:
    wheel, timings = built
    new = NewProject(tmp_path)
    new.timings.update(timings)
    started = time.monotonic()
    try:
        walk_through(new, wheel)
    except BaseException:
        print(new.report())
        raise
    finally:
        new.stop()
    new.timings["whole test (after the build)"] = time.monotonic() - started
    print(
        "\ninstall test timings (s): "
        + ", ".join(f"{name} {seconds:.1f}" for name, seconds in new.timings.items())
    )


def walk_through(new: NewProject, wheel: Path) -> None:
    # 1-2. A fresh virtual environment with the wheel (README: "pip install .../dist/*.whl").
    assert any(line.endswith("&& python -m build") for line in readme.commands())
    assert wheel.name in readme.command("pip install /path/to/billing_integration/dist/")
    new.run([sys.executable, "-m", "venv", str(new.venv)], cwd=new.base)
    pip = [str(new.venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    new.run([*pip, str(wheel)], cwd=new.base)
    test_tools = readme.command("pip install pytest").split()[2:]  # the testing section's
    new.run([*pip, *test_tools], cwd=new.base)
    new.run([str(new.venv / "bin" / "django-admin"), "startproject", "proj"], cwd=new.base)

    # 3. The README's blocks, as written.
    written = apply_file_blocks(new.dir)
    assert written == [
        "proj/settings.py",
        "proj/urls.py",
        "proj/celery.py",
        "proj/__init__.py",
        "pytest.ini",
        "test_billing.py",
    ]

    # 4. The README's commands.
    migrated = new.readme("python manage.py migrate", "--noinput")
    assert "WARNINGS" not in migrated, migrated  # its system checks: nothing to look into
    new.readme("python manage.py createcachetable")
    new.readme(
        "python manage.py createsuperuser",
        "--noinput",
        "--username",
        "ada",
        "--email",
        "ada@example.com",
        DJANGO_SUPERUSER_PASSWORD=PASSWORD,
    )
    new.start("sandbox", "python manage.py billing_sandbox")
    lines = wait_for(
        "the sandbox's BILLING_* lines",
        lambda: (
            [line for line in new.log("sandbox").splitlines() if line.startswith("BILLING_")]
            if new.alive("sandbox") and new.log("sandbox").count("BILLING_") >= 6
            else None
        ),
        timeout=60,
    )
    assert len(lines) == 6, lines
    (new.dir / ".env").write_text("\n".join(lines) + "\n")  # "copy them into .env"
    sandbox = SandboxHandle(new.sandbox_url)
    assert f"BILLING_BASE_URL={new.sandbox_url}" in lines
    assert sandbox.config()["callback_url"] == f"{new.web}/billing/webhooks/"

    checked = new.readme("python manage.py check")
    assert "System check identified no issues" in checked, checked

    new.start("web", "python manage.py runserver")
    new.start("worker", "celery -A proj worker")
    new.start("beat", "celery -A proj beat")
    wait_for(
        "the login page",
        lambda: (
            new.alive("web")
            and requests.get(f"{new.web}/accounts/login/", timeout=5).status_code == 200
        ),
    )
    wait_for("the worker", lambda: new.alive("worker") and " ready." in new.log("worker"))
    wait_for("beat", lambda: new.alive("beat") and "beat: Starting" in new.log("beat"))

    # 5. A product saved in `manage.py shell` reaches the sandbox through the worker.
    new.readme("python manage.py migrate", "--check")  # nothing left to migrate
    new.run([str(new.venv / "bin" / "python"), "manage.py", "shell", "-c", readme.shell_code()])
    product_pk, remote_id = wait_for(
        "the product to be pushed",
        lambda: new.rows(
            "SELECT id, remote_id FROM billing_integration_product "
            "WHERE name = 'Pro' AND sync_state = 'synced'"
        ),
    )[0]
    [call] = sandbox.requests("create_product")
    assert call["status"] == 200 and call["body"]["selected_currencies"] == ["1"]
    assert call["body"]["name"] == "Pro"

    # Log in through the project's login page, then POST the checkout form with its token.
    browser = requests.Session()
    page = browser.get(f"{new.web}/accounts/login/", timeout=30)
    answer = browser.post(
        f"{new.web}/accounts/login/",
        data={"csrfmiddlewaretoken": csrf_of(page.text), "username": "ada", "password": PASSWORD},
        allow_redirects=False,
        timeout=30,
    )
    assert answer.status_code == 302, answer.text[:2000]
    page = browser.get(f"{new.web}/accounts/login/", timeout=30)  # a fresh token after login
    answer = browser.post(
        f"{new.web}/billing/checkout/",
        data={
            "csrfmiddlewaretoken": csrf_of(page.text),
            "product": product_pk,
            "cycle": "months-1",
            "currency": "XOF",
        },
        allow_redirects=False,
        timeout=60,
    )
    assert answer.status_code == 302, answer.text[:2000]
    session_id = answer.headers["Location"].rsplit("/", 1)[-1]
    assert answer.headers["Location"] == f"{new.sandbox_url}/checkout/{session_id}"

    # Pay on the hosted page: the sandbox's signed events reach the callback, the worker
    # applies them, and the subscription row appears in the project's database.
    paid = sandbox.complete_checkout(session_id, "0700000001")
    assert 'data-outcome="success"' in paid.text
    [remote] = sandbox.objects("subscription")
    assert uuid.UUID(remote["product"]).hex == remote_id  # SQLite keeps UUIDs as hex
    assert sandbox.wait_for_deliveries(60)
    deliveries = sandbox.deliveries()
    assert [(d["event_type"], d["status"]) for d in deliveries] == [
        ("payment.completed", "delivered"),
        ("invoice.paid", "delivered"),
    ]
    sub_row = (
        "SELECT status, last_payment_status FROM billing_integration_subscription "
        "WHERE remote_id = ?"
    )
    wait_for(
        "the subscription from the events",
        lambda: new.rows(sub_row, uuid.UUID(remote["id"]).hex) == [("published", "completed")],
    )
    back = browser.get(f"{new.web}/billing/checkout/return/?session_id={session_id}", timeout=60)
    assert back.status_code == 200 and 'data-outcome="active"' in back.text

    # A signed event updates the subscription.
    sandbox.trigger("subscription.canceled", remote["id"])
    assert sandbox.wait_for_deliveries(60)
    assert sandbox.deliveries()[-1]["status"] == "delivered"
    wait_for(
        "the canceled subscription",
        lambda: new.rows(sub_row, uuid.UUID(remote["id"]).hex)[0][0] == "canceled",
    )
    assert new.alive("beat") and new.alive("worker") and new.alive("web")
    new.stop()

    # 6. The README's host test file, with pytest, in the new project.
    passed = new.run(
        [str(new.venv / "bin" / "pytest"), "-q", "-p", "no:cacheprovider"], timeout=600
    )
    assert "1 passed" in passed, passed
