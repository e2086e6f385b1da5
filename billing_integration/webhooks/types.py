"""Canonical event types and the normalisation of the spellings a service may send.

The canonical names are ``<group>.<event>``. ``normalize_type`` maps variants
such as ``"Invoice Marked as uncollectable"``, ``INVOICE_MARKED_UNCOLLECTABLE``,
``invoice.marked-as-uncollectable``, ``InvoiceMarkedUncollectable`` or
``subscription.cancelled`` onto them, and returns ``""`` for a type it does not know.
``BILLING['EVENT_TYPE_ALIASES']`` adds spellings (``{"sub.renew": "subscription.renewal"}``).
"""

from __future__ import annotations

import re

from ..conf import billing_settings

SUBSCRIPTION_RENEWAL = "subscription.renewal"
SUBSCRIPTION_CANCELED = "subscription.canceled"
SUBSCRIPTION_PAUSED = "subscription.paused"
PAYMENT_COMPLETED = "payment.completed"
PAYMENT_FAILED = "payment.failed"
PAYMENT_CANCELED = "payment.canceled"
REFUND_INITIATED = "refund.initiated"
REFUND_APPROVED = "refund.approved"
REFUND_REJECTED = "refund.rejected"
INVOICE_PAID = "invoice.paid"
INVOICE_VOIDED = "invoice.voided"
INVOICE_MARKED_UNCOLLECTABLE = "invoice.marked_uncollectable"
INVOICE_DELETED = "invoice.deleted"

CANONICAL_TYPES: tuple[str, ...] = (
    SUBSCRIPTION_RENEWAL,
    SUBSCRIPTION_CANCELED,
    SUBSCRIPTION_PAUSED,
    PAYMENT_COMPLETED,
    PAYMENT_FAILED,
    PAYMENT_CANCELED,
    REFUND_INITIATED,
    REFUND_APPROVED,
    REFUND_REJECTED,
    INVOICE_PAID,
    INVOICE_VOIDED,
    INVOICE_MARKED_UNCOLLECTABLE,
    INVOICE_DELETED,
)

#: Group spellings -> canonical group.
_GROUPS = {
    "subscription": "subscription",
    "subscriptions": "subscription",
    "sub": "subscription",
    "payment": "payment",
    "payments": "payment",
    "charge": "payment",
    "refund": "refund",
    "refunds": "refund",
    "invoice": "invoice",
    "invoices": "invoice",
}

#: Words that carry no meaning in a type name.
_FILLER = frozenset({"as", "is", "has", "been", "was", "event", "the", "a"})

#: (group, action) -> canonical type. The action is the remaining words joined by "_".
_ACTIONS: dict[str, dict[str, str]] = {
    "subscription": {
        "renewal": SUBSCRIPTION_RENEWAL,
        "renewed": SUBSCRIPTION_RENEWAL,
        "renew": SUBSCRIPTION_RENEWAL,
        "renews": SUBSCRIPTION_RENEWAL,
        "canceled": SUBSCRIPTION_CANCELED,
        "cancelled": SUBSCRIPTION_CANCELED,
        "cancel": SUBSCRIPTION_CANCELED,
        "cancellation": SUBSCRIPTION_CANCELED,
        "paused": SUBSCRIPTION_PAUSED,
        "pause": SUBSCRIPTION_PAUSED,
    },
    "payment": {
        "completed": PAYMENT_COMPLETED,
        "complete": PAYMENT_COMPLETED,
        "succeeded": PAYMENT_COMPLETED,
        "success": PAYMENT_COMPLETED,
        "successful": PAYMENT_COMPLETED,
        "failed": PAYMENT_FAILED,
        "failure": PAYMENT_FAILED,
        "fail": PAYMENT_FAILED,
        "canceled": PAYMENT_CANCELED,
        "cancelled": PAYMENT_CANCELED,
        "cancel": PAYMENT_CANCELED,
    },
    "refund": {
        "initiated": REFUND_INITIATED,
        "initiate": REFUND_INITIATED,
        "created": REFUND_INITIATED,
        "requested": REFUND_INITIATED,
        "approved": REFUND_APPROVED,
        "approve": REFUND_APPROVED,
        "rejected": REFUND_REJECTED,
        "reject": REFUND_REJECTED,
        "declined": REFUND_REJECTED,
    },
    "invoice": {
        "paid": INVOICE_PAID,
        "voided": INVOICE_VOIDED,
        "void": INVOICE_VOIDED,
        "marked_uncollectable": INVOICE_MARKED_UNCOLLECTABLE,
        "uncollectable": INVOICE_MARKED_UNCOLLECTABLE,
        "marked_uncollectible": INVOICE_MARKED_UNCOLLECTABLE,
        "uncollectible": INVOICE_MARKED_UNCOLLECTABLE,
        "deleted": INVOICE_DELETED,
        "delete": INVOICE_DELETED,
    },
}

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = re.compile(r"[^a-z0-9]+")


def _words(raw: str) -> list[str]:
    text = _CAMEL.sub(" ", raw).lower()
    return [w for w in _SEPARATORS.split(text) if w and w not in _FILLER]


def type_key(raw: str) -> str:
    """The spelling-insensitive key of a type name (``invoice_marked_uncollectable``)."""
    return "_".join(_words(raw))


def _aliases() -> dict[str, str]:
    configured = billing_settings.get("EVENT_TYPE_ALIASES") or {}
    return {type_key(str(k)): str(v) for k, v in configured.items()}


def normalize_type(raw: object) -> str:
    """The canonical type for a spelling, or ``""`` if it is not known.

    ``BILLING['EVENT_TYPE_ALIASES']`` is consulted first (keys compared spelling-insensitively);
    a value there may be any type with a registered handler, not only the built-in ones.
    """
    if not isinstance(raw, str) or not raw.strip() or len(raw) > 255:
        return ""
    if raw in CANONICAL_TYPES and not billing_settings.get("EVENT_TYPE_ALIASES"):
        return raw  # the common case, without the spelling analysis below
    words = _words(raw)
    if not words:
        return ""
    key = "_".join(words)
    alias = _aliases().get(key)
    if alias:
        return alias
    if raw in CANONICAL_TYPES:
        return raw
    group = _GROUPS.get(words[0])
    if group is None:
        return ""
    return _ACTIONS[group].get("_".join(words[1:]), "")
