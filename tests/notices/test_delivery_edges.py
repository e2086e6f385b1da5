"""Notices at the edges of delivery: a failure superseded before its mail goes out, a mail
server that accepted the message and then failed to say goodbye, two workers on one notice."""

from __future__ import annotations

import socket
import threading
from datetime import timedelta
from typing import Any

import pytest
from celery.exceptions import Retry
from django.db import connections
from django.db.models import F

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


class SlowToConfirmSMTP:
    """An SMTP server on 127.0.0.1 that keeps every message it is given and, the first
    ``silent`` times, does not answer the end of the message (its ``250``): the client times
    out not knowing the message was taken. ``rcpt`` is its answer to each recipient."""

    def __init__(self, silent: int = 0, rcpt: bytes = b"250 ok") -> None:
        self.messages: list[bytes] = []
        self.silent, self.rcpt, self.rcpts = silent, rcpt, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, conn.makefile("rb") as lines:
                self._session(conn, lines)

    def _session(self, conn: socket.socket, lines: Any) -> None:
        conn.sendall(b"220 test\r\n")
        for line in lines:
            verb = line[:4].upper()
            if verb == b"DATA":
                conn.sendall(b"354 go on\r\n")
                body = b"".join(iter(lambda: lines.readline(), b".\r\n"))
                self.messages.append(body)
                if self.silent > 0:
                    self.silent -= 1
                    lines.readline()  # wait for the client to give up
                    return
                conn.sendall(b"250 queued\r\n")
            elif verb == b"RCPT":
                self.rcpts += 1
                conn.sendall(self.rcpt + b"\r\n")
            elif verb == b"QUIT":
                conn.sendall(b"221 bye\r\n")
                return
            else:
                conn.sendall(b"250 ok\r\n")

    def close(self) -> None:
        self.sock.close()


def test_a_mail_taken_by_a_server_that_timed_out_before_confirming_is_sent_again(
    client, customer_email, notice_settings, billing_inline
):
    """At least once, as documented: the mail server took the message but its confirmation
    never came (the connection timed out); the task cannot tell that from a message not
    taken, records ``failed`` and its retry sends the notice again."""
    server = SlowToConfirmSMTP(silent=1)
    notice_settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    notice_settings.EMAIL_HOST, notice_settings.EMAIL_PORT = "127.0.0.1", server.port
    notice_settings.EMAIL_TIMEOUT = 1
    try:
        event = deliver(client, failed_payment(customer_email))  # the first attempt
        notice = Notice.objects.get()
        assert (notice.state, notice.attempts) == (NoticeState.FAILED, 1)
        assert len(server.messages) == 1  # ...which the server had taken
        assert send_notice.apply(args=(event.pk, "payment_failed"), retries=1).get() == "sent"
    finally:
        server.close()
    assert len(server.messages) == 2  # the customer has it twice


@pytest.mark.postgresql
@pytest.mark.parametrize("row", ["queued", "none"])
def test_two_workers_on_one_notice_send_it_once(
    client, customer_email, notice_settings, billing_inline, mailoutbox, monkeypatch, row
):
    """Two workers run the same notice's task at once (a redelivered task beside the sweep's,
    a replay beside a retry), released together by a barrier, on PostgreSQL: the claim (one
    conditional UPDATE of the ``queued`` row, or one INSERT the unique constraint lets win
    when there is no row) gives the notice to one of them; one mail each."""
    with monkeypatch.context() as patch:
        patch.setattr(send_notice, "apply_async", broker_down)
        events = [deliver(client, failed_payment(customer_email)) for _ in range(10)]
    if row == "none":
        Notice.objects.all().delete()
    results: list[str] = []
    for event in events:
        start = threading.Barrier(2, timeout=30)

        def worker(pk: int = event.pk, start: threading.Barrier = start) -> None:
            try:
                start.wait()
                results.append(send_notice.apply(args=(pk, "payment_failed")).get())
            finally:
                connections.close_all()

        threads = [threading.Thread(target=worker) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)

    assert sorted(results) == ["done"] * 10 + ["sent"] * 10
    assert len(mailoutbox) == 10
    sent = Notice.objects.values_list("state", "attempts")
    assert list(sent) == [(NoticeState.SENT, 1)] * 10


