"""Helpers for the event callback tests: signed deliveries, envelopes, local objects."""

from __future__ import annotations

import base64
import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.urls import reverse
from standardwebhooks.webhooks import Webhook

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"fedcba9876543210fedcba9876543210").decode()
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def ts(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def sign(
    body: bytes | str, secret: str = SECRET, msg_id: str | None = None, timestamp: int | None = None
) -> dict[str, str]:
    """Standard Webhooks headers, made with the reference implementation."""
    msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
    stamp = int(time.time()) if timestamp is None else timestamp
    raw = body if isinstance(body, bytes) else body.encode()
    try:
        text = raw.decode()
    except UnicodeDecodeError:  # the reference library only signs text
        from billing_integration.webhooks.verification import sign as own_sign

        signature = own_sign(raw, secret, msg_id, stamp)
    else:
        signature = Webhook(secret).sign(msg_id, datetime.fromtimestamp(stamp, tz=UTC), text)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(stamp),
        "webhook-signature": signature,
    }


def as_meta(headers: dict[str, str]) -> dict[str, str]:
    """Headers as Django test client keyword arguments."""
    return {"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()}


def envelope(
    event_type: str,
    data: dict[str, Any],
    *,
    event_id: str | None = None,
    created_at: datetime | None = None,
) -> dict[str, Any]:
    return {
        "id": event_id or str(uuid.uuid4()),
        "type": event_type,
        "created_at": ts(created_at or datetime.now(UTC)),
        "data": data,
    }


def post_signed(
    client,
    payload: Any = None,
    *,
    secret: str = SECRET,
    msg_id: str | None = None,
    timestamp: int | None = None,
    body: bytes | None = None,
    extra: dict | None = None,
):
    """POST a delivery signed like the service does (webhook-id = envelope id)."""
    raw = body if body is not None else json.dumps(payload).encode()
    if msg_id is None and isinstance(payload, dict) and isinstance(payload.get("id"), str):
        msg_id = payload["id"]
    headers = sign(raw, secret, msg_id=msg_id, timestamp=timestamp)
    return client.post(
        reverse("billing_integration:webhook"),
        data=raw,
        content_type="application/json",
        **as_meta(headers),
        **(extra or {}),
    )


@pytest.fixture
def webhook_settings(settings, eager):
    """settings.BILLING with the test secret; processing in the request (eager Celery)."""
    settings.BILLING = {**settings.BILLING, "WEBHOOK_SECRET": SECRET}
    return settings


# --- resources ---------------------------------------------------------------------------


def subscription_data(
    remote_id, *, customer, product, status="published", updated=T0, start=T0, months=1
) -> dict[str, Any]:
    end = start + timedelta(days=30 * months)
    return {
        "id": str(remote_id),
        "user_created": str(uuid.uuid4()),
        "user_updated": None,
        "date_created": ts(T0 - timedelta(days=1)),
        "date_updated": ts(updated),
        "status": status,
        "product": str(product),
        "customer": str(customer),
        "cycle_start_date": ts(start),
        "cycle_end_date": ts(end),
        "next_billing_date": ts(end),
        "auto_renew": True,
        "discount_coupon": None,
        "trial_end_date": None,
        "selected_billing_cycle": "months-1",
        "selected_currency": "XOF",
    }


def payment_data(
    remote_id,
    *,
    status,
    subscription,
    customer,
    product,
    updated=T0,
    amount=5000,
    invoice=None,
    failure_reason=None,
) -> dict[str, Any]:
    return {
        "id": str(remote_id),
        "status": status,
        "amount": amount,
        "currency": "XOF",
        "customer": str(customer),
        "subscription": str(subscription),
        "product": str(product),
        "invoice": str(invoice) if invoice else None,
        "failure_reason": failure_reason,
        "date_created": ts(T0),
        "date_updated": ts(updated),
    }


def refund_data(
    remote_id, *, status, payment, subscription, customer, updated=T0, amount=5000
) -> dict[str, Any]:
    return {
        "id": str(remote_id),
        "status": status,
        "payment": str(payment),
        "amount": amount,
        "currency": "XOF",
        "customer": str(customer),
        "subscription": str(subscription),
        "reason": "requested_by_customer",
        "date_created": ts(T0),
        "date_updated": ts(updated),
    }


def invoice_data(
    remote_id, *, status, subscription, customer, product, updated=T0, amount=5000
) -> dict[str, Any]:
    return {
        "id": str(remote_id),
        "status": status,
        "customer": str(customer),
        "subscription": str(subscription),
        "product": str(product),
        "amount": amount,
        "currency": "XOF",
        "period_start": ts(T0),
        "period_end": ts(T0 + timedelta(days=30)),
        "date_created": ts(T0),
        "date_updated": ts(updated),
    }


@pytest.fixture
def mirror(db):
    """A customer, a product and a subscription known locally (created as from the service)."""
    from billing_integration.models import Customer, Product, Subscription
    from billing_integration.outbox import from_remote

    with from_remote():
        customer = Customer.objects.create(
            remote_id=uuid.uuid4(), identifier="cust-1", first_name="Ada", sync_state="synced"
        )
        product = Product.objects.create(remote_id=uuid.uuid4(), name="Pro", sync_state="synced")
        subscription = Subscription.objects.create(
            remote_id=uuid.uuid4(),
            customer=customer,
            product=product,
            customer_remote_id=customer.remote_id,
            product_remote_id=product.remote_id,
            status="published",
            remote_updated=T0 - timedelta(days=1),
            cycle_start_date=T0,
            cycle_end_date=T0 + timedelta(days=30),
            sync_state="synced",
        )
    return type(
        "Mirror", (), {"customer": customer, "product": product, "subscription": subscription}
    )
