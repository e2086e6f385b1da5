"""What people read: human labels for billing cycles and statuses, and money per currency."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

from babel import Locale, UnknownLocaleError
from babel.numbers import format_currency, format_decimal
from django.utils.translation import get_language, gettext, ngettext, pgettext, to_locale

_CYCLE = re.compile(r"^(?P<unit>[a-z]+)-(?P<frequency>[0-9]+)$")
FALLBACK_LOCALE = "en"


def printable(text: Any) -> str:
    """``text`` for a terminal: each control or format character (an escape sequence's ESC,
    a newline, a right-to-left override) shown as ``?``, so a name a customer chose cannot
    move the cursor, recolour, hide or retitle what a command prints."""
    return "".join(c if c.isprintable() else "?" for c in str(text))


@lru_cache(maxsize=32)
def _parse_locale(name: str) -> Locale:
    try:
        return Locale.parse(name)
    except (UnknownLocaleError, ValueError, TypeError):
        return Locale.parse(FALLBACK_LOCALE)


def babel_locale(locale: str | Locale | None = None) -> Locale:
    """``locale`` (a Babel locale or a name), else the active language; ``"en"`` if unknown."""
    if isinstance(locale, Locale):
        return locale
    name = locale or get_language() or FALLBACK_LOCALE
    return _parse_locale(to_locale(str(name)))


@lru_cache(maxsize=64)
def _code_pattern(locale: Locale) -> str:
    """The locale's currency pattern with the ISO code, a no-break space from the digits."""
    pattern = locale.currency_formats["standard"].pattern.split(";")[0]
    pattern = pattern.replace("¤", "¤¤")
    pattern = re.sub(r"¤¤(?=[#0,.])", "¤¤\u00a0", pattern)
    return re.sub(r"(?<=[#0])¤¤", "\u00a0¤¤", pattern)


def format_money(amount: Any, currency_code: str | None, locale: str | Locale | None = None) -> str:
    """``amount`` in ``currency_code`` for a person: rounded to the currency's minor units, grouped
    per ``locale`` (default: the active language), with the ISO code."""
    if amount is None or amount == "":
        return ""
    try:
        value = Decimal(str(amount))
    except (InvalidOperation, ValueError):
        return str(amount)
    loc = babel_locale(locale)
    code = str(currency_code or "").strip().upper()
    if not code:
        return format_decimal(value, locale=loc)
    return format_currency(value, code, format=_code_pattern(loc), locale=loc, currency_digits=True)


def cycle_label(cycle: Any) -> str:
    """``"months-1"`` -> "Monthly", ``"months-3"`` -> "Every 3 months"; "One-time" for none."""
    code = getattr(cycle, "code", cycle)
    if not code:
        return gettext("One-time")
    match = _CYCLE.match(str(code).strip().lower())
    if match is None:
        return str(code)
    unit, n = match["unit"], int(match["frequency"])
    if unit == "months":
        if n == 1:
            return gettext("Monthly")
        return ngettext("Every %(n)d month", "Every %(n)d months", n) % {"n": n}
    if unit == "years":
        if n == 1:
            return gettext("Yearly")
        return ngettext("Every %(n)d year", "Every %(n)d years", n) % {"n": n}
    return str(code)


def status_label(value: Any) -> str:
    """A subscription's status for a person."""
    from .models.subscriptions import active_statuses

    status = getattr(value, "status", value)
    status = str(status or "").strip().lower()
    if status in active_statuses():
        if hasattr(value, "is_active") and not value.is_active:
            return pgettext("subscription status", "Lapsed")
        return pgettext("subscription status", "Active")
    known = {
        "canceled": pgettext("subscription status", "Canceled"),
        "cancelled": pgettext("subscription status", "Canceled"),
        "paused": pgettext("subscription status", "Paused"),
        "ended": pgettext("subscription status", "Ended"),
        "expired": pgettext("subscription status", "Expired"),
        "detached": pgettext("subscription status", "Detached"),
    }.get(status)
    return known if known is not None else gettext("Unknown status")


def failure_reason_label(reason: str | None) -> str:
    """A payment's ``failure_reason`` for a person; an unknown one with spaces for underscores."""
    reason = str(reason or "").strip()
    if not reason:
        return ""
    known = {
        "insufficient_funds": gettext("Insufficient funds"),
        "declined": gettext("Declined"),
        "expired": gettext("Expired before confirmation"),
        "canceled": gettext("Canceled"),
        "timeout": gettext("No confirmation in time"),
    }
    return known.get(reason.lower(), reason.replace("_", " ").capitalize())


def customer_label(customer: Any) -> str:
    """A customer's name, else its subscriber's, else its e-mail, else its identifier."""
    if customer is None:
        return ""
    name = f"{customer.first_name} {customer.last_name}".strip()
    if name:
        return name
    if customer.subscriber_id is not None:
        subscriber = customer.subscriber
        full_name = getattr(subscriber, "get_full_name", None)
        text = (full_name() if callable(full_name) else "") or ""
        if not text.strip():
            username = getattr(subscriber, "get_username", None)
            text = username() if callable(username) else str(subscriber)
        if text and text.strip():
            return text.strip()
    return str(customer.email or customer.identifier)


def object_label(obj: Any) -> str:
    """``str(obj)``, with the amount in its currency for a payment, invoice or refund."""
    amount = getattr(obj, "amount", None)
    if amount is None or not hasattr(obj, "currency"):
        return str(obj)
    return f"{obj} {format_money(amount, obj.currency)}"
