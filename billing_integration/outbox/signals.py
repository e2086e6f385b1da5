"""Receivers: a change of a mirrored object writes (or extends) an outbox entry in its
transaction and enqueues its push on commit. A change extends the object's pending entry not yet
attempted nor built, so a burst of edits makes at most two calls."""

from __future__ import annotations

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


def record_change(obj: models.Model, changed: Iterable[str] = ()) -> OutboxEntry:
    """Write or extend the pending entry of ``obj``; ``changed``: wire fields known changed."""
    using = router.db_for_write(type(obj), instance=obj)
    ct = ContentType.objects.db_manager(using).get_for_model(obj, for_concrete_model=True)
    entries, fields = OutboxEntry.objects.using(using), sorted(set(changed))
    with transaction.atomic(using=using, savepoint=False):
        # Not attempted nor built: a built body would not carry this change.
        unsent = entries.filter(content_type=ct, object_id=obj.pk, state=OutboxState.PENDING)
        unsent = unsent.filter(attempts=0, payload__isnull=True).select_for_update(skip_locked=True)
        entry: OutboxEntry | None = unsent.order_by("pk").first()
        if entry is not None:
            if not set(fields) <= set(entry.changed_fields):
                entry.changed_fields = sorted(set(entry.changed_fields) | set(fields))
                entry.save(update_fields=["changed_fields", "updated_at"])
            return entry
        create = getattr(obj, "remote_id", None) is None
        operation = OutboxOperation.CREATE if create else OutboxOperation.UPDATE
        new: OutboxEntry = entries.create(
            content_type=ct, object_id=obj.pk, operation=operation, changed_fields=fields
        )
        manager = type(obj)._default_manager.using(using)
        manager.filter(pk=obj.pk).update(sync_state=SyncState.PENDING)
        from .tasks import enqueue_on_commit

        enqueue_on_commit(new.pk, using=using)
    return new


def mirror_saved(sender: Any, instance: Any, raw: bool = False, **kwargs: Any) -> None:
    """A product, customer or new subscription saved: push it. Not a product's local-only
    fields (add-on mark, plan group), nor a pushed subscription (the service owns it)."""
    local = set(kwargs.get("update_fields") or ()) - {"updated_at"}
    if isinstance(instance, Product) and local and local <= LOCAL_FIELDS:
        return
    if isinstance(instance, Subscription) and instance.remote_id is not None:
        return
    if not (raw or is_from_remote()):
        record_change(instance)


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


def part_changed(sender: Any, instance: BillingCycle | Price, raw: bool = False, **_: Any) -> None:
    """A cycle or price saved or deleted: its product's blueprint or prices changed."""
    if raw or is_from_remote():
        return
    try:
        if isinstance(instance, Price) and not instance.product_id:
            product = instance.cycle.product if instance.cycle else None
        else:
            product = instance.product
    except (Product.DoesNotExist, BillingCycle.DoesNotExist):
        return
    if product is None or product.pk is None:
        return
    if not product.is_one_time and not product.blueprint_known:
        return  # pushing would replace a blueprint unknown here: ``send_declared_cycles``
    record_change(product, ["prices" if product.is_one_time else "subscription_blueprint"])


def refuse_product_delete(sender: Any, instance: Product, **kwargs: Any) -> None:
    raise ProductDeletionRefused([instance])


for mirrored in (Product, Customer, Subscription):
    post_save.connect(mirror_saved, sender=mirrored, dispatch_uid=f"billing_outbox_{mirrored}")
for part in (BillingCycle, Price):
    post_save.connect(part_changed, sender=part, dispatch_uid=f"billing_outbox_{part}")
    post_delete.connect(part_changed, sender=part, dispatch_uid=f"billing_outbox_{part}_del")
pre_delete.connect(refuse_product_delete, sender=Product, dispatch_uid="billing_refuse_delete")
