"""``after_commit_inline()``: run the app's after-commit work inside a test's transaction.

A test marked ``django_db`` (not ``transaction=True``) runs in one transaction that is rolled
back at the end, so nothing in it ever commits, and ``transaction.on_commit`` callbacks never
run: outbox pushes are never enqueued (a saved product stays ``pending``, so checkout answers
409), a stored event is never handed to processing (the webhook answers 200 ``received`` and no
receiver runs), and the signals of processed events are never sent.

Inside ``after_commit_inline()`` the test's own transaction counts as "no transaction" for the
code under test: an ``on_commit`` callback registered outside any block of that code runs at
once, and the callbacks registered inside a block of that code run when its outermost block
exits, the moment a real commit would happen (callbacks of a block that rolled back are
dropped, as Django does). Celery runs eagerly (``task_always_eager``, and
``CELERY_TASK_ALWAYS_EAGER`` in settings when given pytest-django's ``settings``), so the
drains these callbacks wake run in the test. Callbacks already waiting when it starts (from
fixtures set up before it) run at that moment. In a ``transaction=True`` test the callbacks
already run on real commits; only Celery changes.

The pytest plugin offers it as the ``billing_inline`` fixture.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

logger = logging.getLogger("billing_integration.testing")

__all__ = ["after_commit_inline"]


def _at_test_level(connection: Any) -> bool:
    """True when the only open atomic blocks are the test case's own: code under test sees
    no transaction of its own (where a real commit would just have happened)."""
    blocks = connection.atomic_blocks
    return (
        connection.in_atomic_block
        and bool(blocks)
        and all(getattr(block, "_from_testcase", False) for block in blocks)
    )


def _call(func: Callable[[], Any], robust: bool) -> None:
    if not robust:
        func()
        return
    try:
        func()
    except Exception as exc:  # what Django does with a robust callback
        logger.error("Error calling %s in on_commit() (%s).", func.__qualname__, exc, exc_info=True)


def _flush(connection: Any) -> None:
    """Run the callbacks waiting on ``connection`` (those of blocks that have ended) in order,
    as Django runs them after a commit: the list is taken first, so a callback whose own
    transaction commits runs the callbacks of that transaction, not the ones queued after it."""
    while connection.run_on_commit and _at_test_level(connection):
        pending, connection.run_on_commit = connection.run_on_commit, []
        while pending:
            _sids, func, robust = pending.pop(0)
            _call(func, robust)


def _wakeup_names() -> list[str]:
    from ..outbox.tasks import wakeup_name

    return [wakeup_name()]


@contextlib.contextmanager
def after_commit_inline(settings: Any = None) -> Iterator[None]:
    """Run ``on_commit`` work (pushes, event processing, signals) and Celery tasks inside the
    test; see the module docstring. ``settings``: pytest-django's ``settings`` fixture, to set
    ``CELERY_TASK_ALWAYS_EAGER`` there too (restored by that fixture)."""
    from celery import current_app
    from django.db import connections, transaction
    from django.db.backends.base.base import BaseDatabaseWrapper

    from .. import wakeup

    app = current_app._get_current_object()
    saved_conf = {key: app.conf.get(key) for key in ("task_always_eager", "task_eager_propagates")}
    original_on_commit = BaseDatabaseWrapper.on_commit
    original_exit = transaction.Atomic.__exit__

    def on_commit(self: Any, func: Callable[[], Any], robust: bool = False) -> None:
        if _at_test_level(self):
            if not callable(func):
                raise TypeError("on_commit()'s callback must be a callable.")
            _call(func, robust)  # the code under test is in "autocommit": now
        else:
            original_on_commit(self, func, robust)

    def atomic_exit(self: Any, exc_type: Any, exc_value: Any, traceback: Any) -> Any:
        result = original_exit(self, exc_type, exc_value, traceback)
        connection = transaction.get_connection(self.using)
        if _at_test_level(connection):  # its outermost block ended: a real commit point
            _flush(connection)
        return result

    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    if settings is not None:
        settings.CELERY_TASK_ALWAYS_EAGER = True
        settings.CELERY_TASK_EAGER_PROPAGATES = True
    for name in _wakeup_names():  # no wake-up flag left by an earlier test suppresses a kick
        wakeup.clear(name)
    BaseDatabaseWrapper.on_commit = on_commit  # type: ignore[method-assign]
    transaction.Atomic.__exit__ = atomic_exit  # type: ignore[method-assign]
    try:
        for connection in connections.all(initialized_only=True):
            _flush(connection)
        yield
    finally:
        BaseDatabaseWrapper.on_commit = original_on_commit  # type: ignore[method-assign]
        transaction.Atomic.__exit__ = original_exit  # type: ignore[method-assign]
        for key, value in saved_conf.items():
            app.conf[key] = value
