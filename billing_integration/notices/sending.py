"""What a notice says and to whom: the recipient, the templates, the message.

Templates (overridable in the project's templates): ``billing_integration/notices/<kind>.txt``
(plain text), ``<kind>.html`` (the HTML alternative) and ``<kind>_subject.txt`` (one line),
rendered in the active language with ``notice_context()``.
"""

from __future__ import annotations

import contextlib
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse
from django.utils import formats
from django.utils.module_loading import import_string
from django.utils.translation import gettext

from ..conf import billing_settings
from ..models import Customer, NoticeKind, Payment, Refund, Subscription, WebhookEvent

__all__ = [
    "KINDS",
    "account_url",
    "build_message",
    "default_recipient",
    "enabled",
    "notice_context",
    "recipient_for",
    "template_names",
]

#: Notice kind -> the model of the object its event is about (``event.object_id``).
KINDS: dict[str, type] = {
    NoticeKind.PAYMENT_FAILED: Payment,
    NoticeKind.SUBSCRIPTION_CANCELED: Subscription,
    NoticeKind.SUBSCRIPTION_PAUSED: Subscription,
    NoticeKind.REFUND_APPROVED: Refund,
}


def enabled(kind: str) -> bool:
    """``BILLING['NOTICES'][kind]`` is true (a kind left out is off)."""
    notices = billing_settings.NOTICES or {}
    return isinstance(notices, dict) and notices.get(kind) is True


def account_url() -> str:
    """The absolute URL of the account page: ``BILLING['SITE_URL']`` joined with
    ``BILLING['ACCOUNT_URL']`` (a URL name, reversed, or a path; an absolute URL is kept)."""
    target = str(billing_settings.ACCOUNT_URL or "/")
    if "/" not in target:
        with contextlib.suppress(NoReverseMatch):
            target = reverse(target)
    if target.startswith(("https://", "http://")):
        return target
    site = str(billing_settings.SITE_URL or "").rstrip("/")
    return f"{site}/{target.lstrip('/')}"


def default_recipient(customer: Customer | None, subscriber: Any) -> str | None:
    """The customer's ``email``, else the subscriber's ``email`` attribute, else None."""
    if customer is not None and customer.email:
        return customer.email
    email = getattr(subscriber, "email", None)
    return email if isinstance(email, str) and email.strip() else None


def recipient_for(customer: Customer | None, subscriber: Any) -> str | None:
    """The address of a notice: ``BILLING['NOTICE_RECIPIENT']`` (a dotted path) or
    ``default_recipient``. Blank means nobody (the notice is skipped)."""
    path = billing_settings.NOTICE_RECIPIENT
    resolver = import_string(path) if path else default_recipient
    email = resolver(customer, subscriber)
    return email.strip() if isinstance(email, str) and email.strip() else None


def _amount(value: Decimal | None, currency: str) -> str:
    if value is None:
        return ""
    places = 0 if value == value.to_integral_value() else 2
    text = formats.number_format(value, decimal_pos=places, use_l10n=True, force_grouping=True)
    return f"{text} {currency}".strip()


def notice_context(kind: str, event: WebhookEvent, obj: Any) -> dict[str, Any]:
    """The templates' context: ``kind``, ``event``, ``customer``, ``subscriber``,
    ``subscription``, ``product``, ``payment`` / ``refund`` (when the notice is about one),
    ``amount`` (formatted, with its currency), ``failure_reason`` and ``account_url``."""
    payment = obj if isinstance(obj, Payment) else None
    refund = obj if isinstance(obj, Refund) else None
    subscription = obj if isinstance(obj, Subscription) else getattr(obj, "subscription", None)
    customer = getattr(obj, "customer", None) or getattr(subscription, "customer", None)
    product = getattr(obj, "product", None) or getattr(subscription, "product", None)
    record = payment or refund
    return {
        "kind": kind,
        "event": event,
        "customer": customer,
        "subscriber": getattr(customer, "subscriber", None) if customer is not None else None,
        "subscription": subscription,
        "product": product,
        "payment": payment,
        "refund": refund,
        "amount": _amount(record.amount, record.currency) if record is not None else "",
        "failure_reason": (payment.failure_reason or "").replace("_", " ") if payment else "",
        "account_url": account_url(),
        "site_url": str(billing_settings.SITE_URL or "").rstrip("/"),
    }


def template_names(kind: str) -> dict[str, str]:
    """The three templates of a notice kind: ``subject``, ``text`` and ``html``."""
    base = f"billing_integration/notices/{kind}"
    return {"subject": f"{base}_subject.txt", "text": f"{base}.txt", "html": f"{base}.html"}


def build_message(kind: str, context: dict[str, Any], to: str) -> EmailMultiAlternatives:
    """The email of a notice, rendered in the active language."""
    names = template_names(kind)
    subject = " ".join(render_to_string(names["subject"], context).split())
    if not subject:
        subject = gettext("About your subscription")
    message = EmailMultiAlternatives(
        subject=subject,
        body=render_to_string(names["text"], context),
        from_email=billing_settings.NOTICE_FROM_EMAIL or settings.DEFAULT_FROM_EMAIL,
        to=[to],
    )
    message.attach_alternative(render_to_string(names["html"], context), "text/html")
    return message
