"""Notices: ``send_notice`` sends one once per (event, kind), rendering the overridable
templates ``billing_integration/notices/<kind>.txt``, ``.html`` and ``_subject.txt``;
``sweep_notices`` (periodic) queues again those still ``queued`` after ``SWEEP_AFTER``.
``notify_trials_ending`` (periodic) sends ``trial_ending`` once per trial, no event behind it,
``BILLING['TRIALS']['notice_days']`` before the trial ends."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from decimal import Decimal
from smtplib import SMTPRecipientsRefused
from typing import Any

from celery import shared_task
from celery.exceptions import Reject
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import EmailMultiAlternatives
from django.core.validators import validate_email
from django.db import IntegrityError, models, transaction
from django.db.models import F
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse
from django.utils import formats, timezone
from django.utils.translation import gettext

from ..checkout.services import holds_paid
from ..checkout.trials import trial_settings
from ..conf import billing_settings
from ..models import Notice, NoticeState, Payment, Refund, Subscription, WebhookEvent
from ..models.records import PaymentStatus
from ..models.subscriptions import CANCELED_STATUSES, active_statuses

logger = logging.getLogger("billing_integration.notices")

#: A notice still ``queued`` this long after it was recorded is queued again by the sweep.
SWEEP_AFTER = timedelta(minutes=5)
#: The most notices one sweep queues again (the next sweep takes the rest).
SWEEP_BATCH = 500
#: Sending attempts of one notice (the task retries with backoff) before it stays failed.
MAX_ATTEMPTS = 5
#: The URL name of the account page the notices link to.
ACCOUNT_URL_NAME = "billing_integration:account"

#: The notice of a trial about to end (one per subscription, sent by ``notify_trials_ending``).
TRIAL_ENDING = "trial_ending"
#: The most trial notices one run of ``notify_trials_ending`` queues (the next run takes more).
TRIAL_BATCH = 500

#: Notice kind -> the model of the object its event is about (``event.object_id``).
KINDS: dict[str, type[models.Model]] = {
    "payment_failed": Payment,
    "subscription_canceled": Subscription,
    "subscription_paused": Subscription,
    "refund_approved": Refund,
}


def enabled(kind: str) -> bool:
    """``BILLING['NOTICES'][kind]`` is true (a kind left out is off)."""
    notices = billing_settings.NOTICES or {}
    return isinstance(notices, dict) and notices.get(kind) is True


def account_url() -> str:
    """The account page's absolute URL, after ``BILLING['SITE_URL']``."""
    try:
        path = reverse(ACCOUNT_URL_NAME)
    except NoReverseMatch:
        path = "/"
    return f"{str(billing_settings.SITE_URL or '').rstrip('/')}{path}"


def recipient_for(customer: Any, subscriber: Any) -> str | None:
    """The customer's ``email``, else the subscriber's; None (the notice is skipped). Only one
    valid address counts: ``"a@x.com, b@y.com"`` (from a sign-up form, or the service) would
    reach both through an email service's API, which splits the To header at commas."""
    for email in (getattr(customer, "email", None), getattr(subscriber, "email", None)):
        if isinstance(email, str) and email.strip():
            try:
                validate_email(email.strip())
            except ValidationError:
                continue
            return email.strip()
    return None


def _amount(value: Decimal | None, currency: str) -> str:
    if value is None:
        return ""
    places = 0 if value == value.to_integral_value() else 2
    text = formats.number_format(value, decimal_pos=places, use_l10n=True, force_grouping=True)
    return f"{text} {currency}".strip()


