import os
from typing import Any

from celery import Celery
from celery.signals import task_postrun, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

app = Celery("example_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


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
