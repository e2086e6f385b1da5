"""CheckoutSession <-> wire. POST /checkout_sessions sends ``selected_currency`` as an
integer *id* (unlike subscriptions, which send the code)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from .. import currencies
from ..conf import billing_settings
from ..exceptions import BillingConfigurationError
from .common import lenient_ts, remote_meta, storable, wire_ts

if TYPE_CHECKING:
    from ..models import CheckoutSession


def currency_id(value: Any) -> int | None:
    return None if value in (None, "") else currencies.currency_id(value)


def _known_currency(value: Any) -> int | None:
    try:
        return currency_id(value)
    except BillingConfigurationError:
        return None


def _kept(data: dict[str, Any], name: str, limit: int) -> str | None:
    """A text value as the column takes it (``storable``, cut to ``limit``), None for another
    type."""
    value = data.get(name)
    return storable(value, name)[:limit] if isinstance(value, str) else None


def to_remote(session: CheckoutSession) -> dict[str, Any]:
    expires = session.expires_at or timezone.now() + timedelta(
        seconds=billing_settings.CHECKOUT_EXPIRY
    )
    customer, product = session.customer, session.product
    body = {
        "customer": str(customer.remote_id) if customer is not None else "",
        "product": str(product.remote_id) if product is not None else "",
        "expires_at": wire_ts(expires),
        "action": session.action or "new_subscription",
        "selected_currency": currency_id(session.selected_currency),
        # null for one-time products (the service refuses a cycle for them)
        "selected_billing_cycle": session.selected_billing_cycle or None,
    }
    # a plan change (a guess: the interface shows them null): only when set
    for name in ("upgrade_to", "downgrade_to"):
        if getattr(session, name):
            body[name] = getattr(session, name)
    return body


def from_remote(data: dict[str, Any]) -> dict[str, Any]:
    """The session as answered at its creation. Its id is what matters (the hosted page): a
    value the column cannot take (not text, too long, a time or a currency that does not
    parse) is kept only in ``remote_data``, never an error that would stop the checkout."""
    return remote_meta(data, strict=False) | {
        "status": _kept(data, "status", 32) or "",
        "expires_at": lenient_ts(data.get("expires_at"), "expires_at"),
        "action": _kept(data, "action", 32) or "new_subscription",
        "completed_at": lenient_ts(data.get("completed_at"), "completed_at"),
        "selected_billing_cycle": _kept(data, "selected_billing_cycle", 32) or "",
        "selected_currency": _known_currency(data.get("selected_currency")),
        "upgrade_to": _kept(data, "upgrade_to", 64),
        "downgrade_to": _kept(data, "downgrade_to", 64),
    }
