"""Celery task discovery: ``app.autodiscover_tasks()`` imports this module, which imports
every task module of the app. A broken import fails loudly here.
"""

from .notices.tasks import send_notice, sweep_notices
from .outbox.tasks import push_outbox_entry, sweep_outbox
from .sync.tasks import sync_all
from .webhooks import tasks as webhook_tasks
from .webhooks.prune import prune_events_task

__all__ = [
    "prune_events_task",
    "push_outbox_entry",
    "send_notice",
    "sweep_notices",
    "sweep_outbox",
    "sync_all",
    "webhook_tasks",
]
