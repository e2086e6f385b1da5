"""Canonical event types (``<group>.<event>``), a project's own (``OWN_TYPES``), and
``normalize_type``, which maps spellings (``InvoiceMarkedUncollectable``,
``subscription.cancelled``, ``EVENT_TYPE_ALIASES``) onto them."""

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

#: Group spellings -> canonical group.
_GROUPS = {
    **dict.fromkeys(("subscription", "subscriptions", "sub"), "subscription"),
    **dict.fromkeys(("payment", "payments", "charge"), "payment"),
    **dict.fromkeys(("refund", "refunds"), "refund"),
    **dict.fromkeys(("invoice", "invoices"), "invoice"),
}

#: Words that carry no meaning in a type name.
_FILLER = frozenset({"as", "is", "has", "been", "was", "event", "the", "a"})

#: Canonical type -> the spellings of its action (the words after the group, joined by "_").
_SPELLINGS = {
    SUBSCRIPTION_RENEWAL: "renewal renewed renew renews",
    SUBSCRIPTION_CANCELED: "canceled cancelled cancel cancellation",
    SUBSCRIPTION_PAUSED: "paused pause",
    PAYMENT_COMPLETED: "completed complete succeeded success successful",
    PAYMENT_FAILED: "failed failure fail",
    PAYMENT_CANCELED: "canceled cancelled cancel",
    REFUND_INITIATED: "initiated initiate created requested",
    REFUND_APPROVED: "approved approve",
    REFUND_REJECTED: "rejected reject declined",
    INVOICE_PAID: "paid",
    INVOICE_VOIDED: "voided void",
    INVOICE_MARKED_UNCOLLECTABLE: (
        "marked_uncollectable uncollectable marked_uncollectible uncollectible"
    ),
    INVOICE_DELETED: "deleted delete",
}
CANONICAL_TYPES: tuple[str, ...] = tuple(_SPELLINGS)
#: (group, action) -> canonical type.
_ACTIONS = {
    (t.split(".")[0], a): t for t, spellings in _SPELLINGS.items() for a in spellings.split()
}

#: Types of a project's own, registered with ``@handler("plan.extended")``: recognised as they
#: are spelled (a different spelling needs an alias).
OWN_TYPES: set[str] = set()

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = re.compile(r"[^a-z0-9]+")


def _words(raw: str) -> list[str]:
    text = _CAMEL.sub(" ", raw).lower()
    return [w for w in _SEPARATORS.split(text) if w and w not in _FILLER]


def normalize_type(raw: object) -> str:
    """The canonical type of a spelling, or a project's own type as spelled ("" if not known);
    the aliases first."""
    if not isinstance(raw, str) or not raw.strip() or len(raw) > 255:
        return ""
    configured = billing_settings.get("EVENT_TYPE_ALIASES") or {}
    if (raw in CANONICAL_TYPES or raw in OWN_TYPES) and not configured:
        return raw  # the common case, without the spelling analysis below
    words = _words(raw)
    if not words:
        return ""
    aliases = {"_".join(_words(str(k))): str(v) for k, v in configured.items()}
    alias = aliases.get("_".join(words))
    if alias or raw in CANONICAL_TYPES or raw in OWN_TYPES:
        return alias or raw
    return _ACTIONS.get((_GROUPS.get(words[0], ""), "_".join(words[1:])), "")
