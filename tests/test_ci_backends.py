"""A test that needs PostgreSQL, Redis or RabbitMQ is skipped where they are absent, and fails
instead under CI (``tests/conftest.py``), so CI cannot pass without running it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONFTEST = """
from tests.conftest import pytest_runtest_makereport, pytest_runtest_setup  # noqa: F401
"""

TESTS = """
import pytest

@pytest.mark.postgresql
def test_needs_postgresql():
    pass

@pytest.mark.redis
def test_needs_redis():
    pass

@pytest.mark.rabbitmq
def test_needs_rabbitmq():
    pass

def test_needs_nothing():
    pass
"""


def run_inner(tmp_path: Path, ci: str | None) -> str:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nDJANGO_SETTINGS_MODULE = example_project.settings\n"
        "markers =\n    postgresql: x\n    redis: x\n    rabbitmq: x\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "DATABASE_URL")}
    env["PYTHONPATH"] = str(ROOT)
    env["PATH"] = str(Path(sys.executable).parent)  # no redis-server on it
    env["RABBITMQ_URL"] = f"amqp://guest:guest@127.0.0.1:{free_port()}//"  # nothing answers
    if ci is not None:
        env["CI"] = ci
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.stdout + result.stderr


def test_backend_tests_skip_outside_ci(tmp_path):
    out = run_inner(tmp_path, ci="false")  # "false" or unset: not CI
    assert "1 passed, 3 skipped" in out, out
    assert "needs PostgreSQL" in out and "needs redis-server on PATH" in out
    assert "needs RabbitMQ: none answers at 127.0.0.1:" in out


def test_backend_tests_fail_when_skipped_under_ci(tmp_path):
    out = run_inner(tmp_path, ci="true")
    assert "1 passed" in out and "skipped" not in out.splitlines()[-1], out
    assert "ERROR test_inner.py::test_needs_postgresql" in out, out
    assert "ERROR test_inner.py::test_needs_redis" in out, out
    assert "ERROR test_inner.py::test_needs_rabbitmq" in out, out
    assert "a test marked postgresql must run in CI" in out
    assert "a test marked redis must run in CI" in out
    assert "a test marked rabbitmq must run in CI" in out
