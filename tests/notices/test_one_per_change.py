"""One notice per change of state, whoever finds it: two deliveries of one change without a
date of the service's (``date_updated``) get one mail even when their envelopes are dated
differently; a pull that finds a subscription canceled or paused sends the notice the event
would, and the event arriving before or after it sends no second; a genuine second change (a
second failure of a payment, a second cancellation after a resume) gets its own."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from billing_integration.models import Notice, NoticeState, Subscription
from billing_integration.sync.pull import upsert_subscriptions

from ..webhooks.conftest import T0, envelope, payment_data, refund_data, subscription_data, ts
from .test_notices import deliver

pytestmark = pytest.mark.django_db


def undated(data, *, keep_created=False):
    """``data`` without ``date_updated`` (and without ``date_created`` unless kept)."""
    data = dict(data)
    data.pop("date_updated", None)
    if not keep_created:
        data.pop("date_created", None)
    return data


def at(hours):
    return T0 + timedelta(hours=hours)


def sub_data(mirror, status, **extra):
    sub = mirror.subscription
    data = subscription_data(
        sub.remote_id, customer=mirror.customer.remote_id, product=mirror.product.remote_id
    )
    return {**data, "status": status, **extra}


def pay_data(mirror, remote_id, status, **extra):
    return payment_data(
        remote_id,
        status=status,
        subscription=mirror.subscription.remote_id,
        customer=mirror.customer.remote_id,
        product=mirror.product.remote_id,
        failure_reason="insufficient_funds" if status == "failed" else None,
        **extra,
    )


def kinds_sent():
    return list(
        Notice.objects.filter(state=NoticeState.SENT).order_by("pk").values_list("kind", flat=True)
    )


# --- one change sent twice, without a date of its own ---------------------------------------


def one_change(kind, mirror):
    """The event type and the undated data of one change of ``kind``."""
    if kind == "payment_failed":
        return "payment.failed", undated(pay_data(mirror, uuid.uuid4(), "failed"))
    if kind == "refund_approved":
        data = refund_data(
            uuid.uuid4(),
            status="approved",
            payment=uuid.uuid4(),
            subscription=mirror.subscription.remote_id,
            customer=mirror.customer.remote_id,
        )
        return "refund.approved", undated(data)
    status = {"subscription_canceled": "canceled", "subscription_paused": "paused"}[kind]
    return f"subscription.{status}", undated(sub_data(mirror, status))


@pytest.mark.parametrize(
    "kind", ["payment_failed", "refund_approved", "subscription_canceled", "subscription_paused"]
)
@pytest.mark.parametrize("keep_created", [False, True], ids=["no-dates", "date_created-only"])
def test_one_undated_change_under_two_event_ids_and_times_sends_one_mail(
    client, customer_email, notice_settings, billing_inline, mailoutbox, kind, keep_created
):
    event_type, data = one_change(kind, customer_email)
    if keep_created:
        data["date_created"] = ts(T0)  # after the version the mirror stores
    first = deliver(client, envelope(event_type, data, created_at=at(1)))
    second = deliver(client, envelope(event_type, dict(data), created_at=at(2)))

    assert (first.outcome, second.outcome) == ("applied", "applied")  # the signal went out twice
    assert len(mailoutbox) == 1
    assert kinds_sent() == [kind]
    assert Notice.objects.get().event_id == first.pk


@pytest.mark.parametrize("keep_created", [False, True], ids=["no-dates", "date_created-only"])
def test_a_second_failure_of_one_payment_gets_its_own_mail(
    client, customer_email, notice_settings, billing_inline, mailoutbox, keep_created
):
    """failed -> completed -> failed, no date_updated: two changes into ``failed``."""
    pid = uuid.uuid4()

    def send(event_type, status, hours):
        data = undated(pay_data(customer_email, pid, status), keep_created=keep_created)
        return deliver(client, envelope(event_type, data, created_at=at(hours)))

    send("payment.failed", "failed", 1)
    send("payment.failed", "failed", 2)  # the same failure again
    send("payment.completed", "completed", 3)
    send("payment.failed", "failed", 4)

    assert len(mailoutbox) == 2
    assert kinds_sent() == ["payment_failed", "payment_failed"]


def test_a_failure_on_a_later_renewal_gets_its_own_mail(
    client, customer_email, notice_settings, billing_inline, mailoutbox
):
    for hours in (1, 2):  # two payments (two renewals), each failing once, no dates
        data = undated(pay_data(customer_email, uuid.uuid4(), "failed"))
        deliver(client, envelope("payment.failed", data, created_at=at(hours)))
    assert len(mailoutbox) == 2


def test_a_second_cancellation_after_a_resume_gets_its_own_mail(
    client, customer_email, notice_settings, billing_inline, mailoutbox
):
    mirror = customer_email
    cancel = undated(sub_data(mirror, "canceled"))
    deliver(client, envelope("subscription.canceled", cancel, created_at=at(1)))
    deliver(client, envelope("subscription.canceled", dict(cancel), created_at=at(2)))
    resume = undated(sub_data(mirror, "published"))
    deliver(client, envelope("subscription.renewal", resume, created_at=at(3)))
    assert Subscription.objects.get().status == "published"
    deliver(client, envelope("subscription.canceled", dict(cancel), created_at=at(4)))

    assert kinds_sent() == ["subscription_canceled", "subscription_canceled"]
    assert len(mailoutbox) == 2


def test_a_dated_change_sent_twice_still_gets_one_mail_and_a_newer_date_another(
    client, customer_email, notice_settings, billing_inline, mailoutbox
):
    """With ``date_updated`` the change is the object at that date, as before: a newer date of
    the same status (failed again, nothing in between seen here) is a second change."""
    pid = uuid.uuid4()
    first = pay_data(customer_email, pid, "failed", updated=at(1))
    deliver(client, envelope("payment.failed", first, created_at=at(1)))
    deliver(client, envelope("payment.failed", dict(first), created_at=at(5)))
    assert len(mailoutbox) == 1
    later = pay_data(customer_email, pid, "failed", updated=at(6))
    deliver(client, envelope("payment.failed", later, created_at=at(6)))
    assert len(mailoutbox) == 2


# --- found by a pull ----------------------------------------------------------------------


def pulled(mirror, status, **extra):
    """A page of the subscription list holding the mirror's subscription in ``status``."""
    return upsert_subscriptions([sub_data(mirror, status, **extra)])


