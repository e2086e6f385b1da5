"""Product <-> wire.

Request shape (POST, PATCH): ``subscription_blueprint`` is an object
``{"billing_type": "flat-rate", "billing_cycles": [{"cycle", "frequency", "prices": [{"currency":
int, "amount": number}]}]}`` for subscription products; one-time products send root-level
``prices`` instead. ``selected_currencies`` is a list of currency ids written as strings.

Response shape: ``subscription_blueprint`` is an id string (null for one-time products) and
``prices`` is null for subscription products. ``from_remote`` accepts both shapes.

PATCH accepts ``status``, ``name``, ``description``, ``selected_currencies`` and
``subscription_blueprint`` (section 4.5): root ``prices`` of a one-time product are sent on
creation only.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from .common import as_decimal, remote_meta, wire_amount

if TYPE_CHECKING:
    from ..models import Product

PATCH_FIELDS = ("status", "name", "description", "selected_currencies", "subscription_blueprint")
SCALAR_FIELDS = ("status", "name", "description", "selected_currencies")


def _prices(prices: Iterable[Any]) -> list[dict[str, Any]]:
    return [
        {"currency": int(p.currency_id), "amount": wire_amount(p.amount)}
        for p in sorted(prices, key=lambda p: (p.currency_id, p.pk or 0))
    ]


def blueprint(product: Product) -> dict[str, Any]:
    """The request object ``subscription_blueprint`` of a subscription product."""
    cycles = sorted(product.cycles.all(), key=lambda c: (c.unit, c.frequency, c.pk or 0))
    return {
        "billing_type": product.billing_type or "flat-rate",
        "billing_cycles": [
            {"cycle": c.unit, "frequency": int(c.frequency), "prices": _prices(c.prices.all())}
            for c in cycles
        ],
    }


def currencies_to_wire(ids: Iterable[Any]) -> list[str]:
    return [str(int(i)) for i in ids]


def currencies_from_wire(values: Iterable[Any] | None) -> list[int]:
    out = []
    for value in values or []:
        if isinstance(value, dict):  # tolerate {"id": ...} elements
            value = value.get("id")
        try:
            out.append(int(value))
        except (TypeError, ValueError):
            from ..conf import billing_settings

            out.append(billing_settings.currency_id(str(value)))
    return out


def to_remote(product: Product) -> dict[str, Any]:
    """The full POST /products body."""
    body: dict[str, Any] = {
        "status": product.status,
        "name": product.name,
        "description": product.description or "",
        "selected_currencies": currencies_to_wire(product.selected_currencies or []),
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
    """The PATCH /products/{id} body: only the fields that differ from the last remote JSON.

    ``changed`` names wire fields known to be changed though not comparable with the
    response (``subscription_blueprint``: the response carries only its id). Without any
    remote JSON every PATCH field is sent.
    """
    full = to_remote(product)
    remote = product.remote_data if isinstance(product.remote_data, dict) else None
    changed = set(changed)
    body: dict[str, Any] = {}
    for field in SCALAR_FIELDS:
        if remote is None or _norm(field, full[field]) != _norm(field, remote.get(field)):
            body[field] = full[field]
    if "subscription_blueprint" in full:
        remote_bp = remote.get("subscription_blueprint") if remote else None
        if remote is None or "subscription_blueprint" in changed or (
            isinstance(remote_bp, dict) and remote_bp != full["subscription_blueprint"]
        ):
            body["subscription_blueprint"] = full["subscription_blueprint"]
    return body


def from_remote(data: dict[str, Any]) -> dict[str, Any]:
    """Product field values from a product resource (response or request shape)."""
    bp = data.get("subscription_blueprint")
    fields = remote_meta(data)
    fields.update(
        name=data.get("name") or "",
        description=data.get("description") or "",
        status=data.get("status") or "draft",
        selected_currencies=currencies_from_wire(data.get("selected_currencies")),
        product_type="one_time" if bp in (None, "") else "subscription",
    )
    if isinstance(bp, dict) and bp.get("billing_type"):
        fields["billing_type"] = bp["billing_type"]
    return fields


def root_prices_from_remote(data: dict[str, Any]) -> list[tuple[int, Decimal]]:
    """``(currency_id, amount)`` of the root-level prices (one-time products); [] when null."""
    return [
        (int(p["currency"]), as_decimal(p["amount"]))
        for p in (data.get("prices") or [])
        if isinstance(p, dict) and "currency" in p and "amount" in p
    ]


def cycles_from_remote(data: dict[str, Any]) -> list[tuple[str, int, list[tuple[int, Decimal]]]]:
    """Cycles of a request-shape blueprint (``[]`` for the response shape, an id string)."""
    bp = data.get("subscription_blueprint")
    if not isinstance(bp, dict):
        return []
    return [
        (
            str(c.get("cycle")),
            int(c.get("frequency") or 1),
            [(int(p["currency"]), as_decimal(p["amount"])) for p in c.get("prices") or []],
        )
        for c in bp.get("billing_cycles") or []
    ]
