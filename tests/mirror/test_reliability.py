"""The reliability suite at CI size (benchmarks/reliability.py runs the full size)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.redis
def test_reliability_ci_size():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [sys.executable, "benchmarks/reliability.py", "--changes", "100", "--outage", "10",
         "--broker-stop", "3", "--workers", "2", "--drain-timeout", "240"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=420,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    assert "changes lost: 0" in out
    assert "duplicate remote objects: 0" in out
    assert "objects whose remote state differs from local: 0" in out
