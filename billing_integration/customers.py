"""Customers from subscribers (``BILLING['SUBSCRIBER_MODEL']``, ``BILLING['CUSTOMER_FIELDS']``),
and the synchronous "make sure this customer exists remotely"."""

from __future__ import annotations

import time
from typing import Any

from django.db import IntegrityError, transaction
from django.utils.module_loading import import_string

from .client.retry import Deadline
from .conf import billing_settings
from .exceptions import BillingTransportError
from .models.customers import Customer

FIELDS = ("identifier", "first_name", "last_name", "email")


def default_identifier(subscriber: Any) -> str:
    """``"<app_label>.<model_name>:<pk>"``: stable, unique per subscriber."""
    meta = subscriber._meta
    return f"{meta.app_label}.{meta.model_name}:{subscriber.pk}"


def default_fields(subscriber: Any) -> dict[str, str]:
    """``default_identifier`` and the same-named attributes (else ``""``)."""
    out = {"identifier": default_identifier(subscriber)}
    for name in FIELDS[1:]:
        value = getattr(subscriber, name, "") or ""
        out[name] = str(value() if callable(value) else value)
    return out


def customer_fields(subscriber: Any) -> dict[str, str]:
    """The customer's fields by ``BILLING['CUSTOMER_FIELDS']`` (a callable or its path)."""
    rule = billing_settings.CUSTOMER_FIELDS
    fields = (import_string(rule) if isinstance(rule, str) else rule)(subscriber)
    out = {k: str(v or "") for k, v in fields.items() if k in FIELDS}
    out["identifier"] = out.get("identifier") or default_identifier(subscriber)
    return out


def customer_identifier(subscriber: Any) -> str:
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
    """Make sure ``customer`` exists remotely, now (the checkout view needs its id), through
    its outbox entry and key. Raises the service's error, or ``BillingTransportError`` when a
    worker holds the entry past ``timeout`` or the ``deadline``; a push not finished is
    completed in the background with the same key."""
    return ensure_pushed(customer, "create_customer", timeout=timeout, deadline=deadline)


def ensure_pushed(
    obj: Any, operation: str, *, timeout: float = 30.0, deadline: Deadline | None = None
) -> Any:
    """``ensure_customer_pushed`` for any mirrored object (a customer, a new subscription)."""
    from .client import get_client
    from .outbox.push import PushOutcome, open_entry_for, push_entry
    from .outbox.tasks import enqueue

    if obj.remote_id is not None:
        return obj
    end = time.monotonic() + min(timeout, deadline.remaining() if deadline else timeout)
    client = get_client().with_deadline(deadline) if deadline is not None else None
    while True:
        obj.refresh_from_db()
        if obj.remote_id is not None:
            return obj
        result = push_entry(open_entry_for(obj).pk, client=client)
        obj.refresh_from_db()
        if obj.remote_id is not None:
            return obj
        if result.status == PushOutcome.RETRY:  # the outbox retries it (same entry and key)
            enqueue(result.entry_id, countdown=result.retry_in)
        if result.status != PushOutcome.BUSY and result.error is not None:
            raise result.error
        if time.monotonic() >= end:
            raise BillingTransportError(
                f"the push of {type(obj).__name__} {obj.pk} is still in progress elsewhere",
                operation=operation,
            )
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))
