"""Customers from subscribers, and the synchronous "make sure this customer exists remotely".

The subscriber is an instance of ``BILLING['SUBSCRIBER_MODEL']`` (default the user model).
``BILLING['CUSTOMER_FIELDS']`` (default ``default_fields``) is a callable(subscriber), or its
dotted path, returning ``identifier``, ``first_name``, ``last_name`` and ``email``; the default
identifier is ``"<app_label>.<model_name>:<pk>"`` (stable, unique per subscriber).
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

FIELDS = ("identifier", "first_name", "last_name", "email")


def default_identifier(subscriber: Any) -> str:
    """``"<app_label>.<model_name>:<pk>"`` of the subscriber."""
    meta = subscriber._meta
    return f"{meta.app_label}.{meta.model_name}:{subscriber.pk}"


def default_fields(subscriber: Any) -> dict[str, str]:
    """``default_identifier`` and ``first_name``/``last_name``/``email`` from same-named
    attributes (else ``""``)."""
    out = {"identifier": default_identifier(subscriber)}
    for name in FIELDS[1:]:
        value = getattr(subscriber, name, "") or ""
        out[name] = str(value() if callable(value) else value)
    return out


def customer_fields(subscriber: Any) -> dict[str, str]:
    """The customer's fields by ``BILLING['CUSTOMER_FIELDS']`` (identifier included; a rule
    that returns none gets ``default_identifier``)."""
    rule = billing_settings.CUSTOMER_FIELDS
    fields = (import_string(rule) if isinstance(rule, str) else rule)(subscriber)
    out = {k: str(v or "") for k, v in fields.items() if k in FIELDS}
    out["identifier"] = out.get("identifier") or default_identifier(subscriber)
    return out


def customer_identifier(subscriber: Any) -> str:
    """The subscriber's customer identifier (``customer_fields``)."""
    return customer_fields(subscriber)["identifier"]


def get_or_create_customer(subscriber: Any) -> tuple[Customer, bool]:
    """The subscriber's ``Customer``, created (and queued for push) if it has none."""
    existing = Customer.objects.filter(subscriber=subscriber).first()
    if existing is not None:
        return existing, False
    try:
        with transaction.atomic():
            customer = Customer(subscriber=subscriber, **customer_fields(subscriber))
            customer.save()
            return customer, True
    except IntegrityError:  # created concurrently
        return Customer.objects.get(subscriber=subscriber), False


def ensure_customer_pushed(
    customer: Customer, *, timeout: float = 30.0, deadline: Deadline | None = None
) -> Customer:
    """Make sure ``customer`` exists remotely, synchronously (the checkout view needs its id),
    through its own outbox entry and key (so nothing creates it twice). Raises the service's
    error, or ``BillingTransportError`` when a worker holds the entry past ``timeout``. With
    a ``deadline`` everything ends by then; a push not finished is completed in the
    background with the same key."""
    from .outbox.push import PushOutcome, open_entry_for, push_entry

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
        result = push_entry(open_entry_for(customer).pk, client=client)
        customer.refresh_from_db()
        if customer.remote_id is not None:
            return customer
        if result.status == PushOutcome.RETRY:  # the outbox retries it (same entry and key)
            from .outbox.tasks import enqueue

            enqueue(result.entry_id, countdown=result.retry_in)
        if result.status != PushOutcome.BUSY and result.error is not None:
            raise result.error
        if time.monotonic() >= end:
            raise BillingTransportError(
                "the customer's push is still in progress elsewhere", operation="create_customer"
            )
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))
