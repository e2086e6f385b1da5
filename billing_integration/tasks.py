"""Celery task discovery: ``app.autodiscover_tasks()`` imports this module.

The outbox tasks (``billing_integration.push_pending`` - the push run a commit kicks,
``.drain_outbox`` - the periodic sweep, ``.sync_all``) and,
when present, the webhook processing tasks.
"""

import contextlib
import importlib

from .outbox.tasks import push_due_entries, requeue_stale_entries, sync_all

__all__ = ["push_due_entries", "requeue_stale_entries", "sync_all"]

with contextlib.suppress(ImportError):
    importlib.import_module("billing_integration.webhooks.tasks")
