"""Product <-> wire. Requests carry a ``subscription_blueprint`` object (or root ``prices``
for a one-time product); responses carry its id. Features are read, never sent."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import suppress
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.utils.translation import gettext

from .. import currencies
from ..exceptions import BillingConfigurationError, RemoteDataError
from .common import as_decimal, carried, log_once, normal_status, remote_meta, text, wire_amount

if TYPE_CHECKING:
    from ..models import BillingCycle, Product

SCALAR_FIELDS = ("status", "name", "description", "selected_currencies")
#: The largest currency id a ``Price`` row stores (a positive integer column).
MAX_CURRENCY_ID = 2**31 - 1


def _prices(prices: Iterable[Any]) -> list[dict[str, Any]]:
    return [
        {"currency": int(p.currency_id), "amount": wire_amount(p.amount)}
        for p in sorted(prices, key=lambda p: (p.currency_id, p.pk or 0))
    ]


def cycle_to_wire(cycle: BillingCycle) -> dict[str, Any]:
    """The cycle object of a blueprint: ``{"cycle", "frequency", "prices"}``."""
    return {
        "cycle": cycle.unit,
        "frequency": int(cycle.frequency),
        "prices": _prices(cycle.prices.all()),
    }


def blueprint(product: Product) -> dict[str, Any]:
    """The request object ``subscription_blueprint`` of a subscription product."""
    cycles = sorted(product.cycles.all(), key=lambda c: (c.unit, c.frequency, c.pk or 0))
    return {
        "billing_type": product.billing_type or "flat-rate",
        "billing_cycles": [cycle_to_wire(c) for c in cycles],
    }


def confirmed_cycles(blueprint: dict[str, Any]) -> dict[str, dict[str, str]]:
    """``Product.confirmed_cycles`` of a request's blueprint the service acknowledged:
    ``{"months-1": {"1": "5000.00"}}``."""
    return {
        f"{c['cycle']}-{c['frequency']}": {
            str(p["currency"]): str(as_decimal(p["amount"])) for p in c["prices"]
        }
        for c in blueprint.get("billing_cycles") or []
    }


def currencies_from_wire(values: Iterable[Any] | None) -> list[int]:
    out = []
    for value in values or []:
        if isinstance(value, dict):  # tolerate {"id": ...} elements
            value = value.get("id")
        value = currencies.whole(value)
        out.append(int(value) if currencies.is_id(value) else currencies.currency_id(value))
    return out


def to_remote(product: Product) -> dict[str, Any]:
    """The full POST /products body."""
    body: dict[str, Any] = {
        "status": product.status,
        "name": product.name,
        "description": product.description or "",
        "selected_currencies": [
            str(currencies.currency_id(i)) for i in product.selected_currencies or []
        ],
    }
    if product.is_one_time:
        body["prices"] = _prices(product.root_prices.all())
    else:
        body["subscription_blueprint"] = blueprint(product)
    return body


def _norm(field: str, value: Any) -> Any:
    if field == "selected_currencies":
        try:
            return sorted(currencies_from_wire(value))
        except Exception:
            return value
    if value is None and field == "description":
        return ""
    return value


def diff_for_patch(product: Product, changed: Iterable[str] = ()) -> dict[str, Any]:
    """The PATCH body: the fields that differ from the last remote JSON, and those named in
    ``changed`` (``subscription_blueprint``: a response carries only its id)."""
    full = to_remote(product)
    remote = product.remote_data if isinstance(product.remote_data, dict) else None
    changed = set(changed)
    body: dict[str, Any] = {}
    for field in SCALAR_FIELDS:
        if remote is None or _norm(field, full[field]) != _norm(field, remote.get(field)):
            body[field] = full[field]
    # Never for a one-time product, nor an unknown blueprint nobody asked to replace.
    bp = full.get("subscription_blueprint")
    remote_bp = remote.get("subscription_blueprint") if remote else None
    asked = "subscription_blueprint" in changed
    sendable = bp is not None and remote_type(remote) != "one_time"
    differs = remote is None or asked or (isinstance(remote_bp, dict) and remote_bp != bp)
    if sendable and (product.blueprint_known or asked) and differs:
        body["subscription_blueprint"] = bp
    return body


def remote_type(remote: dict[str, Any] | None) -> str | None:
    """The product's type as the service has it; None if unknown."""
    if not isinstance(remote, dict) or "subscription_blueprint" not in remote:
        return None
    return "one_time" if remote["subscription_blueprint"] in (None, "") else "subscription"


def _money(prices: dict[int, Decimal]) -> str:
    if not prices:
        return gettext("none")
    return " + ".join(
        f"{wire_amount(amount)} {currencies.label(cid)}" for cid, amount in sorted(prices.items())
    )


def not_carried(
    product: Product, remote: dict[str, Any] | None = None, changed: Iterable[str] = ()
) -> str:
    """What of the product the service (``remote``, default the last JSON) lacks and no
    request can carry (its type, a one-time product's prices), else ``""``."""
    remote = product.remote_data if remote is None else remote
    if not isinstance(remote, dict):
        return ""
    service_type = remote_type(remote)
    if service_type is not None and service_type != product.product_type:
        labels = {"one_time": gettext("one-time"), "subscription": gettext("subscription")}
        return gettext(
            "Not sent: the service has no way to change a product's type; local "
            "%(local)s, service %(remote)s."
        ) % {
            "local": labels.get(product.product_type, product.product_type),
            "remote": labels[service_type],
        }
    if product.is_one_time:
        from ..models.products import root_prices_from_remote

        local = {int(p.currency_id): as_decimal(p.amount) for p in product.root_prices.all()}
        service = None
        with suppress(TypeError, ValueError, ArithmeticError):
            if isinstance(remote.get("prices"), list):
                service = dict(root_prices_from_remote(remote))
        if service is None and "prices" in set(changed):
            return gettext(
                "Not sent: the service has no way to change a one-time product's prices; "
                "local %(local)s, the service's are not known."
            ) % {"local": _money(local)}
        elif service is not None and service != local:
            return gettext(
                "Not sent: the service has no way to change a one-time product's prices; "
                "local %(local)s, service %(remote)s."
            ) % {"local": _money(local), "remote": _money(service)}
    return ""


