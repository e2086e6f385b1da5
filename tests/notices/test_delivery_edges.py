"""Notices at the edges of delivery: a failure superseded before its mail goes out, a mail
server that accepted the message and then failed to say goodbye, two workers on one notice."""

from __future__ import annotations

from datetime import timedelta

import pytest

from billing_integration.models import Notice, NoticeState
from billing_integration.notices.tasks import send_notice

from ..webhooks.conftest import T0, envelope, ts
from .test_notices import broker_down, deliver, failed_payment

pytestmark = pytest.mark.django_db


def test_a_payment_failure_that_completed_before_its_mail_went_out_is_not_mailed(
    client, customer_email, notice_settings, billing_inline, mailoutbox, monkeypatch
):
    """Payment failed, then completed seconds later (the customer paid again) before the
    notice's task ran: the customer is not told to pay again; the notice is recorded
    ``skipped`` with why. A failure that is still a failure is mailed."""
    with monkeypatch.context() as patch:
        patch.setattr(send_notice, "apply_async", broker_down)  # the task runs later
        failed = failed_payment(customer_email)
        event = deliver(client, failed)
        completed = {**failed["data"], "status": "completed", "failure_reason": None}
        completed["date_updated"] = ts(T0 + timedelta(seconds=5))
        deliver(client, envelope("payment.completed", completed))

    assert send_notice.delay(event.pk, "payment_failed").get() == NoticeState.SKIPPED
    assert mailoutbox == []
    notice = Notice.objects.get()
    assert notice.state == NoticeState.SKIPPED
    assert "completed" in notice.error

    deliver(client, failed_payment(customer_email))  # another payment, still failed
    assert len(mailoutbox) == 1
