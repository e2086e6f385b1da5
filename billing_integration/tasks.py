"""Celery task discovery: ``app.autodiscover_tasks()`` imports this module, which imports
every task module of the app: the outbox (``billing_integration.push_pending``, the drain a
commit kicks; ``.push_entry``; ``.drain_outbox``), the pull (``.sync_all``) and the event
processing (``.process_webhook_event``, ``.process_received_events``,
``.process_pending_webhook_events``); the notices (``.send_notice``). A broken import
fails loudly here.
"""

from .notices.tasks import send_notice
from .outbox.tasks import drain_outbox, push_entry, push_pending
from .sync.tasks import sync_all
from .webhooks import tasks as webhook_tasks

__all__ = ["drain_outbox", "push_entry", "push_pending", "send_notice", "sync_all", "webhook_tasks"]
