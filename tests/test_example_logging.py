"""The example project's logging: a log line is printed once, by web and worker alike."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import logging, os, sys, django
os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
django.setup()
if sys.argv[1] == "worker":
    from example_project.celery import app
    app.log.setup(loglevel="INFO")  # what `celery worker` does before it takes tasks
logging.getLogger(sys.argv[2]).info("line-%s", "once")
"""


def printed(process: str, logger: str) -> int:
    """How many times ``process`` ("web" or "worker") prints an INFO line of ``logger``."""
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, process, logger],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "BILLING_LOG_LEVEL": "INFO"},
    )
    assert run.returncode == 0, run.stderr
    return (run.stdout + run.stderr).count("line-once")


def test_a_worker_prints_an_app_log_line_once():
    assert printed("worker", "billing_integration.outbox") == 1


def test_the_web_process_prints_an_app_log_line_once():
    assert printed("web", "billing_integration.outbox") == 1


def test_a_worker_prints_its_own_task_lines():
    assert printed("worker", "celery.app.trace") == 1
