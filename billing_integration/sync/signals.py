"""``subscription_status_pulled``: a pull (or ``upsert_subscription``) changed the status of a
subscription known here, sent inside the write's transaction, as ``post_save`` is, with
``subscription`` (as written), ``previous_status`` and ``date_updated`` (the pulled row's, or
None when it has none). Not sent for a row new here, nor for a stale one."""

from __future__ import annotations

from django.dispatch import Signal

#: A pull changed the status of a subscription known here (``sender=Subscription``;
#: ``subscription``, ``previous_status``, ``date_updated``), sent inside the pull's transaction.
subscription_status_pulled = Signal()
