"""Receivers: a change of a mirrored object writes (or extends) an outbox entry in its
transaction and enqueues its push on commit. A change extends the object's pending entry not yet
attempted nor built, so a burst of edits makes at most two calls."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import models, router, transaction
from django.db.models.signals import post_delete, post_save, pre_delete

from ..context import is_from_remote
from ..models.base import SyncState
from ..models.customers import Customer
from ..models.outbox import OutboxEntry, OutboxOperation, OutboxState
from ..models.products import (
    LOCAL_FIELDS,
    BillingCycle,
    DeclaredCyclesNotSendable,
    Price,
    Product,
    ProductDeletionRefused,
)
from ..models.subscriptions import Subscription

logger = logging.getLogger("billing_integration.outbox")


def record_change(obj: models.Model, changed: Iterable[str] = ()) -> OutboxEntry:
    """Write or extend the pending entry of ``obj``; ``changed``: wire fields known changed."""
    using = router.db_for_write(type(obj), instance=obj)
    ct = ContentType.objects.db_manager(using).get_for_model(obj, for_concrete_model=True)
    changed = sorted(set(changed))
    with transaction.atomic(using=using, savepoint=False):
        qs = OutboxEntry.objects.using(using).filter(
            content_type=ct,
            object_id=obj.pk,
            state=OutboxState.PENDING,
            attempts=0,
            payload__isnull=True,  # a built body would not carry this change
        )
        entry = qs.select_for_update(skip_locked=True).order_by("pk").first()
        if entry is not None:
            if changed and not set(changed) <= set(entry.changed_fields):
                entry.changed_fields = sorted(set(entry.changed_fields) | set(changed))
                entry.save(update_fields=["changed_fields", "updated_at"])
            return entry
        entry = OutboxEntry.objects.using(using).create(
            content_type=ct,
            object_id=obj.pk,
            operation=(
                OutboxOperation.CREATE
                if getattr(obj, "remote_id", None) is None
                else OutboxOperation.UPDATE
            ),
            changed_fields=changed,
        )
        type(obj)._default_manager.using(using).filter(pk=obj.pk).update(
            sync_state=SyncState.PENDING
        )
        from .tasks import enqueue_on_commit

        enqueue_on_commit(entry.pk, using=using)
    return entry


def _skip(raw: bool) -> bool:
    return raw or is_from_remote()


def product_saved(sender: Any, instance: Product, raw: bool = False, **kwargs: Any) -> None:
    local = set(kwargs.get("update_fields") or ()) - {"updated_at"}
    if local and local <= LOCAL_FIELDS:
        return  # kept here only (add-on mark, plan group): nothing to send
    if not _skip(raw):
        record_change(instance)


def _product_part_changed(product: Product | None) -> None:
    if product is None or product.pk is None:
        return
    if not product.is_one_time and not product.blueprint_known:
        return  # pushing would replace a blueprint unknown here: ``send_declared_cycles``
    field = "prices" if product.is_one_time else "subscription_blueprint"
    record_change(product, [field])


def send_declared_cycles(product: Product) -> OutboxEntry:
    """Push the cycles declared here as ``product``'s blueprint, replacing the service's."""
    if product.remote_id is None or product.is_one_time:
        raise DeclaredCyclesNotSendable(
            "Only the cycles of a subscription product already on the service are sent this way."
        )
    if not product.cycles.filter(declared=True).exists():
        raise DeclaredCyclesNotSendable(f"“{product}” has no declared billing cycles.")
    with transaction.atomic(using=router.db_for_write(Product, instance=product)):
        return record_change(product, ["subscription_blueprint"])


def cycle_changed(sender: Any, instance: BillingCycle, raw: bool = False, **kwargs: Any) -> None:
    if _skip(raw):
        return
    try:
        product = instance.product
    except Product.DoesNotExist:
        return
    _product_part_changed(product)


def price_changed(sender: Any, instance: Price, raw: bool = False, **kwargs: Any) -> None:
    if _skip(raw):
        return
    try:
        product = instance.product if instance.product_id else instance.cycle.product
    except (Product.DoesNotExist, BillingCycle.DoesNotExist):
        return
    _product_part_changed(product)


def customer_saved(sender: Any, instance: Customer, raw: bool = False, **kwargs: Any) -> None:
    if not _skip(raw):
        record_change(instance)


def subscription_saved(
    sender: Any, instance: Subscription, raw: bool = False, **kwargs: Any
) -> None:
    # The service owns a subscription once created (no update call): only new ones are pushed.
    if not _skip(raw) and instance.remote_id is None:
        record_change(instance)


def refuse_product_delete(sender: Any, instance: Product, **kwargs: Any) -> None:
    raise ProductDeletionRefused([instance])


post_save.connect(product_saved, sender=Product, dispatch_uid="billing_outbox_product")
post_save.connect(cycle_changed, sender=BillingCycle, dispatch_uid="billing_outbox_cycle")
post_delete.connect(cycle_changed, sender=BillingCycle, dispatch_uid="billing_outbox_cycle_del")
post_save.connect(price_changed, sender=Price, dispatch_uid="billing_outbox_price")
post_delete.connect(price_changed, sender=Price, dispatch_uid="billing_outbox_price_del")
post_save.connect(customer_saved, sender=Customer, dispatch_uid="billing_outbox_customer")
post_save.connect(
    subscription_saved, sender=Subscription, dispatch_uid="billing_outbox_subscription"
)
pre_delete.connect(refuse_product_delete, sender=Product, dispatch_uid="billing_refuse_delete")
