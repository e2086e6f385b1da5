"""``billing_integration.tasks`` (what Celery's autodiscovery imports) registers every task of
the app, the beat schedule names only registered tasks, and a broken task module fails the
import instead of vanishing from the worker."""

from __future__ import annotations

import importlib
import sys

import pytest

import billing_integration.webhooks
from billing_integration import schedule
from example_project.celery import app


def test_every_task_module_is_registered_and_the_schedule_names_registered_tasks():
    importlib.import_module("billing_integration.tasks")
    names = set(app.tasks)
    for name in (
        "billing_integration.push_entry",
        "billing_integration.drain_outbox",
        "billing_integration.sync_all",
        "billing_integration.process_webhook_event",
        "billing_integration.process_pending_webhook_events",
    ):
        assert name in names
    assert {entry["task"] for entry in schedule.BEAT_SCHEDULE.values()} <= names
    assert app.tasks["billing_integration.sync_all"].__module__ == "billing_integration.sync.tasks"


def test_a_broken_webhook_task_module_fails_the_task_discovery(monkeypatch):
    monkeypatch.setitem(sys.modules, "billing_integration.webhooks.tasks", None)
    monkeypatch.delattr(billing_integration.webhooks, "tasks", raising=False)
    monkeypatch.delitem(sys.modules, "billing_integration.tasks", raising=False)
    with pytest.raises(ImportError):
        importlib.import_module("billing_integration.tasks")
