"""Customer <-> wire. POST /customers accepts ``identifier``, ``first_name``, ``last_name``,
``email`` (all strings); the address lines, phone and status are read-only remote fields."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .common import carried, normal_status, remote_meta, text

if TYPE_CHECKING:
    from ..models import Customer

CREATE_FIELDS = ("identifier", "first_name", "last_name", "email")
# read from a customer resource; one left out (or a status sent null) keeps the stored value
FIELDS = (*CREATE_FIELDS, "status", "address_line_1", "address_line_2", "phone")


def to_remote(customer: Customer) -> dict[str, Any]:
    return {field: str(getattr(customer, field) or "") for field in CREATE_FIELDS}


def from_remote(data: dict[str, Any]) -> dict[str, Any]:
    """Model field values from a customer resource (``RemoteDataError`` if unstorable), without
    the fields it leaves out (``common.carried``)."""
    from ..models import Customer

    fields = remote_meta(data)
    for name in CREATE_FIELDS:
        fields[name] = text(Customer, name, data.get(name) or None)
    fields["status"] = normal_status(Customer, data.get("status") or None)
    for name in ("address_line_1", "address_line_2", "phone"):
        value = data.get(name)
        fields[name] = None if value is None else text(Customer, name, value)
    return {k: v for k, v in fields.items() if k not in FIELDS or carried(data, {}, k)}


def differs(customer: Customer) -> list[str]:
    """Create fields that differ from the last remote JSON (reported: no update operation)."""
    remote = customer.remote_data if isinstance(customer.remote_data, dict) else {}
    local = to_remote(customer)
    return [f for f in CREATE_FIELDS if (remote.get(f) or "") != local[f]]
