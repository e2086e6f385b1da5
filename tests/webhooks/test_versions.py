"""Versions as an attacker would try them, with signed deliveries through the real view and
inline processing: an event whose version is ours (no date of its own: the signed
``webhook-timestamp`` or the receive time) never moves an object out of a final state; two
events of the same version end the same whatever their order; a payment whose amount or
currency cannot be read fails the event."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from billing_integration.models import EventState, Invoice, Payment, Subscription

from . import test_edges
from .conftest import T0, invoice_data, payment_data, subscription_data

bare = test_edges.bare
deliver = test_edges.deliver  # the fixture: a signed delivery, processed inline

pytestmark = pytest.mark.django_db


def undated(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without a date of its own (nor ``created_at``: see ``bare``)."""
    return {k: v for k, v in data.items() if k not in ("date_updated", "date_created")}


def links(mirror) -> dict[str, Any]:
    return {
        "subscription": mirror.subscription.remote_id,
        "customer": mirror.customer.remote_id,
        "product": mirror.product.remote_id,
    }


# --- an undated event never leaves a final state -------------------------------------------
@pytest.mark.parametrize(
    "final_type, final_status",
    [
        ("invoice.deleted", "deleted"),
        ("invoice.voided", "void"),
        ("invoice.marked_uncollectable", "uncollectable"),
    ],
)
def test_an_undated_invoice_paid_never_revives_a_final_invoice(
    mirror, deliver, final_type, final_status
):
    rid = uuid.uuid4()
    data = invoice_data(rid, status=final_status, updated=T0, **links(mirror))
    assert deliver(bare(final_type, data)).outcome == "applied"
    # Signed anew with a fresh timestamp, far newer than T0: still not out of the final state.
    paid = deliver(bare("invoice.paid", undated(dict(data, status="paid"))))
    assert paid.state == EventState.PROCESSED and paid.outcome == "stale"
    invoice = Invoice.objects.get(remote_id=rid)
    assert invoice.status == final_status
    # A late retry of an old undated event, signed now: the same.
    retry = deliver(bare("invoice.paid", undated(dict(data, status="paid"))))
    assert retry.outcome == "stale"
    # A dated event newer than the stored state still can, as before.
    newer = dict(data, status="paid", date_updated=(T0 + timedelta(days=1)).isoformat())
    assert deliver(bare("invoice.paid", newer)).outcome == "applied"
    assert Invoice.objects.get(remote_id=rid).status == "paid"


def test_an_undated_renewal_never_revives_a_canceled_subscription(mirror, deliver):
    sub = mirror.subscription
    data = subscription_data(
        sub.remote_id, customer=mirror.customer.remote_id, product=mirror.product.remote_id
    )
    canceled = deliver(bare("subscription.canceled", dict(data, status="canceled")))
    assert canceled.outcome == "applied"
    sub.refresh_from_db()
    assert sub.status == "canceled" and not sub.remote_updated_ours
    end = T0 + timedelta(days=3650)  # a renewal that would give access for years
    renewal = undated(dict(data, status="published", cycle_end_date=end.isoformat()))
    event = deliver(bare("subscription.renewal", renewal))
    assert event.state == EventState.PROCESSED and event.outcome == "stale"
    sub.refresh_from_db()
    assert sub.status == "canceled" and not sub.is_active
    assert not Subscription.objects.active().filter(pk=sub.pk).exists()
    # A dated renewal newer than the cancel still applies (a real reactivation).
    dated = dict(renewal, date_updated=(T0 + timedelta(days=1)).isoformat())
    assert deliver(bare("subscription.renewal", dated)).outcome == "applied"
    sub.refresh_from_db()
    assert sub.status == "published" and not sub.remote_updated_ours


