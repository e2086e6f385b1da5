"""Django signals for the host application.

Sent after an event has been applied and the local state committed (``on_commit``); a
receiver that raises is logged and does not undo anything. Every signal is sent with
``sender=WebhookEvent`` and the keyword arguments:

- ``event``: the ``WebhookEvent`` row (``event.type``, ``event.payload``, ...);
- ``event_type``: the canonical type;
- ``data``: the event's ``data`` object (a dict);
- ``objects``: the local objects the event touched, by name (``subscription``, ``payment``,
  ``refund``, ``invoice``; a payment event's ``subscription`` when it is mirrored), and the
  same names as keyword arguments.

``billing_event_received`` is sent for every processed event; ``SIGNALS[type]`` (for example
``invoice_paid``) for events of one type.
"""

from __future__ import annotations

from django.dispatch import Signal

from . import types

billing_event_received = Signal()

subscription_renewal = Signal()
subscription_canceled = Signal()
subscription_paused = Signal()
payment_completed = Signal()
payment_failed = Signal()
payment_canceled = Signal()
refund_initiated = Signal()
refund_approved = Signal()
refund_rejected = Signal()
invoice_paid = Signal()
invoice_voided = Signal()
invoice_marked_uncollectable = Signal()
invoice_deleted = Signal()

#: Canonical type -> its signal. A host registering a handler for a type of its own
#: (``@handler``) may add a signal here.
SIGNALS: dict[str, Signal] = {
    types.SUBSCRIPTION_RENEWAL: subscription_renewal,
    types.SUBSCRIPTION_CANCELED: subscription_canceled,
    types.SUBSCRIPTION_PAUSED: subscription_paused,
    types.PAYMENT_COMPLETED: payment_completed,
    types.PAYMENT_FAILED: payment_failed,
    types.PAYMENT_CANCELED: payment_canceled,
    types.REFUND_INITIATED: refund_initiated,
    types.REFUND_APPROVED: refund_approved,
    types.REFUND_REJECTED: refund_rejected,
    types.INVOICE_PAID: invoice_paid,
    types.INVOICE_VOIDED: invoice_voided,
    types.INVOICE_MARKED_UNCOLLECTABLE: invoice_marked_uncollectable,
    types.INVOICE_DELETED: invoice_deleted,
}

__all__ = [
    "SIGNALS",
    "billing_event_received",
    *(s.replace(".", "_") for s in types.CANONICAL_TYPES),
]