def notice_context(kind: str, event: WebhookEvent | None, obj: Any) -> dict[str, Any]:
    """The templates' context (``amount`` formatted with its currency)."""
    payment = obj if isinstance(obj, Payment) else None
    refund = obj if isinstance(obj, Refund) else None
    subscription = obj if isinstance(obj, Subscription) else getattr(obj, "subscription", None)
    customer = getattr(obj, "customer", None)
    # The subscription's customer only when the record names no other one (a customer not
    # known here is someone else: no mail rather than one to the wrong person).
    named = getattr(obj, "customer_remote_id", None)
    if customer is None and named in (None, getattr(subscription, "customer_remote_id", None)):
        customer = getattr(subscription, "customer", None)
    record = payment or refund
    return {
        "kind": kind,
        "event": event,
        "customer": customer,
        "subscriber": getattr(customer, "subscriber", None),
        "subscription": subscription,
        "product": getattr(obj, "product", None) or getattr(subscription, "product", None),
        "payment": payment,
        "refund": refund,
        "amount": _amount(record.amount, record.currency) if record is not None else "",
        "failure_reason": (payment.failure_reason or "").replace("_", " ") if payment else "",
        "account_url": account_url(),
        "site_url": str(billing_settings.SITE_URL or "").rstrip("/"),
        "trial_ends_at": getattr(subscription, "trial_end_date", None),
    }


def build_message(kind: str, context: dict[str, Any], to: str) -> EmailMultiAlternatives:
    """The email of a notice, rendered in the active language."""
    base = f"billing_integration/notices/{kind}"
    subject = " ".join(render_to_string(f"{base}_subject.txt", context).split())
    message = EmailMultiAlternatives(
        subject=subject or gettext("About your subscription"),
        body=render_to_string(f"{base}.txt", context),
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[to],
    )
    message.attach_alternative(render_to_string(f"{base}.html", context), "text/html")
    return message


def claim(event: WebhookEvent, kind: str) -> Notice | None:
    """Take the notice for sending (``queued`` or ``failed`` -> ``sending`` in one UPDATE, or an
    INSERT the unique constraint lets one task win); None: this task must not send it."""
    taken = Notice.objects.filter(
        event=event, kind=kind, state__in=(NoticeState.QUEUED, NoticeState.FAILED)
    ).update(state=NoticeState.SENDING, attempts=F("attempts") + 1)
    if taken:
        return Notice.objects.get(event=event, kind=kind)
    try:
        with transaction.atomic():
            return Notice.objects.create(event=event, kind=kind, state="sending", attempts=1)
    except IntegrityError:
        return None


def superseded(kind: str, obj: Any) -> str:
    """Why the ``kind`` notice of ``obj`` would mislead now, read when its task runs ("" when
    it would not): its payment completed since, its subscription canceled or paused is
    active again, or its trial's product was bought (``holds_paid``)."""
    if kind == TRIAL_ENDING:
        customer = getattr(obj, "customer", None)
        subscriber = getattr(customer, "subscriber", None)
        product = getattr(obj, "product", None)
        bought = subscriber is not None and product is not None and holds_paid(subscriber, product)
        return "Bought since." if bought else ""
    status = getattr(obj, "status", "")
    if kind == "payment_failed" and status == PaymentStatus.COMPLETED:
        return "The payment has completed since."
    told = {"subscription_canceled": CANCELED_STATUSES, "subscription_paused": ("paused",)}
    if kind in told and status not in told[kind] and status in active_statuses():
        return "Active again since."
    return ""


def _finish(notice: Notice, state: str, *, recipient: str = "", error: str = "") -> str:
    notice.state, notice.recipient, notice.error = state, recipient, error[:2000]
    notice.sent_at = timezone.now() if state == NoticeState.SENT else None
    notice.save(update_fields=["state", "recipient", "error", "sent_at"])
    return state


# Celery ships no type hints: its decorators are untyped.
@shared_task(bind=True, name="billing_integration.send_notice", acks_late=True)  # type: ignore[untyped-decorator]
def send_notice(self: Any, event_pk: int, kind: str) -> str:
    """Send the ``kind`` notice of event ``event_pk`` unless it is sent or being sent (then
    ``done``); a failure is retried with backoff, ``MAX_ATTEMPTS`` attempts in all."""
    if kind not in KINDS or not enabled(kind):
        return "off"
    event = WebhookEvent.objects.filter(pk=event_pk).first()
    if event is None:
        return "missing"
    notice = claim(event, kind)
    if notice is None:
        return "done"
    try:  # the local object the event is about
        remote_id = uuid.UUID(str(event.object_id))
        obj = KINDS[kind]._default_manager.filter(remote_id=remote_id).first()
    except ValueError:
        obj = None
    if obj is None:
        return _finish(notice, NoticeState.SKIPPED, error=f"No local object {event.object_id!r}.")
    if since := superseded(kind, obj):
        return _finish(notice, NoticeState.SKIPPED, error=since)
    try:
        return _deliver(notice, kind, event, obj)
    except Exception as exc:
        return _retry(self, notice, f"Notice {kind} of event {event_pk}", exc)


