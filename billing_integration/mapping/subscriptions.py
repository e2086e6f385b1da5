"""Subscription <-> wire.

POST /subscriptions: ``customer`` and ``product`` (remote UUIDs), ``selected_currency`` (the
field is typed string: a currency code, ``"XOF"``, or with
``BILLING['SUBSCRIPTION_CURRENCY_FORM'] = "id"`` the currency id written as a string, ``"1"``),
``selected_billing_cycle`` (``months-1``), ``trial_end_date`` (timestamp; left out when there
is no trial) and ``auto_renew``. Responses carry ``selected_currency`` as a code; an integer id
is converted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..conf import billing_settings
from ..exceptions import BillingConfigurationError
from .common import as_uuid, remote_meta, ts, wire_ts

if TYPE_CHECKING:
    from ..models import Subscription

#: Fields owned by the service: a pull or event always overwrites them.
REMOTE_OWNED = (
    "status",
    "cycle_start_date",
    "cycle_end_date",
    "next_billing_date",
    "trial_end_date",
    "auto_renew",
    "selected_billing_cycle",
    "selected_currency",
    "product_remote_id",
    "customer_remote_id",
)


def currency_code(value: Any) -> str:
    if value in (None, ""):
        return ""
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return billing_settings.currency_code(value)
    return str(value).upper()


#: The values of ``BILLING['SUBSCRIPTION_CURRENCY_FORM']``.
CURRENCY_FORMS = ("code", "id")


def wire_currency(value: Any) -> str:
    """``selected_currency`` as POST /subscriptions sends it, in the configured form."""
    code = currency_code(value)
    form = billing_settings.SUBSCRIPTION_CURRENCY_FORM
    if form == "code" or not code:
        return code
    if form == "id":
        return str(billing_settings.currency_id(code))
    raise BillingConfigurationError(
        f"BILLING['SUBSCRIPTION_CURRENCY_FORM'] must be one of {', '.join(CURRENCY_FORMS)}, "
        f"not {form!r}.",
        setting="BILLING['SUBSCRIPTION_CURRENCY_FORM']",
    )


def to_remote(subscription: Subscription) -> dict[str, Any]:
    customer_id = subscription.customer.remote_id if subscription.customer_id else None
    product_id = subscription.product.remote_id if subscription.product_id else None
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


def from_remote(data: dict[str, Any]) -> dict[str, Any]:
    fields = remote_meta(data)
    fields.update(
        status=data.get("status") or "",
        product_remote_id=as_uuid(data.get("product")),
        customer_remote_id=as_uuid(data.get("customer")),
        cycle_start_date=ts(data.get("cycle_start_date")),
        cycle_end_date=ts(data.get("cycle_end_date")),
        next_billing_date=ts(data.get("next_billing_date")),
        auto_renew=bool(data.get("auto_renew", True)),
        trial_end_date=ts(data.get("trial_end_date")),
        selected_billing_cycle=data.get("selected_billing_cycle") or "",
        selected_currency=currency_code(data.get("selected_currency")),
    )
    return fields
