"""Signals sent on commit once an event is applied (``sender=WebhookEvent``): ``SIGNALS[type]``
and ``billing_event_received``, with ``event``, ``event_type``, ``data``, ``objects`` (the
local objects touched, by name), those objects as keyword arguments and ``previous_status``
(the status of the event's object before it; None for an object new here)."""

from __future__ import annotations

from django.dispatch import Signal

from . import types

billing_event_received = Signal()
subscription_renewal, subscription_canceled, subscription_paused = Signal(), Signal(), Signal()
payment_completed, payment_failed, payment_canceled = Signal(), Signal(), Signal()
refund_initiated, refund_approved, refund_rejected = Signal(), Signal(), Signal()
invoice_paid, invoice_voided, invoice_deleted = Signal(), Signal(), Signal()
invoice_marked_uncollectable = Signal()

#: Canonical type -> its signal, named after it (a host's own type may add one).
SIGNALS: dict[str, Signal] = {t: globals()[t.replace(".", "_")] for t in types.CANONICAL_TYPES}
