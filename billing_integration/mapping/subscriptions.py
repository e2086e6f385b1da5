"""Subscription <-> wire. ``selected_currency`` is sent as a code, or as an id with
``BILLING['GUESSES']['subscription_currency_form'] = "id"``; one the settings do not know is
stored as received (logged once). Statuses are stripped and lower-cased here, once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import currencies
from ..conf import guesses
from ..exceptions import BillingConfigurationError, RemoteDataError
from .common import (
    carried,
    log_once,
    normal_status,
    reference,
    remote_meta,
    storable,
    text,
    ts,
    wire_ts,
)

if TYPE_CHECKING:
    from ..models import Subscription

DATES = ("cycle_start_date", "cycle_end_date", "next_billing_date", "trial_end_date")
#: Fields owned by the service: a pull or event always overwrites them.
REMOTE_OWNED: tuple[str, ...] = ("status", *DATES, "auto_renew", "selected_billing_cycle")
REMOTE_OWNED += ("selected_currency", "product_remote_id", "customer_remote_id", "discount_coupon")


def currency_code(value: Any) -> str:
    """The code of a currency id or code; ``""`` for none."""
    return "" if value in (None, "") else currencies.currency_code(value)


def wire_currency(value: Any) -> str:
    """``selected_currency`` as POST /subscriptions sends it, in the configured form."""
    code = currency_code(value)
    if guesses()["subscription_currency_form"] == "id" and code:
        return str(currencies.currency_id(code))
    return code


def _remote_currency(value: Any) -> str:
    """The currency's code; an id or code the settings do not know as received (logged once);
    ``RemoteDataError`` for a value that is no id or code (a list, an object, a boolean)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float, type(None))):
        raise RemoteDataError("selected_currency", value, "not a currency")
    try:
        return currency_code(value)
    except BillingConfigurationError:
        received = str(value)
        message = "Subscription currency %r is not in BILLING['CURRENCIES']; stored as received."
        log_once(message, received[:80])
        return received


def _remote_status(value: Any, present: bool) -> str:
    """The status stripped and lower-cased (``""`` for null); an unknown one is logged once."""
    from ..models.subscriptions import Subscription, is_known_status

    if value is not None and not isinstance(value, str):
        raise RemoteDataError("status", value, "not a string")
    status = normal_status(Subscription, value)
    if present and not is_known_status(status):
        log_once(
            "Unknown subscription status %r: stored, grants no access (add it to "
            "BILLING['ACTIVE_STATUSES'] if it means a live subscription).",
            status[:80],
        )
    return status


def to_remote(subscription: Subscription) -> dict[str, Any]:
    customer, product = subscription.customer, subscription.product
    customer_id = customer.remote_id if customer is not None else None
    product_id = product.remote_id if product is not None else None
    body: dict[str, Any] = {
        "customer": str(customer_id or subscription.customer_remote_id or ""),
        "product": str(product_id or subscription.product_remote_id or ""),
        "selected_currency": wire_currency(subscription.selected_currency),
        "selected_billing_cycle": subscription.selected_billing_cycle,
        "auto_renew": bool(subscription.auto_renew),
    }
    if subscription.trial_end_date is not None:
        body["trial_end_date"] = wire_ts(subscription.trial_end_date)
    return body


def _auto_renew(value: Any) -> bool:
    """A boolean, 0 or 1, or its text ("true", "false" in any case, "1", "0"); null or "", like
    an absent field, is the interface's default, true (a stored row keeps its own: ``carried``)."""
    if value is None or value == "":
        return True
    if isinstance(value, bool) or value in (0, 1):
        return bool(value)
    word = value.strip().lower() if isinstance(value, str) else None
    if word in ("true", "false", "1", "0"):
        return word in ("true", "1")
    raise RemoteDataError("auto_renew", value, "not a boolean")


def from_remote(data: dict[str, Any]) -> dict[str, Any]:
    """Model field values from a subscription resource (``RemoteDataError`` if unstorable)."""
    from ..models import Subscription

    fields = remote_meta(data)
    fields["status"] = _remote_status(data.get("status"), data.get("status") not in (None, ""))
    fields["product_remote_id"] = reference(data.get("product"), "product")
    fields["customer_remote_id"] = reference(data.get("customer"), "customer")
    for name in DATES:
        fields[name] = ts(data.get(name), name)
    fields["auto_renew"] = _auto_renew(data.get("auto_renew", True))
    cycle = data.get("selected_billing_cycle") or None
    fields["selected_billing_cycle"] = text(Subscription, "selected_billing_cycle", cycle)
    currency = _remote_currency(data.get("selected_currency"))
    fields["selected_currency"] = text(Subscription, "selected_currency", currency)
    fields["discount_coupon"] = storable(data.get("discount_coupon"), "discount_coupon")
    return fields


#: Subscription field -> key in the resource, for the fields the mapping fills from another key.
SOURCE = {
    "remote_id": "id",
    "remote_created": "date_created",
    "remote_updated": "date_updated",
    "remote_user_created": "user_created",
    "remote_user_updated": "user_updated",
    "product_remote_id": "product",
    "customer_remote_id": "customer",
}


def carried_from_remote(data: dict[str, Any]) -> dict[str, Any]:
    """``from_remote`` with only the fields ``data`` carries (``common.carried``), and
    ``remote_data``: a field left out, or a null status, customer or product, keeps what is
    stored. Events and pulls apply a subscription so."""
    mapped = from_remote(data)
    return {
        name: value
        for name, value in mapped.items()
        if name == "remote_data" or carried(data, SOURCE, name)
    }