@shared_task(name="billing_integration.sweep_notices")  # type: ignore[untyped-decorator]
def sweep_notices() -> int:
    """Queue ``send_notice`` (``send_pulled_notice`` for a notice without an event: a pull's or
    a trial's) again for each notice still ``queued`` ``SWEEP_AFTER`` after it was recorded
    (its task lost or never queued), ``SWEEP_BATCH`` at most; the claim keeps it to one email."""
    kinds = [kind for kind in KINDS if enabled(kind)]
    cutoff = timezone.now() - SWEEP_AFTER
    stale = Notice.objects.filter(state=NoticeState.QUEUED, kind__in=kinds, created_at__lt=cutoff)
    stale = stale.filter(models.Q(event__isnull=False) | models.Q(subscription__isnull=False))
    rows = list(stale.order_by("created_at").values_list("pk", "event_id", "kind")[:SWEEP_BATCH])
    for pk, event_pk, kind in rows:
        if event_pk is not None:
            send_notice.apply_async((event_pk, kind))
        else:  # found by a pull: its subscription's
            send_pulled_notice.apply_async((pk,))
    if rows:
        logger.warning("Queued %d notice(s) again whose task was lost or never queued", len(rows))
    return len(rows)


@shared_task(bind=True, name="billing_integration.send_pulled_notice", acks_late=True)  # type: ignore[untyped-decorator]
def send_pulled_notice(self: Any, notice_pk: int) -> str:
    """Send notice ``notice_pk``, one no event has (a pull found its subscription canceled or
    paused), once (``_send_subscription_notice``)."""
    kind = Notice.objects.filter(pk=notice_pk).values_list("kind", flat=True).first()
    if kind not in KINDS or not enabled(kind):
        return "off"
    rows = Notice.objects.filter(pk=notice_pk)
    return _send_subscription_notice(self, rows, f"Notice {notice_pk} ({kind})")


def _send_subscription_notice(task: Any, rows: models.QuerySet[Notice], name: str) -> str:
    """Send the one notice of ``rows`` about its subscription (no event): claimed as
    ``send_notice`` claims an event's (``queued`` or ``failed`` -> ``sending``, else ``done``),
    retried with backoff by ``task``, ``MAX_ATTEMPTS`` attempts in all."""
    taken = rows.filter(state__in=(NoticeState.QUEUED, NoticeState.FAILED)).update(
        state=NoticeState.SENDING, attempts=F("attempts") + 1
    )
    if not taken:
        return "done"
    notice = rows.select_related("subscription").get()
    if notice.subscription is None:
        return _finish(notice, NoticeState.SKIPPED, error="No local object.")
    if since := superseded(notice.kind, notice.subscription):
        return _finish(notice, NoticeState.SKIPPED, error=since)
    try:
        return _deliver(notice, notice.kind, None, notice.subscription)
    except Exception as exc:
        return _retry(task, notice, name, exc)


def _no_address(context: dict[str, Any]) -> str:
    """Why a notice has no recipient, without repeating the address on record."""
    given = (getattr(context[key], "email", None) for key in ("customer", "subscriber"))
    if any(isinstance(email, str) and email.strip() for email in given):
        return "No valid address: the email on record is not one valid address."
    return "No address to send it to."


def _deliver(notice: Notice, kind: str, event: WebhookEvent | None, obj: Any) -> str:
    """Render and send ``notice`` (claimed); its state after the attempt. Raises on a failure
    (recorded ``failed``, so that a retry claims it again) so the caller may retry."""
    try:
        context = notice_context(kind, event, obj)
        recipient = recipient_for(context["customer"], context["subscriber"])
        if recipient is None:
            return _finish(notice, NoticeState.SKIPPED, error=_no_address(context))
        build_message(kind, context, recipient).send(fail_silently=False)
    except Exception as exc:
        _finish(notice, NoticeState.FAILED, error=f"{type(exc).__name__}: {exc}")
        raise
    return _finish(notice, NoticeState.SENT, recipient=recipient)


