"""A team/organisation as the subscriber model (``BILLING['SUBSCRIBER_MODEL'] = "teams.Team"``).

The app's migration reads the setting at migration time, so the proof runs in a subprocess
with its own settings (``tests/team_project/settings.py``) and a fresh SQLite file: migrate,
make a team a customer, read the facts back; then ``makemigrations --check`` under the same
setting must find nothing to change.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def team_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(
        DJANGO_SETTINGS_MODULE="tests.team_project.settings",
        TEAM_PROJECT_DB=str(tmp_path / "team.sqlite3"),
        # The customer's push is published on commit: into a private folder, not var/.
        CELERY_BROKER_URL="filesystem://",
        CELERY_BROKER_FOLDER=str(tmp_path),
        PYTHONPATH=str(ROOT),
    )
    return env


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture(scope="module")
def team_facts(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp_path = tmp_path_factory.mktemp("team_project")
    proc = run(["-m", "tests.team_project.check"], team_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    facts["_tmp"] = str(tmp_path)
    return facts


def test_migration_points_the_customer_fk_at_the_team_table(team_facts: dict) -> None:
    assert team_facts["subscriber_setting"] == "teams.Team"
    assert team_facts["field_target"] == "teams.Team"
    # Introspected from the migrated database, not from the model state.
    assert team_facts["fk_column"] == "subscriber_id"
    assert team_facts["fk_referenced_table"] == team_facts["team_table"] == "teams_team"
    assert team_facts["fk_referenced_column"] == "id"


def test_get_or_create_customer_links_the_team(team_facts: dict) -> None:
    assert team_facts["created"] is True
    assert team_facts["created_again"] is False
    assert team_facts["same_customer"] is True
    assert team_facts["subscriber_is_team"] is True
    assert team_facts["reverse_accessor"] is True  # team.billing_customer
    # The default identifier rule: "<app_label>.<model_name>:<pk>".
    assert team_facts["identifier"] == f"teams.team:{team_facts['team_pk']}"
    assert team_facts["identifier_rule"] == team_facts["identifier"]
    # The default fields rule reads the team's attributes.
    assert team_facts["first_name"] == "Acme"
    assert team_facts["email"] == "billing@acme.test"
    assert team_facts["outbox_entries"] == 1  # queued for push, once


def test_subscriptions_for_a_team(team_facts: dict) -> None:
    assert team_facts["for_subscriber"] == [team_facts["subscription_pk"]]
    assert team_facts["for_other_team"] == []


def test_a_user_passed_for_the_team_is_refused_naming_the_model(team_facts: dict) -> None:
    refused = team_facts["user_refused"]
    assert refused.startswith("TypeError: "), refused
    assert "BILLING['SUBSCRIBER_MODEL'] ('teams.Team')" in refused and "User" in refused
    assert "get_subscriber(request)" in refused
    assert team_facts["customers_after_refusal"] == 0


def test_no_missing_migration_under_the_team_setting(team_facts: dict) -> None:
    proc = run(
        ["manage.py", "makemigrations", "--check", "--dry-run", "billing_integration", "teams"],
        team_env(Path(team_facts["_tmp"])),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No changes detected" in proc.stdout