def test_an_undated_renewal_without_a_status_never_extends_a_canceled_subscription(mirror, deliver):
    """A renewal whose data carries only the new cycle (no status, no date) must not move a
    canceled subscription's cycle_end_date: with ACCESS_AFTER_CANCEL "period_end" that would
    give access again until the new end."""
    sub = mirror.subscription
    data = subscription_data(
        sub.remote_id, customer=mirror.customer.remote_id, product=mirror.product.remote_id
    )
    assert (
        deliver(bare("subscription.canceled", dict(data, status="canceled"))).outcome == "applied"
    )
    sub.refresh_from_db()
    ended = sub.cycle_end_date
    assert sub.status == "canceled" and not sub.is_active
    end = (T0 + timedelta(days=3650)).isoformat()
    cycle = {"cycle_start_date": T0.isoformat(), "cycle_end_date": end, "next_billing_date": end}
    event = deliver(bare("subscription.renewal", {"id": str(sub.remote_id), **cycle}))
    assert event.state == EventState.PROCESSED and event.outcome == "stale"
    sub.refresh_from_db()
    assert sub.cycle_end_date == ended and not sub.is_active
    assert not Subscription.objects.active().filter(pk=sub.pk).exists()


def test_a_subscription_cancelled_in_the_other_spelling_is_final_too(mirror, deliver):
    """``cancelled`` is a canceled status (the grace period's): an undated renewal does not
    revive it, and a renewal of the same version does not win over it."""
    sub = mirror.subscription
    data = subscription_data(
        sub.remote_id, customer=mirror.customer.remote_id, product=mirror.product.remote_id
    )
    assert deliver(bare("subscription.renewal", dict(data, status="cancelled"))).outcome == (
        "applied"
    )
    same = deliver(bare("subscription.renewal", dict(data, status="published")))
    assert same.outcome == "stale"
    end = (T0 + timedelta(days=3650)).isoformat()
    renewal = undated(dict(data, status="published", cycle_end_date=end))
    assert deliver(bare("subscription.renewal", renewal)).outcome == "stale"
    sub.refresh_from_db()
    assert sub.status == "cancelled" and not sub.is_active


def test_an_undated_event_that_stays_in_the_final_state_still_applies(mirror, deliver):
    """Only leaving the final state is refused: an undated cancel of a canceled subscription
    applies, and records its version as ours."""
    sub = mirror.subscription
    data = subscription_data(
        sub.remote_id, customer=mirror.customer.remote_id, product=mirror.product.remote_id
    )
    assert deliver(bare("subscription.canceled", data)).outcome == "applied"
    stamp = int(time.time())
    again = deliver(bare("subscription.canceled", undated(data)), timestamp=stamp)
    assert again.outcome == "applied"
    sub.refresh_from_db()
    assert sub.status == "canceled" and sub.remote_updated_ours
    assert sub.remote_updated.timestamp() == stamp


# --- the same version: a documented winner, whatever the order --------------------------------
@pytest.mark.parametrize(
    "first, second, winner",
    [
        ("subscription.renewal", "subscription.canceled", "canceled"),
        ("subscription.canceled", "subscription.renewal", "canceled"),
        ("subscription.paused", "subscription.canceled", "canceled"),
        ("subscription.canceled", "subscription.paused", "canceled"),
        ("subscription.renewal", "subscription.paused", "paused"),
        ("subscription.paused", "subscription.renewal", "paused"),
    ],
)
def test_two_subscription_events_of_the_same_version_end_the_same_in_any_order(
    mirror, deliver, first, second, winner
):
    sub = mirror.subscription
    data = subscription_data(
        sub.remote_id,
        customer=mirror.customer.remote_id,
        product=mirror.product.remote_id,
        updated=T0 + timedelta(hours=1),
    )
    for event_type in (first, second):
        event = deliver(bare(event_type, data))
        assert event.state == EventState.PROCESSED, event.error
    sub.refresh_from_db()
    assert sub.status == winner