def refused_for_good(exc: Exception) -> bool:
    """The mail server refused the address with a permanent error (5xx to ``RCPT TO``, such
    as "no such mailbox"): a retry would get the same answer."""
    if not isinstance(exc, SMTPRecipientsRefused) or not exc.recipients:
        return False
    return all(code >= 500 for code, _ in exc.recipients.values())


def _retry(task: Any, notice: Notice, name: str, exc: Exception) -> str:
    """After a failed attempt at ``notice`` (``name`` in the log): ``task`` retried with
    backoff, ``MAX_ATTEMPTS`` attempts in all; then ``failed`` for good (at once for an
    address ``refused_for_good``). A retry Celery could not queue leaves the notice
    ``queued`` for the sweep."""
    message = f"{type(exc).__name__}: {exc}"
    if notice.attempts < MAX_ATTEMPTS and not refused_for_good(exc):
        logger.warning("%s failed: %s", name, message)
        countdown = min(30 * 2**task.request.retries, 3600)
        try:  # ``notice.attempts`` decides; Celery's own limit (3 retries) would cut it short.
            raise task.retry(countdown=countdown, max_retries=MAX_ATTEMPTS) from exc
        except Reject:  # the retry could not be queued (the broker down): the sweep's now
            rows = Notice.objects.filter(pk=notice.pk, state=NoticeState.FAILED)
            rows.update(state=NoticeState.QUEUED)
            raise
    logger.error("%s failed for good: %s", name, message)
    return NoticeState.FAILED


def trials_to_notify(at: Any = None) -> list[Subscription]:
    """Trials ending within ``notice_days`` of ``at`` (now) that have no ``trial_ending`` notice
    yet, and whose product is not bought (``holds_paid``: neither converted nor a trial that
    renews by itself)."""
    now = at or timezone.now()
    until = now + timedelta(days=int(trial_settings()["notice_days"]))
    candidates = (
        Subscription.objects.active(now)
        .filter(trial_end_date__gt=now, trial_end_date__lte=until, customer__isnull=False)
        .exclude(notices__kind=TRIAL_ENDING)
        .select_related("customer", "product")
        .order_by("trial_end_date", "pk")
    )
    out = []
    for sub in candidates[:TRIAL_BATCH]:
        subscriber = sub.customer.subscriber if sub.customer is not None else None
        if (
            sub.product is not None
            and subscriber is not None
            and holds_paid(subscriber, sub.product)
        ):
            continue
        out.append(sub)
    return out


@shared_task(name="billing_integration.notify_trials_ending")  # type: ignore[untyped-decorator]
def notify_trials_ending() -> int:
    """Record a ``trial_ending`` notice ``queued`` for each trial ``trials_to_notify`` finds and
    queue its ``send_trial_notice``; queue again those still ``queued`` after ``SWEEP_AFTER``."""
    if not enabled(TRIAL_ENDING):
        return 0
    pks = []
    for sub in trials_to_notify():
        _, created = Notice.objects.get_or_create(
            subscription=sub, kind=TRIAL_ENDING, defaults={"state": NoticeState.QUEUED}
        )
        if created:
            pks.append(sub.pk)
    cutoff = timezone.now() - SWEEP_AFTER
    stale = Notice.objects.filter(
        kind=TRIAL_ENDING, state=NoticeState.QUEUED, created_at__lt=cutoff
    ).values_list("subscription_id", flat=True)
    pks += [pk for pk in stale[:SWEEP_BATCH] if pk is not None]
    for pk in pks:
        send_trial_notice.apply_async((pk,))
    return len(pks)


@shared_task(bind=True, name="billing_integration.send_trial_notice", acks_late=True)  # type: ignore[untyped-decorator]
def send_trial_notice(self: Any, subscription_pk: int) -> str:
    """Send the ``trial_ending`` notice of subscription ``subscription_pk`` once
    (``_send_subscription_notice``)."""
    if not enabled(TRIAL_ENDING):
        return "off"
    rows = Notice.objects.filter(subscription_id=subscription_pk, kind=TRIAL_ENDING)
    return _send_subscription_notice(self, rows, f"Trial notice of subscription {subscription_pk}")
