"""What a notice says and to whom. Templates (overridable):
``billing_integration/notices/<kind>.txt``, ``<kind>.html`` and ``<kind>_subject.txt``."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse
from django.utils import formats
from django.utils.translation import gettext

from ..conf import billing_settings
from ..models import Customer, NoticeKind, Payment, Refund, Subscription, WebhookEvent

__all__ = [
    "KINDS",
    "account_url",
    "build_message",
    "enabled",
    "notice_context",
    "recipient_for",
    "template_names",
]

#: The URL name of the account page the notices link to.
ACCOUNT_URL_NAME = "billing_integration:account"

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
    """The absolute URL of the app's account page: ``BILLING['SITE_URL']`` joined with it."""
    try:
        path = reverse(ACCOUNT_URL_NAME)
    except NoReverseMatch:
        path = "/"
    return f"{str(billing_settings.SITE_URL or '').rstrip('/')}{path}"


def recipient_for(customer: Customer | None, subscriber: Any) -> str | None:
    """The address of a notice: the customer's ``email``, else the subscriber's ``email``
    attribute; None (the notice is skipped) when neither is set."""
    for email in (getattr(customer, "email", None), getattr(subscriber, "email", None)):
        if isinstance(email, str) and email.strip():
            return email.strip()
    return None


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
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[to],
    )
    message.attach_alternative(render_to_string(names["html"], context), "text/html")
    return message
