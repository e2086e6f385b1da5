"""Celery task discovery: ``app.autodiscover_tasks()`` imports this module, which imports
every task module of the app: the outbox (``billing_integration.push_pending``, the push run
a commit kicks, as ``push_due_entries``; ``.drain_outbox``, the periodic sweep, as
``requeue_stale_entries``), the pull (``.sync_all``), the event processing
(``.process_webhook_event``, ``.process_pending_webhook_events``), the event log's pruning
(``.prune_events``) and the notices (``.send_notice``, ``.sweep_notices``). A broken import
fails loudly here.
"""

from .notices.tasks import send_notice, sweep_notices
from .outbox.tasks import push_due_entries, requeue_stale_entries
from .sync.tasks import sync_all
from .webhooks import tasks as webhook_tasks
from .webhooks.prune import prune_events_task

__all__ = [
    "prune_events_task",
    "push_due_entries",
    "requeue_stale_entries",
    "send_notice",
    "sweep_notices",
    "sync_all",
    "webhook_tasks",
]