# --- amounts and currencies that cannot be read ----------------------------------------------
@pytest.mark.parametrize(
    "field, value",
    [
        ("amount", "lots"),
        ("amount", 1e300),
        ("amount", True),
        ("currency", "ZZZ"),
        ("currency", 99),
    ],
)
def test_a_payment_with_an_unreadable_amount_or_unknown_currency_fails(
    mirror, deliver, field, value
):
    rid = uuid.uuid4()
    data = dict(payment_data(rid, status="completed", **links(mirror)), **{field: value})
    event = deliver(bare("payment.completed", data))
    assert event.state == EventState.FAILED
    assert f"{field}: " in event.error and str(value)[:4] in event.error
    assert not Payment.objects.filter(remote_id=rid).exists()


def test_a_payment_in_a_known_currency_id_or_code_is_stored(mirror, deliver):
    for currency in (1, "1", "xof"):
        rid = uuid.uuid4()
        data = dict(payment_data(rid, status="completed", **links(mirror)), currency=currency)
        assert deliver(bare("payment.completed", data)).outcome == "applied"
        payment = Payment.objects.get(remote_id=rid)
        assert (payment.currency, payment.amount) == ("XOF", 5000)


# --- a date from the future -------------------------------------------------------------------
def test_a_date_far_in_the_future_does_not_make_every_later_event_stale(mirror, deliver):
    """A ``date_updated`` in 2099 (a service clock gone wrong, a typo) is stored as the
    version; every real event after it was ``stale`` for decades: a cancel never applied,
    access kept. A stored version more than the tolerance ahead of this clock does not
    make it stale."""
    sub = mirror.subscription
    refs = {"customer": mirror.customer.remote_id, "product": mirror.product.remote_id}
    far = subscription_data(sub.remote_id, updated=T0.replace(year=2099), **refs)
    assert deliver(bare("subscription.renewal", far)).outcome == "applied"
    later = datetime.now(UTC) + timedelta(minutes=2)  # the next real event, dated by the service
    cancel = subscription_data(sub.remote_id, updated=later, status="canceled", **refs)
    event = deliver(bare("subscription.canceled", cancel))
    assert (event.state, event.outcome) == (EventState.PROCESSED, "applied")
    sub.refresh_from_db()
    assert sub.status == "canceled" and not sub.is_active
    assert sub.remote_updated == later.replace(microsecond=later.microsecond // 1000 * 1000)


def test_a_date_a_little_ahead_of_this_clock_is_still_the_version(mirror, deliver):
    """A service clock a minute ahead of ours: its date is kept as the version."""
    sub = mirror.subscription
    ahead = datetime.now(UTC) + timedelta(minutes=1)
    data = subscription_data(
        sub.remote_id,
        customer=mirror.customer.remote_id,
        product=mirror.product.remote_id,
        updated=ahead,
    )
    assert deliver(bare("subscription.paused", data)).outcome == "applied"
    sub.refresh_from_db()
    assert sub.remote_updated == ahead.replace(microsecond=ahead.microsecond // 1000 * 1000)
    assert not sub.remote_updated_ours


def test_a_payment_dated_far_in_the_future_is_not_the_newest_for_ever(mirror, deliver):
    """A failed payment dated 2099 stayed the subscription's newest: a later completed payment
    still showed ``last_payment_status`` "failed" until 2099. A date beyond the tolerance does
    not win over a real one, whichever arrives first."""
    sub = mirror.subscription
    far = T0.replace(year=2099)
    failed = payment_data(uuid.uuid4(), status="failed", updated=far, **links(mirror))
    assert deliver(bare("payment.failed", failed)).outcome == "applied"
    sub.refresh_from_db()
    assert sub.last_payment_status == "failed"  # the only payment
    later = datetime.now(UTC) + timedelta(minutes=1)  # the service's next real payment
    completed = payment_data(uuid.uuid4(), status="completed", updated=later, **links(mirror))
    assert deliver(bare("payment.completed", completed)).outcome == "applied"
    sub.refresh_from_db()
    assert sub.last_payment_status == "completed"
    # Another one dated 2099 arriving after the real one does not hide it either.
    other = payment_data(uuid.uuid4(), status="canceled", updated=far, **links(mirror))
    assert deliver(bare("payment.canceled", other)).outcome == "applied"
    sub.refresh_from_db()
    assert sub.last_payment_status == "completed"


# --- a late replay ----------------------------------------------------------------------------
def test_an_old_event_processed_days_after_its_receipt_is_still_stale(mirror, deliver):
    """An event received days ago and processed only now (a replay once its type is mapped, a
    forced replay, a retry after an outage) meets a stored version newer than itself but
    written after its receipt: that version is not from a clock ahead (it is in this clock's
    past), so the old event is ``stale`` and the newer state stays."""
    from billing_integration.models import WebhookEvent
    from billing_integration.webhooks.processing import process_event

    sub = mirror.subscription
    refs = {"customer": mirror.customer.remote_id, "product": mirror.product.remote_id}
    now = datetime.now(UTC)
    old = subscription_data(
        sub.remote_id, updated=now - timedelta(days=3), status="canceled", **refs
    )
    first = deliver(bare("subscription.canceled", old))
    assert first.outcome == "applied"
    WebhookEvent.objects.filter(pk=first.pk).update(received_at=now - timedelta(days=3))
    newer_at = now - timedelta(days=1)
    newer = subscription_data(sub.remote_id, updated=newer_at, **refs)
    assert deliver(bare("subscription.renewal", newer)).outcome == "applied"

    process_event(first.pk, force=True)
    first.refresh_from_db()
    sub.refresh_from_db()
    assert first.outcome == "stale"
    assert sub.status == "published"
    assert sub.remote_updated == newer_at.replace(microsecond=newer_at.microsecond // 1000 * 1000)


# --- data without date_updated: events tie on date_created --------------------------------------
def created_only(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` dated by its ``date_created`` only (the object's creation, the same in every
    event of it)."""
    return {k: v for k, v in data.items() if k != "date_updated"}


def dated_envelope(event_type: str, data: dict[str, Any], hours: int) -> dict[str, Any]:
    return dict(bare(event_type, data), created_at=(T0 + timedelta(hours=hours)).isoformat())


def test_a_resume_after_a_cancel_without_date_updated_is_not_dropped(mirror, deliver):
    """Two events of one subscription whose data carries only ``date_created`` tie on it; the
    envelope's time says the resume came after the cancel: it applies (it was ``stale``: the
    cancel's rank won the tie, and the subscription stayed canceled for good)."""
    sub = mirror.subscription
    data = created_only(
        subscription_data(
            sub.remote_id, customer=mirror.customer.remote_id, product=mirror.product.remote_id
        )
    )
    cancel = deliver(dated_envelope("subscription.canceled", dict(data, status="canceled"), 1))
    assert cancel.outcome == "applied"
    resume = deliver(dated_envelope("subscription.renewal", dict(data, status="published"), 2))
    assert resume.outcome == "applied"
    sub.refresh_from_db()
    assert sub.status == "published"
    # An old renewal sent again late (its envelope before the cancel) stays stale.
    cancel_again = deliver(
        dated_envelope("subscription.canceled", dict(data, status="canceled"), 3)
    )
    assert cancel_again.outcome == "applied"
    late = deliver(dated_envelope("subscription.renewal", dict(data, status="published"), 2))
    assert late.outcome == "stale"
    sub.refresh_from_db()
    assert sub.status == "canceled"


def test_a_payment_failing_after_it_completed_without_date_updated_ends_failed(mirror, deliver):
    """Received out of order (the failure first, then the completion it came after), the
    envelope's times decide, not the order of reception."""
    rid = uuid.uuid4()
    data = created_only(payment_data(rid, status="completed", **links(mirror)))
    deliver(dated_envelope("payment.failed", dict(data, status="failed"), 2))
    late = deliver(dated_envelope("payment.completed", data, 1))
    assert late.outcome == "stale"
    assert Payment.objects.get(remote_id=rid).status == "failed"