def test_an_address_the_mail_server_refuses_for_good_is_failed_at_once_not_retried(
    client, customer_email, notice_settings, billing_inline, mailoutbox, monkeypatch
):
    """A well-formed address the mail server refuses with a permanent error (``550``: no such
    mailbox) is recorded ``failed`` with the server's answer after one attempt: retrying in
    30 s, 60 s... would get the same answer. A refusal for now (``450``) is retried."""
    server = SlowToConfirmSMTP(rcpt=b"550 5.1.1 no such mailbox")
    notice_settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    notice_settings.EMAIL_HOST, notice_settings.EMAIL_PORT = "127.0.0.1", server.port
    try:
        with monkeypatch.context() as patch:
            patch.setattr(send_notice, "apply_async", broker_down)
            event = deliver(client, failed_payment(customer_email))
        assert send_notice.apply(args=(event.pk, "payment_failed")).get() == NoticeState.FAILED
        notice = Notice.objects.get()
        assert (notice.state, notice.attempts) == (NoticeState.FAILED, 1)
        assert "550" in notice.error and "no such mailbox" in notice.error

        server.rcpt = b"450 4.2.1 try again later"
        with pytest.raises(Retry):
            send_notice.apply(args=(event.pk, "payment_failed"), retries=1).get()
    finally:
        server.close()
    assert server.rcpts == 2 and server.messages == []


def test_notices_that_failed_for_good_or_stuck_sending_are_a_warning_on_the_health_report(
    client, customer_email, notice_settings, billing_inline, mailoutbox, monkeypatch
):
    """Staff see a notice that will not reach its customer without opening the Notices list:
    the ``notices`` fact of ``billing_doctor`` and the Health page warns of the last day's
    ``failed`` ones, those stuck ``sending`` (a worker died while sending: not sent again) and
    those still ``queued`` long after (the sweep not scheduled)."""
    from billing_integration.health import FACTS, NOTICE_STUCK_AFTER, WARNING, diagnose

    def fact():
        [found] = diagnose(skip=[f for f in FACTS if f != "notices"]).facts
        return found

    assert (fact().status, fact().data) == ("ok", {"failed": 0, "stuck": 0, "queued": 0})
    server = SlowToConfirmSMTP(rcpt=b"550 5.1.1 no such mailbox")
    notice_settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    notice_settings.EMAIL_HOST, notice_settings.EMAIL_PORT = "127.0.0.1", server.port
    try:
        with monkeypatch.context() as patch:
            patch.setattr(send_notice, "apply_async", broker_down)
            refused = deliver(client, failed_payment(customer_email))
            dying = deliver(client, failed_payment(customer_email))
            deliver(client, failed_payment(customer_email))  # its task lost, never swept
        send_notice.apply(args=(refused.pk, "payment_failed")).get()
    finally:
        server.close()
    Notice.objects.filter(event=dying).update(state=NoticeState.SENDING)  # the worker died
    Notice.objects.update(created_at=F("created_at") - timedelta(seconds=NOTICE_STUCK_AFTER + 1))

    found = fact()
    assert (found.status, found.data) == (WARNING, {"failed": 1, "stuck": 1, "queued": 1})
    assert "1 failed, 1 stuck sending" in found.summary


def test_a_cancellation_resumed_before_its_mail_went_out_is_not_mailed(
    client, customer_email, notice_settings, billing_inline, mailoutbox, monkeypatch
):
    """Canceled, then resumed (active again) before the notice's task ran: no "your
    subscription was canceled" mail about a subscription that runs; recorded ``skipped``."""
    from .test_one_per_change import at, sub_data

    with monkeypatch.context() as patch:
        patch.setattr(send_notice, "apply_async", broker_down)
        cancel = sub_data(customer_email, "canceled", date_updated=ts(at(1)))
        event = deliver(client, envelope("subscription.canceled", cancel))
        resume = sub_data(customer_email, "published", date_updated=ts(at(2)))
        deliver(client, envelope("subscription.renewal", resume))

    assert send_notice.delay(event.pk, "subscription_canceled").get() == NoticeState.SKIPPED
    assert mailoutbox == []
    notice = Notice.objects.get()
    assert (notice.state, notice.error) == (NoticeState.SKIPPED, "Active again since.")


