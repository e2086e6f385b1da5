"""What a notice says and to whom. Templates (overridable):
``billing_integration/notices/<kind>.txt``, ``<kind>.html`` and ``<kind>_subject.txt``."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.db import models
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse
from django.utils import formats
from django.utils.translation import gettext

from ..conf import billing_settings
from ..models import Customer, NoticeKind, Payment, Refund, Subscription, WebhookEvent

#: The URL name of the account page the notices link to.
ACCOUNT_URL_NAME = "billing_integration:account"

#: Notice kind -> the model of the object its event is about (``event.object_id``).
KINDS: dict[str, type[models.Model]] = {
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
    """The account page's absolute URL, after ``BILLING['SITE_URL']``."""
    try:
        path = reverse(ACCOUNT_URL_NAME)
    except NoReverseMatch:
        path = "/"
    return f"{str(billing_settings.SITE_URL or '').rstrip('/')}{path}"


def recipient_for(customer: Customer | None, subscriber: Any) -> str | None:
    """The customer's ``email``, else the subscriber's; None (the notice is skipped)."""
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
    """The templates' context (``amount`` formatted with its currency)."""
    payment = obj if isinstance(obj, Payment) else None
    refund = obj if isinstance(obj, Refund) else None
    subscription = obj if isinstance(obj, Subscription) else getattr(obj, "subscription", None)
    customer = getattr(obj, "customer", None) or getattr(subscription, "customer", None)
    record = payment or refund
    return {
        "kind": kind,
        "event": event,
        "customer": customer,
        "subscriber": getattr(customer, "subscriber", None),
        "subscription": subscription,
        "product": getattr(obj, "product", None) or getattr(subscription, "product", None),
        "payment": payment,
        "refund": refund,
        "amount": _amount(record.amount, record.currency) if record is not None else "",
        "failure_reason": (payment.failure_reason or "").replace("_", " ") if payment else "",
        "account_url": account_url(),
        "site_url": str(billing_settings.SITE_URL or "").rstrip("/"),
    }


def build_message(kind: str, context: dict[str, Any], to: str) -> EmailMultiAlternatives:
    """The email of a notice, rendered in the active language."""
    base = f"billing_integration/notices/{kind}"
    subject = " ".join(render_to_string(f"{base}_subject.txt", context).split())
    message = EmailMultiAlternatives(
        subject=subject or gettext("About your subscription"),
        body=render_to_string(f"{base}.txt", context),
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[to],
    )
    message.attach_alternative(render_to_string(f"{base}.html", context), "text/html")
    return message
