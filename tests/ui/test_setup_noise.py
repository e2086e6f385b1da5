"""Setup noise gone (issue 14): no models.W040 on SQLite, an SPDX licence string, a demo
worker that stops without ERROR lines."""

from __future__ import annotations

import io
import re
import tomllib
from pathlib import Path

import pytest
from django.core.management import call_command

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
def test_system_check_with_the_database_has_no_w040(settings) -> None:
    settings.BILLING = {**settings.BILLING, "WEBHOOK_SECRET": "whsec_" + "A" * 32}
    out, err = io.StringIO(), io.StringIO()
    call_command("check", databases=["default"], tags=["models"], stdout=out, stderr=err)
    assert "W040" not in out.getvalue() + err.getvalue()
    assert "no issues" in out.getvalue()


def test_licence_is_an_spdx_expression() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert data["project"]["license"] == "MIT"  # not the deprecated {text = ...} table
    setuptools = next(r for r in data["build-system"]["requires"] if r.startswith("setuptools"))
    assert int(re.search(r">=(\d+)", setuptools).group(1)) >= 77


def test_demo_worker_has_no_pool_processes_to_kill() -> None:
    """honcho signals every process on Ctrl-C; prefork pool children killed that way are
    logged as ERROR by the worker. A thread (or solo) pool has none."""
    worker = next(
        ln for ln in (ROOT / "Procfile").read_text().splitlines() if ln.startswith("worker:")
    )
    assert re.search(r"--pool[ =](threads|solo)\b", worker)
