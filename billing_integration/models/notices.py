"""The record of each notice email: one row per (event, kind), per (change, kind) and per
trial, claimed before sending."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from .events import WebhookEvent
from .subscriptions import Subscription

__all__ = ["Notice", "NoticeKind", "NoticeState"]


class NoticeKind(models.TextChoices):
    PAYMENT_FAILED = "payment_failed", _("Payment failed")
    SUBSCRIPTION_CANCELED = "subscription_canceled", _("Subscription canceled")
    SUBSCRIPTION_PAUSED = "subscription_paused", _("Subscription paused")
    REFUND_APPROVED = "refund_approved", _("Refund approved")
    TRIAL_ENDING = "trial_ending", _("Trial ending")


class NoticeState(models.TextChoices):
    #: Recorded with the event; its task, or the sweep, claims it for sending.
    QUEUED = "queued", _("Queued")
    #: Claimed by a task (one that died while sending: never sent again).
    SENDING = "sending", _("Sending")
    SENT = "sent", _("Sent")
    #: The last attempt failed; the task retries it, ``MAX_ATTEMPTS`` in all (none after an
    #: address the mail server refused for good).
    FAILED = "failed", _("Failed")
    #: Nothing to send: no address, no local object, or superseded before it went out (a
    #: payment completed, a subscription active again, a trial bought).
    SKIPPED = "skipped", _("Skipped")


class Notice(models.Model):
    """One notice email about one event (or one subscription: the trial ending)."""

    #: Kept (as NULL) when the event log is pruned: the record of what was sent stays.
    event = models.ForeignKey(
        WebhookEvent,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="notices",
        verbose_name=_("event"),
    )
    #: The subscription of a notice no event sends: ``trial_ending`` (one per trial), or a
    #: cancellation or pause a pull found.
    subscription = models.ForeignKey(
        Subscription,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="notices",
        verbose_name=_("subscription"),
    )
    kind = models.CharField(_("kind"), max_length=32, choices=NoticeKind.choices)
    #: The change (``<object id>@<its date_updated>``) of an event or a pulled row dated by the
    #: service: the same change sent again under another event id, or found by a pull, gets no
    #: second notice. Empty for a change without that date (a notice is then recorded only when
    #: the object moved into the state it tells of) and for a trial notice.
    change = models.CharField(_("change"), max_length=100, blank=True, default="")
    recipient = models.CharField(_("recipient"), max_length=254, blank=True, default="")
    state = models.CharField(
        _("state"), max_length=16, choices=NoticeState.choices, default=NoticeState.SENDING
    )
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    sent_at = models.DateTimeField(_("sent at"), null=True, blank=True)
    error = models.TextField(_("error"), blank=True, default="")

    class Meta:
        verbose_name = _("notice")
        verbose_name_plural = _("notices")
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.UniqueConstraint(fields=["event", "kind"], name="billing_notice_once"),
            models.UniqueConstraint(
                fields=["change", "kind"],
                condition=~models.Q(change=""),
                name="billing_notice_once_per_change",
            ),
            # One trial notice per trial; a pull may find one subscription canceled twice.
            models.UniqueConstraint(
                fields=["subscription", "kind"],
                condition=models.Q(subscription__isnull=False, kind="trial_ending"),
                name="billing_notice_once_per_trial",
            ),
        ]
        indexes = [
            models.Index(
                fields=["created_at"],
                condition=models.Q(state="queued"),
                name="billing_notice_queued",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} → {self.recipient or '-'} ({self.state})"
