"""CheckoutSession <-> wire. POST /checkout_sessions sends ``selected_currency`` as an
integer *id* (unlike subscriptions, which send the code)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from .. import currencies
from ..conf import billing_settings
from .common import remote_meta, ts, wire_ts

if TYPE_CHECKING:
    from ..models import CheckoutSession


def currency_id(value: Any) -> int | None:
    return None if value in (None, "") else currencies.currency_id(value)


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
    return remote_meta(data) | {
        "status": data.get("status") or "",
        "expires_at": ts(data.get("expires_at"), "expires_at"),
        "action": data.get("action") or "new_subscription",
        "completed_at": ts(data.get("completed_at"), "completed_at"),
        "selected_billing_cycle": data.get("selected_billing_cycle") or "",
        "selected_currency": currency_id(data.get("selected_currency")),
        "upgrade_to": data.get("upgrade_to"),
        "downgrade_to": data.get("downgrade_to"),
    }
