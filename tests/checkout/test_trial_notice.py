"""The ``trial_ending`` notice: opt-in, sent once per trial ``TRIALS['notice_days']`` before it
ends, not for a converted trial, in the active language. Trials started over real HTTP."""

from __future__ import annotations

import pytest
from django.core import mail
from django.utils import translation

from billing_integration.checkout.trials import start_trial
from billing_integration.models import Notice, Product, Subscription
from billing_integration.notices.tasks import notify_trials_ending, trials_to_notify

pytestmark = pytest.mark.django_db(transaction=True)

SITE = "https://app.example.com"


@pytest.fixture
def notices_on(settings, eager):
    settings.BILLING = {
        **settings.BILLING,
        "NOTICES": {"trial_ending": True},
        "SITE_URL": SITE,
        "TRIALS": {"notice_days": 3},
    }
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.DEFAULT_FROM_EMAIL = "billing@example.com"
    return settings


@pytest.fixture
def trial_product(product) -> Product:
    Product.objects.filter(pk=product.pk).update(trial_days=14)
    product.refresh_from_db()
    return product


def test_the_trial_ending_notice_is_sent_once(billing_sandbox, notices_on, trial_product, user):
    far = start_trial(user, trial_product, "months-1", "XOF", days=14)
    assert far.remote_id is not None
    assert notify_trials_ending() == 0 and mail.outbox == []  # 14 days away: not yet

    Subscription.objects.all().delete()
    notices_on.BILLING = {**notices_on.BILLING, "TRIALS": {"repeat": True, "notice_days": 3}}
    near = start_trial(user, trial_product, "months-1", "XOF", days=2)
    assert trials_to_notify() == [near]
    assert notify_trials_ending() == 1
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["alice@example.com"]
    assert trial_product.name in message.subject and "ends soon" in message.subject
    assert "Your free trial of Pro plan ends on" in message.body
    assert f"{SITE}/billing/account/" in message.body
    notice = Notice.objects.get()
    assert (notice.subscription, notice.kind, notice.state) == (near, "trial_ending", "sent")
    assert notice.recipient == "alice@example.com" and notice.event is None

    # once per trial: the next runs send nothing
    assert notify_trials_ending() == 0 and notify_trials_ending() == 0
    assert len(mail.outbox) == 1 and Notice.objects.count() == 1


def test_the_notice_is_off_by_default_translated_and_not_sent_for_a_converted_trial(
    billing_sandbox, notices_on, trial_product, user
):
    trial = start_trial(user, trial_product, "months-1", "XOF", days=1)
    notices_on.BILLING = {**notices_on.BILLING, "NOTICES": {}}
    assert notify_trials_ending() == 0 and not Notice.objects.exists()

    notices_on.BILLING = {**notices_on.BILLING, "NOTICES": {"trial_ending": True}}
    with translation.override("fr"):
        assert notify_trials_ending() == 1
    assert "Votre essai gratuit de Pro plan" in mail.outbox[0].subject
    assert "se termine le" in mail.outbox[0].body

    # a trial converted (a paid subscription to the product) gets no notice
    Notice.objects.all().delete()
    paid = Subscription.objects.get(pk=trial.pk)
    paid.pk = None
    paid.remote_id = None
    paid.trial_end_date = None
    from billing_integration.outbox import from_remote

    with from_remote():
        paid.save()
    assert trials_to_notify() == []


def test_a_trial_bought_before_its_notice_went_out_is_not_mailed(
    billing_sandbox, notices_on, trial_product, user
):
    """The notice recorded, its task run later (the sweep's): the customer bought the product
    meanwhile, so no "your trial ends soon" mail; the notice is recorded ``skipped``."""
    from billing_integration.notices.tasks import send_trial_notice
    from billing_integration.outbox import from_remote

    trial = start_trial(user, trial_product, "months-1", "XOF", days=1)
    Notice.objects.create(subscription=trial, kind="trial_ending", state="queued")
    paid = Subscription.objects.get(pk=trial.pk)
    paid.pk, paid.remote_id, paid.trial_end_date = None, None, None
    with from_remote():
        paid.save()

    assert send_trial_notice.delay(trial.pk).get() == "skipped"
    assert mail.outbox == []
    assert Notice.objects.get().error == "Bought since."