def test_a_pulled_pause_resumed_before_its_mail_went_out_is_not_mailed(
    customer_email, notice_settings, billing_inline, mailoutbox, monkeypatch
):
    from billing_integration.notices.tasks import send_pulled_notice

    from .test_one_per_change import at, pulled

    with monkeypatch.context() as patch:
        patch.setattr(send_pulled_notice, "apply_async", broker_down)
        pulled(customer_email, "paused", date_updated=ts(at(1)))
        pulled(customer_email, "published", date_updated=ts(at(2)))
    notice = Notice.objects.get()
    assert send_pulled_notice.delay(notice.pk).get() == NoticeState.SKIPPED
    assert mailoutbox == []


def test_a_notice_queued_before_its_kind_was_turned_off_waits_and_is_sent_once_on_again(
    client, customer_email, notice_settings, billing_inline, mailoutbox, monkeypatch
):
    """Turning a kind off holds its notices still ``queued`` (the task answers ``off``, the
    sweep passes them by); turning it on again lets the sweep send each, once."""
    from billing_integration.notices.tasks import SWEEP_AFTER, sweep_notices

    on = notice_settings.BILLING
    with monkeypatch.context() as patch:
        patch.setattr(send_notice, "apply_async", broker_down)
        event = deliver(client, failed_payment(customer_email))
    notice_settings.BILLING = {**on, "NOTICES": {"refund_approved": True}}
    assert send_notice.delay(event.pk, "payment_failed").get() == "off"
    Notice.objects.update(created_at=F("created_at") - SWEEP_AFTER - SWEEP_AFTER)
    assert sweep_notices() == 0
    assert (mailoutbox, Notice.objects.get().state) == ([], NoticeState.QUEUED)

    notice_settings.BILLING = on
    assert sweep_notices() == 1
    assert sweep_notices() == 0
    assert len(mailoutbox) == 1


def test_a_retry_that_could_not_be_queued_leaves_the_notice_to_the_sweep(
    client, customer_email, notice_settings, billing_inline, mailoutbox, monkeypatch
):
    """A send failed for now and the broker is down when the task asks for its retry: Celery
    rejects the message (``Reject``, not requeued), so nothing would try the notice again. It
    is ``queued`` again instead, and the sweep sends it once."""
    from celery.exceptions import Reject

    from billing_integration.notices.tasks import SWEEP_AFTER, sweep_notices

    server = SlowToConfirmSMTP(rcpt=b"451 4.3.0 try again later")
    notice_settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    notice_settings.EMAIL_HOST, notice_settings.EMAIL_PORT = "127.0.0.1", server.port
    try:
        with monkeypatch.context() as patch:
            patch.setattr(send_notice, "apply_async", broker_down)
            event = deliver(client, failed_payment(customer_email))
            # the task as a worker runs it (not eagerly): its retry is published, and fails
            send_notice.push_request(id="a-task", retries=0, called_directly=False)
            try:
                with pytest.raises(Reject):
                    send_notice.run(event.pk, "payment_failed")
            finally:
                send_notice.pop_request()
    finally:
        server.close()
    notice = Notice.objects.get()
    assert (notice.state, notice.attempts) == (NoticeState.QUEUED, 1)
    assert "451" in notice.error

    notice_settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    Notice.objects.update(created_at=F("created_at") - SWEEP_AFTER - SWEEP_AFTER)
    assert sweep_notices() == 1
    assert len(mailoutbox) == 1
    assert (Notice.objects.get().state, Notice.objects.get().attempts) == (NoticeState.SENT, 2)


@pytest.mark.parametrize(
    ("address", "error"),
    [
        ("", "No address to send it to."),
        ("ada@example", "No valid address: the email on record is not one valid address."),
    ],
)
def test_a_customer_without_a_valid_address_is_skipped_once_saying_which(
    client, mirror, notice_settings, billing_inline, mailoutbox, address, error
):
    """No email, or one that is not a valid address: one attempt, recorded ``skipped`` with
    which of the two it was (the address itself not repeated), no retry."""
    from billing_integration.outbox import from_remote

    with from_remote():
        mirror.customer.email = address
        mirror.customer.save()
    event = deliver(client, failed_payment(mirror))
    notice = Notice.objects.get()
    assert (notice.state, notice.attempts, notice.error) == (NoticeState.SKIPPED, 1, error)
    assert send_notice.apply(args=(event.pk, "payment_failed"), retries=1).get() == "done"
    assert mailoutbox == []
