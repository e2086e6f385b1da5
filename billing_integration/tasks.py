"""Celery task discovery: ``app.autodiscover_tasks()`` imports this module, which imports
every task module of the app: the outbox (``billing_integration.push_pending``, the drain a
commit kicks; ``.push_entry``; ``.drain_outbox``), the pull (``.sync_all``) and the event
processing (``.process_webhook_event``, ``.process_received_events``,
``.process_pending_webhook_events``) and the event log's pruning (``.prune_events``). A broken
import fails loudly here.
"""

from .outbox.tasks import drain_outbox, push_entry, push_pending
from .sync.tasks import sync_all
from .webhooks import tasks as webhook_tasks
from .webhooks.prune import prune_events_task

__all__ = [
    "drain_outbox",
    "prune_events_task",
    "push_entry",
    "push_pending",
    "sync_all",
    "webhook_tasks",
]