@pytest.mark.parametrize(
    ("status", "kind", "subject"),
    [
        ("canceled", "subscription_canceled", "Your subscription to Pro was canceled"),
        ("cancelled", "subscription_canceled", "Your subscription to Pro was canceled"),
        ("paused", "subscription_paused", "Your subscription to Pro is paused"),
    ],
)
def test_a_pull_that_finds_a_subscription_canceled_or_paused_sends_its_notice(
    customer_email, notice_settings, billing_inline, mailoutbox, status, kind, subject
):
    counts = pulled(customer_email, status, date_updated=ts(at(1)))
    assert counts.updated == 1
    assert [(m.subject, m.to) for m in mailoutbox] == [(subject, ["ada@example.com"])]
    notice = Notice.objects.get()
    assert (notice.kind, notice.state, notice.event_id) == (kind, NoticeState.SENT, None)
    assert notice.subscription_id == customer_email.subscription.pk
    pulled(customer_email, status, date_updated=ts(at(1)))  # the next pull: nothing new
    assert len(mailoutbox) == 1


@pytest.mark.parametrize("dated", [True, False], ids=["dated", "undated-event"])
def test_the_event_after_the_pull_sends_no_second_notice(
    client, customer_email, notice_settings, billing_inline, mailoutbox, dated
):
    mirror = customer_email
    pulled(mirror, "canceled", date_updated=ts(at(1)))
    data = sub_data(mirror, "canceled", date_updated=ts(at(1)))
    event = deliver(
        client,
        envelope("subscription.canceled", data if dated else undated(data), created_at=at(2)),
    )
    assert event.state == "processed"
    assert len(mailoutbox) == 1
    assert Notice.objects.count() == 1


@pytest.mark.parametrize("dated", [True, False], ids=["dated", "undated-event"])
def test_the_pull_after_the_event_sends_no_second_notice(
    client, customer_email, notice_settings, billing_inline, mailoutbox, dated
):
    mirror = customer_email
    data = sub_data(mirror, "canceled", date_updated=ts(at(1)))
    event = deliver(
        client,
        envelope("subscription.canceled", data if dated else undated(data), created_at=at(1)),
    )
    pulled(mirror, "canceled", date_updated=ts(at(1)))
    assert len(mailoutbox) == 1
    assert Notice.objects.get().event_id == event.pk


def test_a_pull_finds_a_second_cancellation_after_a_resume(
    customer_email, notice_settings, billing_inline, mailoutbox
):
    pulled(customer_email, "canceled", date_updated=ts(at(1)))
    pulled(customer_email, "published", date_updated=ts(at(2)))
    pulled(customer_email, "canceled", date_updated=ts(at(3)))
    assert kinds_sent() == ["subscription_canceled", "subscription_canceled"]


