"""Celery task discovery: ``app.autodiscover_tasks()`` imports this module.

The outbox tasks (``billing_integration.push_pending`` - the drain a commit kicks,
``.push_entry``, ``.drain_outbox``, ``.sync_all``) and,
when present, the webhook processing tasks.
"""

import contextlib
import importlib

from .outbox.tasks import drain_outbox, push_entry, push_pending, sync_all

__all__ = ["drain_outbox", "push_entry", "push_pending", "sync_all"]

with contextlib.suppress(ImportError):
    importlib.import_module("billing_integration.webhooks.tasks")
