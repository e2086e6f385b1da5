"""The one conversion between the service's currency ids and ISO codes
(``BILLING['CURRENCIES']``): an id is an ``int`` (not a ``bool``) or ASCII digits (to
``currency_id``, a float with no fraction too), anything else a code (any case); an unknown
one raises ``BillingConfigurationError``, except in ``label()``, for display, which shows it
as it is."""

from __future__ import annotations

from typing import Any

from .conf import billing_settings
from .exceptions import BillingConfigurationError

SETTING = "BILLING['CURRENCIES']"


def known() -> dict[int, str]:
    return dict(billing_settings.CURRENCIES)


def is_id(value: Any) -> bool:
    if isinstance(value, int):
        return not isinstance(value, bool)
    return isinstance(value, str) and value.isascii() and value.isdigit()


def whole(value: Any) -> Any:
    """``value``, but a float with no fraction as the integer it is (``1.0``: the JSON number 1
    as some writers put it)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def currency_id(value: Any) -> int:
    """The service's id of a currency given by its id (``1.0`` too: ``whole``) or its code."""
    text = value.strip() if isinstance(value, str) else whole(value)
    table = known()
    if is_id(text):
        try:
            number = int(text)
        except ValueError:  # more digits than Python reads (4,300): no currency's id
            number = None
        if number is not None and number in table:
            return number
    elif isinstance(text, str):
        for cid, code in table.items():
            if code.upper() == text.upper():
                return cid
    raise BillingConfigurationError(f"Currency {value!r} is not in {SETTING}.", setting=SETTING)


def currency_code(value: Any) -> str:
    return known()[currency_id(value)]


def label(value: Any) -> str:
    """For display only: the code, an unknown value as it is, ``""`` for none."""
    if value is None or value == "":
        return ""
    try:
        return currency_code(value)
    except BillingConfigurationError:
        return str(value)