def from_remote(data: dict[str, Any]) -> dict[str, Any]:
    """Product field values from a product resource (either shape), without the fields it
    leaves out (``common.carried``); ``RemoteDataError`` if unstorable (its root prices
    included)."""
    from ..models import Product
    from ..models.products import ProductStatus

    bp = data.get("subscription_blueprint")
    one_time = bp in (None, "")
    fields = remote_meta(data) | {
        "name": text(Product, "name", data.get("name") or None),
        "description": text(Product, "description", data.get("description") or None),
        "status": normal_status(Product, data.get("status") or None),
        "selected_currencies": _remote_currencies(data.get("selected_currencies")),
        "product_type": "one_time" if one_time else "subscription",
        "blueprint_known": one_time,
    }
    for name in SCALAR_FIELDS:  # left out (a status or name null): the stored one
        if not carried(data, {}, name):
            del fields[name]
    if fields.get("status", "draft") not in ProductStatus.values:
        message = "Unknown product status %r: stored as received, the product is not sold."
        log_once(message, fields["status"][:80])
    if isinstance(bp, dict) and bp.get("billing_type"):
        fields["billing_type"] = text(Product, "billing_type", bp["billing_type"])
    if one_time:
        _check_root_prices(data)
    return fields


def _remote_currencies(value: Any) -> list[int]:
    try:
        if value is not None and not isinstance(value, list):
            raise TypeError("not a list")
        ids = currencies_from_wire(value)
    except (BillingConfigurationError, TypeError, ValueError) as exc:
        raise RemoteDataError("selected_currencies", value, str(exc)) from None
    if any(not 0 <= i <= MAX_CURRENCY_ID for i in ids):
        raise RemoteDataError("selected_currencies", value, "a currency id out of range")
    return ids


def _check_root_prices(data: dict[str, Any]) -> None:
    """``RemoteDataError`` unless every root price can be stored as a ``Price``."""
    from ..models.products import MAX_PRICE_AMOUNT, root_prices_from_remote

    prices = data.get("prices")
    try:
        if prices is not None and not isinstance(prices, list):
            raise TypeError("not a list")
        pairs = root_prices_from_remote(data)
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise RemoteDataError("prices", prices, f"not a price ({type(exc).__name__})") from None
    for currency_id, amount in pairs:
        if not 0 <= currency_id <= MAX_CURRENCY_ID:
            raise RemoteDataError("prices", prices, "a currency id out of range")
        if not amount.is_finite() or abs(amount) >= MAX_PRICE_AMOUNT:
            raise RemoteDataError("prices", prices, "an amount out of range")


#: Element fields naming a feature, then those carrying its number, in order of preference.
FEATURE_NAME_FIELDS = ("key", "name", "code", "slug")
FEATURE_VALUE_FIELDS = ("limit", "value", "quantity")


def feature_key(value: Any) -> str:
    """A feature name as compared: a stripped, lower-cased string (``""`` when unusable)."""
    return value.strip().lower() if isinstance(value, str) else ""


def _feature_number(value: Any) -> tuple[bool, int | None]:
    """``(granted, limit)``: false withdraws the feature, a whole number >= 0 is its limit."""
    text = value.strip().lower() if isinstance(value, str) else None
    if value is False or text == "false":
        return False, None
    if isinstance(value, int) and not isinstance(value, bool):
        return True, value if value >= 0 else None
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return True, int(value)
    return True, int(text) if text and text.isascii() and text.isdigit() else None


def _enabled(value: Any) -> bool:
    """An element's ``enabled``: true, 1, "true", "1" or "yes"; anything else withholds."""
    text = value.strip().lower() if isinstance(value, str) else None
    return text in ("true", "1", "yes") if text is not None else value == 1  # True == 1


def _feature(element: Any) -> tuple[str, int | None] | None:
    """``(key, limit)`` of a ``"seats:5"`` or object element; None if not granted."""
    if isinstance(element, str):
        name, sep, number = element.partition(":")
        granted, limit = _feature_number(number) if sep else (True, None)
        return (feature_key(name), limit) if granted and feature_key(name) else None
    if not isinstance(element, dict) or not _enabled(element.get("enabled", True)):
        return None
    key = next((k for k in (feature_key(element.get(f)) for f in FEATURE_NAME_FIELDS) if k), "")
    # false in any of the value fields withdraws; else the first number is the limit
    read = [_feature_number(element[field]) for field in FEATURE_VALUE_FIELDS if field in element]
    if not all(granted for granted, _ in read):
        return None
    limit = next((number for _, number in read if number is not None), None)
    return (key, limit) if key else None


def features_from_remote(data: Any) -> dict[str, int | None]:
    """``{key: limit or None}`` of a resource's ``features``; a key listed twice keeps its
    largest number."""
    out: dict[str, int | None] = {}
    features = data.get("features") if isinstance(data, dict) else None
    for key, limit in filter(None, map(_feature, features if isinstance(features, list) else [])):
        out[key] = larger_limit(out[key], limit) if key in out else limit
    return out


def larger_limit(a: int | None, b: int | None) -> int | None:
    """The larger of two limits; ``None`` (no number) loses to any number."""
    return b if a is None else a if b is None else max(a, b)
