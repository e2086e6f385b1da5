"""Celery task discovery: ``app.autodiscover_tasks()`` imports this module, which imports every
task module of the app. A broken import fails loudly here."""

from .checkout import tasks as checkout_tasks  # noqa: F401
from .notices import tasks as notice_tasks  # noqa: F401
from .outbox import tasks as outbox_tasks  # noqa: F401
from .reporting import tasks as reporting_tasks  # noqa: F401
from .sync import tasks as sync_tasks  # noqa: F401
from .webhooks import prune, tasks  # noqa: F401
