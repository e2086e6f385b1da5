"""Signals sent on commit once an event is applied (``sender=WebhookEvent``): ``SIGNALS[type]``
and ``billing_event_received``, with ``event``, ``event_type``, ``data``, ``objects`` (the
local objects touched, by name) and those objects as keyword arguments."""

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

#: Canonical type -> its signal (a host's own type may add one).
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
