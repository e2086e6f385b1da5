import os
from typing import Any

from celery import Celery
from celery.signals import setup_logging, task_postrun, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

app = Celery("example_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@setup_logging.connect
def use_django_logging(**kwargs: Any) -> None:
    """A worker logs through settings.LOGGING, as the web process does, instead of adding
    Celery's handler to the root logger (which printed every app line twice)."""
    from logging.config import dictConfig

    from django.conf import settings

    dictConfig(settings.LOGGING)


@task_prerun.connect
@task_postrun.connect
def close_old_connections(task: Any = None, **kwargs: Any) -> None:
    """Around every task a worker runs, what Django does around every request: close a
    database connection that is broken or older than CONN_MAX_AGE (the next query opens a new
    one). Needed only where CELERY_DB_REUSE_MAX lets a worker keep its connection between
    tasks. Not for a task run eagerly (in the caller's process, maybe in its transaction)."""
    if task is not None and getattr(task.request, "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()
