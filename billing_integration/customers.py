"""Customers from subscribers, and the synchronous "make sure this customer exists remotely".

The subscriber is an instance of ``BILLING['SUBSCRIBER_MODEL']`` (default the user model; a
team or organisation model works the same). Two overridable rules, dotted paths in settings:

- ``BILLING['CUSTOMER_IDENTIFIER']`` (default ``default_identifier``): the ``identifier``
  sent to the service, ``"<app_label>.<model_name>:<pk>"``, e.g. ``"auth.user:42"``. Stable
  (never the e-mail, which changes) and unique per subscriber.
- ``BILLING['CUSTOMER_FIELDS']`` (default ``default_fields``): ``first_name``, ``last_name``
  and ``email`` read from the subscriber's attributes of those names when present (a team
  model may define properties, or point this setting at its own function).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import IntegrityError, transaction
from django.utils.module_loading import import_string

from .client.retry import Deadline
from .conf import billing_settings
from .exceptions import BillingTransportError
from .models.customers import Customer

logger = logging.getLogger("billing_integration.customers")

__all__ = [
    "customer_fields",
    "customer_identifier",
    "default_fields",
    "default_identifier",
    "ensure_customer_pushed",
    "get_or_create_customer",
]


def default_identifier(subscriber: Any) -> str:
    """``"<app_label>.<model_name>:<pk>"`` of the subscriber."""
    meta = subscriber._meta
    return f"{meta.app_label}.{meta.model_name}:{subscriber.pk}"


def default_fields(subscriber: Any) -> dict[str, str]:
    """``first_name``/``last_name``/``email`` from same-named attributes, else ``""``."""
    out = {}
    for name in ("first_name", "last_name", "email"):
        value = getattr(subscriber, name, "") or ""
        out[name] = str(value() if callable(value) else value)
    return out


def customer_identifier(subscriber: Any) -> str:
    """The identifier by the configured rule (``BILLING['CUSTOMER_IDENTIFIER']``)."""
    rule = billing_settings.CUSTOMER_IDENTIFIER
    return str((import_string(rule) if isinstance(rule, str) else rule)(subscriber))


def customer_fields(subscriber: Any) -> dict[str, str]:
    """The create fields by the configured rule (``BILLING['CUSTOMER_FIELDS']``)."""
    rule = billing_settings.CUSTOMER_FIELDS
    fields = (import_string(rule) if isinstance(rule, str) else rule)(subscriber)
    return {k: str(v or "") for k, v in fields.items() if k in ("first_name", "last_name", "email")}


def get_or_create_customer(subscriber: Any) -> tuple[Customer, bool]:
    """The subscriber's ``Customer``, created (and queued for push) if it has none."""
    existing = Customer.objects.filter(subscriber=subscriber).first()
    if existing is not None:
        return existing, False
    try:
        with transaction.atomic():
            customer = Customer(
                subscriber=subscriber,
                identifier=customer_identifier(subscriber),
                **customer_fields(subscriber),
            )
            customer.save()
            return customer, True
    except IntegrityError:  # created concurrently
        return Customer.objects.get(subscriber=subscriber), False


def ensure_customer_pushed(
    customer: Customer, *, timeout: float = 30.0, deadline: Deadline | None = None
) -> Customer:
    """Make sure ``customer`` exists remotely, synchronously (the checkout view needs its id).

    Goes through the customer's own outbox entry and idempotency key, so a worker pushing
    the same entry at the same time, a retry or a redelivery never creates a second remote
    customer. Raises the service's error (a ``BillingError``) if the push fails, or
    ``BillingTransportError`` if a worker holds the entry for longer than ``timeout``.

    With a ``deadline`` (a person waits) the push, its retries and the wait for a worker end
    by then. A push that could not finish in time leaves its entry pending and queued, so the
    outbox completes it in the background with the same key.
    """
    from .outbox.push import PushOutcome, _open_entry_for, push_entry_now

    if customer.remote_id is not None:
        return customer
    end = time.monotonic() + timeout
    if deadline is not None:
        end = min(end, time.monotonic() + deadline.remaining())
    client = None
    if deadline is not None:
        from .client import get_client

        client = get_client().with_deadline(deadline)
    while True:
        customer.refresh_from_db()
        if customer.remote_id is not None:
            return customer
        entry = _open_entry_for(customer)
        result = push_entry_now(entry.pk, client=client)
        customer.refresh_from_db()
        if customer.remote_id is not None:
            return customer
        if result.status == PushOutcome.RETRY:
            _hand_to_outbox(result.entry_id, result.retry_in)
        if result.status in (PushOutcome.RETRY, PushOutcome.FAILED) and result.error is not None:
            raise result.error
        if result.status != PushOutcome.BUSY and result.error is not None:
            raise result.error
        if time.monotonic() >= end:
            raise BillingTransportError(
                "the customer's push is still in progress elsewhere", operation="create_customer"
            )
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))


def _hand_to_outbox(entry_id: int, countdown: float | None) -> None:
    """Queue a push the person could not wait for: the outbox retries it in the background
    (same entry, same idempotency key). A broker outage leaves it to the periodic drain."""
    from .outbox import tasks

    try:
        tasks.enqueue(entry_id, countdown=countdown)
    except Exception:  # the entry is pending either way; the periodic drain finds it
        logger.warning("customer push %s: could not queue the background retry", entry_id)
