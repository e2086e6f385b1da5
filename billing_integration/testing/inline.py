"""``after_commit_inline()``: eager Celery, so what the app enqueues on commit runs in the test,
once a transaction really commits (a transactional test, or ``captureOnCommitCallbacks``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def after_commit_inline(settings: Any = None) -> Iterator[None]:
    """Run Celery tasks eagerly (errors propagate) inside the block. ``settings``:
    pytest-django's ``settings`` fixture, to set ``CELERY_TASK_ALWAYS_EAGER`` there too."""
    from celery import current_app

    keys = ("task_always_eager", "task_eager_propagates")
    saved = {key: current_app.conf.get(key) for key in keys}
    current_app.conf.update(task_always_eager=True, task_eager_propagates=True)
    if settings is not None:
        settings.CELERY_TASK_ALWAYS_EAGER = True
        settings.CELERY_TASK_EAGER_PROPAGATES = True
    try:
        yield
    finally:
        current_app.conf.update(saved)
