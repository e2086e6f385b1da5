"""Start the sandbox as a separate process for a benchmark (so it does not share our GIL)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def sandbox_process(*extra: str):
    """Yield the ``BILLING_*`` environment of a fresh in-memory sandbox process."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "billing_integration.sandbox",
            "--port",
            str(port),
            "--memory",
            "--quiet",
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    env: dict[str, str] = {}
    try:
        while len(env) < 6:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("the sandbox exited before printing its settings")
            if "=" in line and line.startswith("BILLING_"):
                key, value = line.strip().split("=", 1)
                env[key] = value
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                requests.get(env["BILLING_BASE_URL"] + "/_sandbox/clock", timeout=1)
                break
            except requests.ConnectionError:
                time.sleep(0.05)
        yield env
    finally:
        proc.terminate()
        proc.wait(timeout=10)
