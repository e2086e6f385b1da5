"""Issue 16: opt-in notices when money moves, sent once per event through Django's email
framework, from event processing (signals after commit -> a Celery task)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from unittest import mock

import pytest
from celery.exceptions import Retry
from django.core.checks import run_checks
from django.core.mail.backends.locmem import EmailBackend
from django.db.models import F
from kombu.exceptions import OperationalError

from billing_integration.models import Notice, NoticeState, WebhookEvent
from billing_integration.notices import tasks as notice_tasks
from billing_integration.notices.tasks import (
    SWEEP_AFTER,
    claim,
    send_notice,
    send_trial_notice,
    sweep_notices,
)
from billing_integration.schedule import BEAT_SCHEDULE
from billing_integration.webhooks import signals
from billing_integration.webhooks.processing import process_event, replay_events

from ..webhooks.conftest import (
    T0,
    envelope,
    payment_data,
    post_signed,
    refund_data,
    subscription_data,
    ts,
)
from .conftest import SITE

pytestmark = pytest.mark.django_db

ACCOUNT = f"{SITE}/billing/account/"


def failed_payment(mirror, **extra):
    return envelope(
        "payment.failed",
        payment_data(
            uuid.uuid4(),
            status="failed",
            subscription=mirror.subscription.remote_id,
            customer=mirror.customer.remote_id,
            product=mirror.product.remote_id,
            amount=5000,
            failure_reason="insufficient_funds",
            **extra,
        ),
    )


def approved_refund(mirror, **extra):
    data = {"customer": mirror.customer.remote_id, **extra}
    return envelope(
        "refund.approved",
        refund_data(
            uuid.uuid4(),
            status="approved",
            payment=uuid.uuid4(),
            subscription=mirror.subscription.remote_id,
            **data,
        ),
    )


def deliver(client, payload):
    response = post_signed(client, payload)
    assert response.status_code == 200, response.content
    return WebhookEvent.objects.get(event_id=payload["id"])


def html_of(message) -> str:
    (html, mimetype), *_ = message.alternatives
    assert mimetype == "text/html"
    return html


def test_payment_failed_sends_one_mail_with_the_pay_again_link(
    client, customer_email, notice_settings, billing_inline, mailoutbox
):
    mirror = customer_email
    event = deliver(client, failed_payment(mirror))

    assert len(mailoutbox) == 1
    message = mailoutbox[0]
    assert message.to == ["ada@example.com"]
    assert message.from_email == "billing@example.com"
    assert message.subject == "Your payment for Pro failed"
    assert ACCOUNT in message.body
    assert "insufficient funds" in message.body
    assert "5,000 XOF" in message.body
    assert f'href="{ACCOUNT}"' in html_of(message)
    assert "insufficient funds" in html_of(message)
    notice = Notice.objects.get()
    assert (notice.event, notice.kind, notice.state) == (event, "payment_failed", "sent")
    assert notice.recipient == "ada@example.com"
    assert notice.sent_at is not None


def test_a_subject_is_text_not_html(
    client, customer_email, notice_settings, billing_inline, mailoutbox
):
    """The subject is plain text: a product named "Tom & <Jerry>" reads so, not HTML-escaped;
    the HTML body escapes it."""
    from billing_integration.models import Product
    from billing_integration.outbox import from_remote

    with from_remote():
        Product.objects.filter(pk=customer_email.product.pk).update(name="Tom & <Jerry>")
    deliver(client, failed_payment(customer_email))
    [message] = mailoutbox
    assert message.subject == "Your payment for Tom & <Jerry> failed"
    assert "Tom &amp; &lt;Jerry&gt;" in html_of(message)


def test_redelivery_and_forced_replay_send_no_second_mail(
    client, customer_email, notice_settings, billing_inline, mailoutbox
):
    received = []

    def count(sender, **kwargs):
        received.append(kwargs["event"].pk)

    signals.payment_failed.connect(count, weak=False)
    try:
        payload = failed_payment(customer_email)
        event = deliver(client, payload)
        deliver(client, payload)  # the service delivers the same event again
        process_event(event.pk, force=True)  # a replay sends the signals again
        replay_events(WebhookEvent.objects.filter(pk=event.pk), force=True)
        replay_events(WebhookEvent.objects.filter(pk=event.pk), inline=False, force=True)
    finally:
        signals.payment_failed.disconnect(count)

    assert received == [event.pk] * 4  # the signal went out four times...
    assert len(mailoutbox) == 1  # ...the mail once
    assert Notice.objects.get().state == NoticeState.SENT


def test_the_same_change_under_a_second_event_id_sends_one_mail(
    client, customer_email, notice_settings, billing_inline, mailoutbox
):
    """The service may send one change twice under two event ids: the second is applied (the
    signal goes out again) but the customer gets one mail; a later failure of the same payment
    (a newer ``date_updated``) gets its own."""
    received = []

    def count(sender, **kwargs):
        received.append(kwargs["event"].pk)

    first = failed_payment(customer_email)
    again = envelope("payment.failed", dict(first["data"]))
    later_data = {**first["data"], "date_updated": ts(T0 + timedelta(days=3))}
    later = envelope("payment.failed", later_data)
    signals.payment_failed.connect(count, weak=False)
    try:
        one, two = deliver(client, first), deliver(client, again)
        assert len(mailoutbox) == 1
        three = deliver(client, later)
    finally:
        signals.payment_failed.disconnect(count)

    assert received == [one.pk, two.pk, three.pk]
    assert len(mailoutbox) == 2
    sent = Notice.objects.filter(state=NoticeState.SENT).order_by("pk")
    assert [n.event_id for n in sent] == [one.pk, three.pk]
    assert Notice.objects.count() == 2


def test_a_notice_recorded_before_its_change_was_kept_is_found_by_its_event(
    client, customer_email, notice_settings, billing_inline, mailoutbox, caplog
):
    """A notice recorded before notices kept their change (``change`` empty) is still that
    event's notice: a forced replay finds it by the event, sends nothing again, and logs no
    error."""
    event = deliver(client, failed_payment(customer_email))
    Notice.objects.update(change="")
    caplog.clear()
    process_event(event.pk, force=True)

    assert len(mailoutbox) == 1
    notice = Notice.objects.get()
    assert (notice.event_id, notice.state) == (event.pk, NoticeState.SENT)
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


def test_a_redelivered_task_does_not_send_twice(
    client, customer_email, notice_settings, billing_inline, mailoutbox
):
    event = deliver(client, failed_payment(customer_email))
    assert send_notice.delay(event.pk, "payment_failed").get() == "done"
    assert len(mailoutbox) == 1


def test_a_notice_turned_off_sends_nothing(
    client, customer_email, notice_settings, billing_inline, mailoutbox
):
    notice_settings.BILLING = {**notice_settings.BILLING, "NOTICES": {"refund_approved": True}}
    deliver(client, failed_payment(customer_email))
    assert mailoutbox == []
    assert not Notice.objects.exists()


def test_notices_are_off_by_default(client, mirror, webhook_settings, billing_inline, mailoutbox):
    from billing_integration.outbox import from_remote

    with from_remote():
        mirror.customer.email = "ada@example.com"
        mirror.customer.save()
    deliver(client, failed_payment(mirror))
    assert mailoutbox == []
    assert not Notice.objects.exists()


def test_no_address_is_recorded_skipped(
    client, mirror, notice_settings, billing_inline, mailoutbox
):
    event = deliver(client, failed_payment(mirror))  # the customer has no email, no subscriber
    assert mailoutbox == []
    notice = Notice.objects.get()
    assert (notice.event, notice.state, notice.recipient) == (event, "skipped", "")


def test_the_subscribers_email_when_the_customer_has_none(
    client, mirror, notice_settings, billing_inline, mailoutbox, django_user_model
):
    from billing_integration.outbox import from_remote

    user = django_user_model.objects.create(username="ada", email="user@example.com")
    with from_remote():
        mirror.customer.subscriber = user
        mirror.customer.save()
    deliver(client, failed_payment(mirror))
    assert [m.to for m in mailoutbox] == [["user@example.com"]]


@pytest.mark.parametrize(
    "address",
    [
        "ada@example.com, mallory@evil.example",  # an email service's API sends to both
        "ada@example.com;mallory@evil.example",
        "Ada <ada@example.com>, mallory@evil.example",
        "ada@example.com\nBcc: mallory@evil.example",
    ],
)
def test_an_address_that_names_more_than_one_mailbox_is_not_mailed(
    client, mirror, notice_settings, billing_inline, mailoutbox, django_user_model, address
):
    """The customer's email comes from the subscriber or the service: one that is not a single
    valid address is no address (the subscriber's is used, else the notice is skipped)."""
    from billing_integration.outbox import from_remote

    with from_remote():
        mirror.customer.email = address
        mirror.customer.save()
    deliver(client, failed_payment(mirror))
    assert mailoutbox == []
    notice = Notice.objects.get()
    assert (notice.state, notice.recipient) == ("skipped", "")
    assert "evil" not in notice.error

    user = django_user_model.objects.create(username="ada", email="user@example.com")
    with from_remote():
        mirror.customer.subscriber = user
        mirror.customer.save()
    deliver(client, failed_payment(mirror))
    assert [m.to for m in mailoutbox] == [["user@example.com"]]
    assert "evil" not in str(mailoutbox[0].message())


def test_the_sender_is_default_from_email(
    client, customer_email, notice_settings, billing_inline, mailoutbox
):
    notice_settings.DEFAULT_FROM_EMAIL = "accounts@example.com"
    deliver(client, failed_payment(customer_email))
    assert [m.from_email for m in mailoutbox] == ["accounts@example.com"]
    assert Notice.objects.get().recipient == "ada@example.com"


@pytest.mark.parametrize("kind", ["payment_failed", "refund_approved"])
def test_a_record_of_a_customer_not_known_here_is_not_mailed_to_its_subscriptions_customer(
    client, customer_email, notice_settings, billing_inline, mailoutbox, kind
):
    """The payment (refund) names a customer this site does not know (the pull finds none):
    the subscription's customer, another person, gets no mail about it."""
    mirror, stranger = customer_email, uuid.uuid4()
    if kind == "payment_failed":
        payload = failed_payment(mirror)
        payload["data"]["customer"] = str(stranger)
    else:
        payload = approved_refund(mirror, customer=stranger)
    with mock.patch("billing_integration.webhooks.processing.pull_missing"):
        event = deliver(client, payload)
    assert (event.state, event.outcome) == ("processed", "applied")
    assert mailoutbox == []
    notice = Notice.objects.get()
    assert (notice.kind, notice.state, notice.recipient) == (kind, "skipped", "")


def test_a_record_without_a_customer_is_mailed_to_its_subscriptions_customer(
    client, customer_email, notice_settings, billing_inline, mailoutbox
):
    payload = failed_payment(customer_email)
    payload["data"]["customer"] = None
    deliver(client, payload)
    assert [m.to for m in mailoutbox] == [["ada@example.com"]]


@pytest.mark.parametrize(
    ("event_type", "status", "kind", "subject"),
    [
        (
            "subscription.canceled",
            "canceled",
            "subscription_canceled",
            "Your subscription to Pro was canceled",
        ),
        (
            "subscription.paused",
            "paused",
            "subscription_paused",
            "Your subscription to Pro is paused",
        ),
    ],
)
def test_subscription_canceled_or_paused(
    client,
    customer_email,
    notice_settings,
    billing_inline,
    mailoutbox,
    event_type,
    status,
    kind,
    subject,
):
    mirror = customer_email
    payload = envelope(
        event_type,
        subscription_data(
            mirror.subscription.remote_id,
            customer=mirror.customer.remote_id,
            product=mirror.product.remote_id,
            status=status,
        ),
    )
    event = deliver(client, payload)
    deliver(client, payload)
    assert [(m.subject, m.to) for m in mailoutbox] == [(subject, ["ada@example.com"])]
    assert ACCOUNT in mailoutbox[0].body
    assert Notice.objects.get().kind == kind
    assert Notice.objects.get().event == event


def test_refund_approved(client, customer_email, notice_settings, billing_inline, mailoutbox):
    mirror = customer_email
    payload = approved_refund(mirror, amount=2500)
    deliver(client, payload)
    deliver(client, payload)
    assert len(mailoutbox) == 1
    assert mailoutbox[0].subject == "Your refund of 2,500 XOF was approved"
    assert "Your refund of 2,500 XOF for Pro was approved." in mailoutbox[0].body
    assert Notice.objects.get().kind == "refund_approved"


def test_templates_are_overridable(
    client, customer_email, notice_settings, billing_inline, mailoutbox, tmp_path
):
    folder = tmp_path / "billing_integration" / "notices"
    folder.mkdir(parents=True)
    (folder / "payment_failed_subject.txt").write_text("Action needed: {{ product.name }}")
    (folder / "payment_failed.txt").write_text("Pay here: {{ account_url }} ({{ amount }})")
    notice_settings.TEMPLATES = [
        {**notice_settings.TEMPLATES[0], "DIRS": [str(tmp_path)]},
        *notice_settings.TEMPLATES[1:],
    ]
    deliver(client, failed_payment(customer_email))
    (message,) = mailoutbox
    assert message.subject == "Action needed: Pro"
    assert message.body == f"Pay here: {ACCOUNT} (5,000 XOF)"
    assert f'href="{ACCOUNT}"' in html_of(message)  # the app's HTML template, not overridden


class FlakyBackend(EmailBackend):
    """The locmem backend failing its first ``failures`` sends."""

    failures = 0

    def send_messages(self, messages):
        if FlakyBackend.failures > 0:
            FlakyBackend.failures -= 1
            raise ConnectionError("SMTP server unavailable")
        return super().send_messages(messages)


def retry_now(event, kind="payment_failed"):
    """What the worker does when the retry the task asked for comes due (eager Celery only
    raises ``Retry``)."""
    return send_notice.apply(args=(event.pk, kind), retries=1).get()


def test_a_failed_send_is_recorded_and_retried(
    client, customer_email, notice_settings, billing_inline, mailoutbox
):
    notice_settings.EMAIL_BACKEND = f"{__name__}.FlakyBackend"
    FlakyBackend.failures = 1
    event = deliver(client, failed_payment(customer_email))  # the task asked for a retry
    assert mailoutbox == []
    notice = Notice.objects.get()
    assert (notice.state, notice.attempts) == ("failed", 1)
    assert notice.error == "ConnectionError: SMTP server unavailable"

    assert retry_now(event) == "sent"
    assert len(mailoutbox) == 1
    notice.refresh_from_db()
    assert (notice.state, notice.attempts, notice.error) == ("sent", 2, "")
    assert retry_now(event) == "done"  # a duplicate of the retry message
    assert len(mailoutbox) == 1


def test_a_send_failing_every_attempt_stays_failed(
    client, customer_email, notice_settings, billing_inline, mailoutbox, monkeypatch
):
    notice_settings.EMAIL_BACKEND = f"{__name__}.FlakyBackend"
    monkeypatch.setattr(notice_tasks, "MAX_ATTEMPTS", 3)
    FlakyBackend.failures = 10
    try:
        event = deliver(client, failed_payment(customer_email))
        with pytest.raises(Retry):
            retry_now(event)
        assert retry_now(event) == "failed"  # the last attempt: no further retry
    finally:
        remaining, FlakyBackend.failures = FlakyBackend.failures, 0
    assert remaining == 7
    assert mailoutbox == []
    notice = Notice.objects.get()
    assert (notice.state, notice.attempts) == ("failed", 3)
    assert notice.error == "ConnectionError: SMTP server unavailable"
    # a later replay takes the failed notice over and sends it, once
    process_event(event.pk, force=True)
    process_event(event.pk, force=True)
    assert len(mailoutbox) == 1
    assert Notice.objects.get().state == "sent"


def test_a_failing_send_is_tried_max_attempts_times_in_all(
    client, customer_email, notice_settings, billing_inline, mailoutbox
):
    """``MAX_ATTEMPTS`` (5) attempts, each retry as the worker runs it (``retries`` counted by
    Celery): no retry limit of Celery's own (3 by default) cuts them short."""
    notice_settings.EMAIL_BACKEND = f"{__name__}.FlakyBackend"
    FlakyBackend.failures = 10
    try:
        event = deliver(client, failed_payment(customer_email))  # attempt 1
        for retries in range(1, notice_tasks.MAX_ATTEMPTS - 1):  # attempts 2 to 4: retried
            with pytest.raises(Retry):
                send_notice.apply(args=(event.pk, "payment_failed"), retries=retries).get()
        last = send_notice.apply(args=(event.pk, "payment_failed"), retries=4).get()
    finally:
        FlakyBackend.failures = 0
    assert last == "failed"
    notice = Notice.objects.get()
    assert (notice.state, notice.attempts) == ("failed", notice_tasks.MAX_ATTEMPTS)


def test_a_failing_trial_notice_is_tried_max_attempts_times_in_all(
    customer_email, notice_settings, mailoutbox
):
    notice_settings.BILLING = {**notice_settings.BILLING, "NOTICES": {"trial_ending": True}}
    notice_settings.EMAIL_BACKEND = f"{__name__}.FlakyBackend"
    subscription = customer_email.subscription
    Notice.objects.create(subscription=subscription, kind="trial_ending", state="queued")
    FlakyBackend.failures = 10
    try:
        # each retry as the worker runs it (``throw``: the Retry is raised, not run eagerly)
        for retries in range(notice_tasks.MAX_ATTEMPTS - 1):  # attempts 1 to 4: retried
            with pytest.raises(Retry):
                send_trial_notice.apply(args=(subscription.pk,), retries=retries, throw=True)
        last = send_trial_notice.apply(args=(subscription.pk,), retries=4, throw=True).get()
    finally:
        FlakyBackend.failures = 0
    assert last == "failed"
    notice = Notice.objects.get()
    assert (notice.state, notice.attempts) == ("failed", notice_tasks.MAX_ATTEMPTS)


def test_a_trial_notice_that_failed_before_its_send_is_retried_and_sent(
    customer_email, notice_settings, mailoutbox, monkeypatch
):
    """A failure in reading what the mail says (not only in sending it) is recorded
    ``failed``, so that the retry claims the notice again and sends it."""
    notice_settings.BILLING = {**notice_settings.BILLING, "NOTICES": {"trial_ending": True}}
    subscription = customer_email.subscription
    Notice.objects.create(subscription=subscription, kind="trial_ending", state="queued")
    real, failures = notice_tasks.notice_context, [ConnectionError("database went away")]

    def flaky_context(*args):
        if failures:
            raise failures.pop()
        return real(*args)

    monkeypatch.setattr(notice_tasks, "notice_context", flaky_context)
    with pytest.raises(Retry):
        send_trial_notice.apply(args=(subscription.pk,), throw=True)
    notice = Notice.objects.get()
    assert (notice.state, notice.attempts) == ("failed", 1)
    assert notice.error == "ConnectionError: database went away"
    assert send_trial_notice.apply(args=(subscription.pk,), retries=1).get() == "sent"
    assert len(mailoutbox) == 1


# --- issue 23: a notice whose task could not be queued is swept, still sent once ------------
def broker_down(*args, **kwargs):
    raise OperationalError("[Errno 111] Connection refused")


def age_queued_notices():
    """As if ``SWEEP_AFTER`` had passed since the notices were recorded."""
    Notice.objects.update(created_at=F("created_at") - SWEEP_AFTER - SWEEP_AFTER)


def test_a_notice_whose_task_could_not_be_queued_is_sent_once_by_the_sweep(
    client, customer_email, notice_settings, billing_inline, mailoutbox, monkeypatch
):
    with monkeypatch.context() as patch:
        patch.setattr(send_notice, "apply_async", broker_down)  # the broker is down...
        event = deliver(client, failed_payment(customer_email))  # ...the event is applied
    assert mailoutbox == []
    notice = Notice.objects.get()
    assert (notice.event, notice.kind, notice.state) == (event, "payment_failed", "queued")

    assert sweep_notices() == 0  # just recorded: its task may still be on its way
    age_queued_notices()
    assert sweep_notices() == 1
    assert [m.to for m in mailoutbox] == [["ada@example.com"]]
    notice.refresh_from_db()
    assert (notice.state, notice.attempts) == ("sent", 1)

    assert sweep_notices() == 0  # nothing left to sweep
    assert send_notice.delay(event.pk, "payment_failed").get() == "done"  # a late task
    process_event(event.pk, force=True)  # a replay
    assert len(mailoutbox) == 1


def test_the_sweep_and_a_late_task_claim_a_queued_notice_once(
    client, customer_email, notice_settings, billing_inline, mailoutbox, monkeypatch
):
    with monkeypatch.context() as patch:
        patch.setattr(send_notice, "apply_async", broker_down)
        event = deliver(client, failed_payment(customer_email))
    first = claim(event, "payment_failed")  # the sweep's task
    assert first is not None and first.state == "sending"
    assert claim(event, "payment_failed") is None  # the late task: the UPDATE took no row
    assert Notice.objects.get().state == "sending"
    age_queued_notices()
    assert sweep_notices() == 0  # being sent: not queued again
    assert mailoutbox == []


def test_a_turned_off_notice_is_not_swept(
    client, customer_email, notice_settings, billing_inline, mailoutbox, monkeypatch
):
    with monkeypatch.context() as patch:
        patch.setattr(send_notice, "apply_async", broker_down)
        deliver(client, failed_payment(customer_email))
    notice_settings.BILLING = {**notice_settings.BILLING, "NOTICES": {"refund_approved": True}}
    age_queued_notices()
    assert sweep_notices() == 0
    assert mailoutbox == []
    assert Notice.objects.get().state == "queued"


def test_the_sweep_is_a_periodic_task():
    from celery import current_app

    name = "billing_integration.sweep_notices"
    entries = [e for e in BEAT_SCHEDULE.values() if e["task"] == name]
    assert len(entries) == 1 and entries[0]["schedule"] > 0
    assert name in current_app.tasks


def test_checks_require_site_url_when_a_notice_is_on(notice_settings):
    notice_settings.BILLING = {**notice_settings.BILLING, "SITE_URL": ""}
    ids = [e.id for e in run_checks(tags=["billing"])]
    assert "billing_integration.E041" in ids
    notice_settings.BILLING = {**notice_settings.BILLING, "NOTICES": {}}
    assert "billing_integration.E041" not in [e.id for e in run_checks(tags=["billing"])]


def test_checks_refuse_an_unknown_notice(notice_settings):
    notice_settings.BILLING = {**notice_settings.BILLING, "NOTICES": {"payment_faild": True}}
    assert "billing_integration.E040" in [e.id for e in run_checks(tags=["billing"])]


def test_the_admin_lists_sent_notices_read_only(
    client, admin_client, customer_email, notice_settings, billing_inline, mailoutbox
):
    event = deliver(client, failed_payment(customer_email))
    response = admin_client.get("/admin/billing_integration/notice/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "ada@example.com" in page
    assert event.event_id in page
    assert f"/admin/billing_integration/webhookevent/{event.pk}/change/" in page
    notice = Notice.objects.get()
    assert admin_client.get("/admin/billing_integration/notice/add/").status_code == 403
    detail = admin_client.get(f"/admin/billing_integration/notice/{notice.pk}/change/")
    assert detail.status_code == 200
    assert b'name="recipient"' not in detail.content