def test_a_first_pull_of_canceled_subscriptions_sends_nothing(
    customer_email, notice_settings, billing_inline, mailoutbox
):
    """Rows new here (a first import of the service's history) are no change seen here."""
    data = sub_data(customer_email, "canceled")
    counts = upsert_subscriptions([{**data, "id": str(uuid.uuid4())}])
    assert counts.created == 1
    assert mailoutbox == []
    assert not Notice.objects.exists()


def test_a_pull_that_finds_a_subscription_ended_sends_nothing(
    customer_email, notice_settings, billing_inline, mailoutbox
):
    """No notice kind tells of an ending (no event does either)."""
    pulled(customer_email, "ended", date_updated=ts(at(1)))
    assert Subscription.objects.get().status == "ended"
    assert mailoutbox == []


def test_a_pulled_cancellation_with_its_notice_off_sends_nothing(
    customer_email, notice_settings, billing_inline, mailoutbox
):
    notice_settings.BILLING = {**notice_settings.BILLING, "NOTICES": {"payment_failed": True}}
    pulled(customer_email, "canceled", date_updated=ts(at(1)))
    assert mailoutbox == []
    assert not Notice.objects.exists()


def test_the_admin_lists_a_pulled_notice_with_its_subscription(
    admin_client, customer_email, notice_settings, billing_inline, mailoutbox
):
    pulled(customer_email, "canceled", date_updated=ts(at(1)))
    page = admin_client.get("/admin/billing_integration/notice/").content.decode()
    sub = customer_email.subscription
    assert f"/admin/billing_integration/subscription/{sub.pk}/change/" in page
    assert "pruned from the event log" not in page


def test_a_pulled_notice_whose_task_was_lost_is_sent_once_by_the_sweep(
    customer_email, notice_settings, billing_inline, mailoutbox
):
    from unittest import mock

    from kombu.exceptions import OperationalError

    from billing_integration.notices.tasks import SWEEP_AFTER, send_pulled_notice, sweep_notices

    def broker_down(*args, **kwargs):
        raise OperationalError("broker down")

    with mock.patch.object(send_pulled_notice, "apply_async", broker_down):
        pulled(customer_email, "canceled", date_updated=ts(at(1)))
    assert mailoutbox == []
    notice = Notice.objects.get()
    assert notice.state == NoticeState.QUEUED
    Notice.objects.update(created_at=notice.created_at - SWEEP_AFTER - timedelta(seconds=1))
    assert sweep_notices() == 1
    assert sweep_notices() == 0
    assert len(mailoutbox) == 1
    assert Notice.objects.get().state == NoticeState.SENT
    assert send_pulled_notice.delay(notice.pk).get() == "done"
    assert len(mailoutbox) == 1


@pytest.mark.parametrize("dated", [True, False], ids=["dated", "undated"])
def test_a_renewal_that_moves_a_subscription_into_canceled_sends_the_cancel_notice_once(
    client, customer_email, notice_settings, billing_inline, mailoutbox, dated
):
    """Whichever event moves it: a ``subscription.renewal`` whose data says ``canceled``, then
    the ``subscription.canceled`` of the same change: one mail. A renewal of a subscription
    already canceled sends none."""
    data = sub_data(customer_email, "canceled", date_updated=ts(at(1)))
    data = data if dated else undated(data)
    deliver(client, envelope("subscription.renewal", dict(data), created_at=at(1)))
    assert kinds_sent() == ["subscription_canceled"]
    deliver(client, envelope("subscription.canceled", dict(data), created_at=at(2)))
    deliver(client, envelope("subscription.renewal", dict(data), created_at=at(3)))
    assert len(mailoutbox) == 1


def test_a_date_created_only_cancel_after_a_resume_gets_its_own_mail(
    client, customer_email, notice_settings, billing_inline, mailoutbox
):
    """Events dated by date_created only (they tie on it): the envelope's times order them, so
    the resume applies and the second cancel is a change."""
    data = undated(sub_data(customer_email, "canceled"))
    data["date_created"] = ts(T0)
    deliver(client, envelope("subscription.canceled", dict(data), created_at=at(1)))
    resume = deliver(
        client, envelope("subscription.renewal", dict(data, status="published"), created_at=at(2))
    )
    assert resume.outcome == "applied"
    deliver(client, envelope("subscription.canceled", dict(data), created_at=at(3)))
    assert kinds_sent() == ["subscription_canceled", "subscription_canceled"]


def test_a_pull_that_only_respells_canceled_sends_nothing(
    customer_email, notice_settings, billing_inline, mailoutbox
):
    pulled(customer_email, "canceled", date_updated=ts(at(1)))
    pulled(customer_email, "cancelled", date_updated=ts(at(2)))
    assert Subscription.objects.get().status == "cancelled"
    assert len(mailoutbox) == 1
