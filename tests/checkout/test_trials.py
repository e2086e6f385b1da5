"""Free trials over real HTTP with the sandbox: started from the trial view (the customer and
the subscription pushed with ``trial_end_date``), used (every access path), converted through
checkout, refused (a second trial, another plan, an unpublished product, unknown cycles, no
trial offered), and ended by the sandbox's clock under both of its guesses (a renewal event, or
a quiet lapse)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from billing_integration.access import on_grace_period, on_trial, subscribed
from billing_integration.checkout.services import AlreadySubscribed, PlanAlreadyHeld
from billing_integration.checkout.trials import (
    TrialAlreadyUsed,
    TrialNotOffered,
    start_trial,
)
from billing_integration.models import (
    CheckoutSession,
    OutboxEntry,
    Product,
    Subscription,
    SyncState,
)
from billing_integration.reporting import metrics
from billing_integration.sync.pull import pull_subscriptions

from .conftest import make_product, push_open_entries

pytestmark = pytest.mark.django_db(transaction=True)

TRIAL = "/billing/trial/"
CHECKOUT = "/billing/checkout/"
RETURN = "/billing/checkout/return/"
ACCOUNT = "/billing/account/"


def offer_trial(product: Product, days: int = 14) -> Product:
    Product.objects.filter(pk=product.pk).update(trial_days=days)  # local only: nothing pushed
    product.refresh_from_db()
    return product


@pytest.fixture
def trial_product(product) -> Product:
    return offer_trial(product)


def post_trial(client, product, **extra):
    data = {"product": product.pk, "cycle": "months-1", "currency": "XOF", **extra}
    return client.post(TRIAL, data)


def error_code(response) -> str:
    match = re.search(r'data-error-code="(\w+)"', response.content.decode())
    assert match, response.content.decode()[:400]
    return match.group(1)


@pytest.fixture
def hooked(billing_sandbox, live_server, eager):
    """The sandbox delivering its events to this test's live server, processed inline."""
    billing_sandbox.set_callback(live_server.url + "/billing/webhooks/")
    return billing_sandbox


def test_a_trial_started_used_and_converted_through_checkout(
    hooked, trial_product, logged_in, user
):
    billing_sandbox = hooked
    # the trial button is offered, then the view starts the trial
    page = logged_in.get(ACCOUNT)
    assert page.status_code == 200
    response = post_trial(logged_in, trial_product)
    assert response.status_code == 302 and response["Location"] == ACCOUNT

    sent = billing_sandbox.requests(operation="create_subscription")
    assert len(sent) == 1
    body = sent[0]["body"]
    assert body["product"] == str(trial_product.remote_id)
    assert body["selected_billing_cycle"] == "months-1" and body["selected_currency"] == "XOF"
    assert body["auto_renew"] is False and body["trial_end_date"].endswith("Z")
    trial = Subscription.objects.get()
    assert trial.remote_id is not None and trial.sync_state == SyncState.SYNCED
    assert trial.status == "published"
    assert trial.customer.subscriber == user and trial.customer.remote_id is not None
    remaining = trial.trial_end_date - timezone.now()
    assert timedelta(days=13, hours=23) < remaining <= timedelta(days=14)
    assert trial.trial_ends_at == trial.trial_end_date
    [remote] = billing_sandbox.objects("subscription")
    assert remote["id"] == str(trial.remote_id) and remote["trial_end_date"] is not None

    # used: every access path says yes, and reporting counts it as a trial
    assert subscribed(user, trial_product) and on_trial(user) and on_trial(user, trial_product)
    assert not on_grace_period(user)
    assert logged_in.get("/members/").status_code == 200
    [api_row] = logged_in.get("/billing/api/subscriptions/?active=1").json()
    assert api_row["is_active"] is True
    [row] = metrics.current_subscriptions(metrics.Period())
    assert (row["active"], row["trialing"], row["mrr"]) == (1, 1, 0)
    html = logged_in.get(ACCOUNT).content.decode()
    assert "Trial ends on" in html and "billing-convert-trial" in html

    # converted: checking out the product held in trial is allowed
    response = logged_in.post(
        CHECKOUT, {"product": trial_product.pk, "cycle": "months-1", "currency": "XOF"}
    )
    assert response.status_code == 302, response.content.decode()[:400]
    session = CheckoutSession.objects.get()
    assert billing_sandbox.complete_checkout(str(session.remote_id)).status_code == 200
    assert (
        'data-outcome="active"'
        in logged_in.get(RETURN, {"session_id": str(session.remote_id)}).content.decode()
    )
    assert Subscription.objects.count() == 2
    assert subscribed(user, trial_product) and not on_trial(user, trial_product)
    html = logged_in.get(ACCOUNT).content.decode()
    assert "billing-convert-trial" not in html
    # a third purchase of the held product is refused as before
    again = logged_in.post(
        CHECKOUT, {"product": trial_product.pk, "cycle": "months-1", "currency": "XOF"}
    )
    assert again.status_code == 409 and error_code(again) == "already_subscribed"
    # and no trial of a product held
    refused = post_trial(logged_in, trial_product)
    assert refused.status_code == 409 and error_code(refused) == "already_subscribed"
    assert len(billing_sandbox.requests(operation="create_subscription")) == 1

    # reporting: the trial, once ended, counts as converted (a payment for its product)
    assert hooked.wait_for_deliveries(timeout=20)
    later = metrics.Period(now=trial.trial_end_date + timedelta(days=1))
    [history] = metrics.trial_history(later)
    assert (history["trials_ended"], history["trials_converted"]) == (1, 1)


def test_a_double_click_starts_one_trial_and_a_second_trial_is_refused(
    billing_sandbox, trial_product, logged_in, user, settings
):
    assert post_trial(logged_in, trial_product).status_code == 302
    assert post_trial(logged_in, trial_product).status_code == 302  # the same trial
    assert Subscription.objects.count() == 1
    assert len(billing_sandbox.requests(operation="create_subscription")) == 1

    # the trial ended (lapsed): a second trial of the product is refused
    Subscription.objects.update(
        trial_end_date=timezone.now() - timedelta(hours=1),
        cycle_end_date=timezone.now() - timedelta(hours=1),
    )
    assert not subscribed(user, trial_product)
    refused = post_trial(logged_in, trial_product)
    assert refused.status_code == 409 and error_code(refused) == "trial_used"
    assert "already had a free trial" in refused.content.decode()
    with pytest.raises(TrialAlreadyUsed):
        start_trial(user, trial_product, "months-1", "XOF")
    assert Subscription.objects.count() == 1
    assert len(billing_sandbox.requests(operation="create_subscription")) == 1

    # unless repeat trials are allowed
    settings.BILLING = {**settings.BILLING, "TRIALS": {"repeat": True}}
    assert post_trial(logged_in, trial_product).status_code == 302
    assert Subscription.objects.count() == 2
    assert len(billing_sandbox.requests(operation="create_subscription")) == 2
    assert on_trial(user, trial_product)


def test_a_trial_of_another_plan_is_refused_like_a_second_checkout(
    billing_sandbox, trial_product, logged_in, user
):
    team = offer_trial(make_product("Team plan"))
    assert post_trial(logged_in, trial_product).status_code == 302
    refused = post_trial(logged_in, team)
    assert refused.status_code == 409 and error_code(refused) == "plan_held"
    with pytest.raises(PlanAlreadyHeld):
        start_trial(user, team, "months-1", "XOF")
    checkout = logged_in.post(CHECKOUT, {"product": team.pk, "cycle": "months-1"})
    assert checkout.status_code == 409 and error_code(checkout) == "plan_held"
    assert len(billing_sandbox.requests(operation="create_subscription")) == 1
    assert not billing_sandbox.requests(operation="create_checkout_session")


def test_trials_refused_for_a_product_not_on_sale_without_cycles_or_without_a_trial(
    billing_sandbox, trial_product, logged_in, user
):
    draft = offer_trial(make_product("Draft plan", status="draft"))
    assert error_code(post_trial(logged_in, draft)) == "product_not_published"
    no_trial = make_product("Plain plan")
    assert error_code(post_trial(logged_in, no_trial)) == "trial_not_offered"
    with pytest.raises(TrialNotOffered):
        start_trial(user, no_trial, "months-1", "XOF")
    unknown = offer_trial(make_product("Pulled plan"))
    Product.objects.filter(pk=unknown.pk).update(blueprint_known=False)
    assert error_code(post_trial(logged_in, unknown)) == "cycles_unknown"
    one_time = offer_trial(make_product("Ebook", one_time=True))
    assert error_code(post_trial(logged_in, one_time)) == "trial_not_offered"
    assert not billing_sandbox.requests(operation="create_subscription")
    assert not Subscription.objects.exists()
    # a paid subscription: no trial of it
    assert post_trial(logged_in, trial_product).status_code == 302
    Subscription.objects.update(trial_end_date=None)
    with pytest.raises(AlreadySubscribed):
        start_trial(user, trial_product, "months-1", "XOF")


def test_an_anonymous_trial_goes_to_the_login_page(client, trial_product):
    response = client.post(TRIAL, {"product": trial_product.pk}, HTTP_REFERER="/pricing/")
    assert response.status_code == 302 and "login" in response["Location"]
    assert "next=/pricing/" in response["Location"]  # back to the click's page, not a 405
    assert not Subscription.objects.exists()


def test_without_a_person_waiting_the_outbox_pushes_the_trial(
    billing_sandbox, trial_product, user, recorded_enqueues
):
    trial = start_trial(user, trial_product, "months-1", "XOF", days=7, wait=False)
    assert trial.remote_id is None and trial.sync_state == SyncState.PENDING
    assert not billing_sandbox.requests(operation="create_subscription")
    assert not subscribed(user, trial_product)  # not confirmed by the service yet
    entries = list(OutboxEntry.objects.open())
    assert recorded_enqueues  # queued on commit
    from billing_integration.outbox.push import push_entry

    for entry in entries:
        push_entry(entry.pk)
    for entry in OutboxEntry.objects.open():
        push_entry(entry.pk)
    trial.refresh_from_db()
    assert trial.remote_id is not None and on_trial(user, trial_product)
    body = billing_sandbox.requests(operation="create_subscription")[0]["body"]
    assert body["auto_renew"] is False


def test_a_trial_whose_push_failed_in_doubt_is_not_started_again_with_another_key(
    billing_sandbox, trial_product, user, monkeypatch
):
    """The trial's create is applied but its answer lost, and its outbox entry fails in doubt
    (its attempts used up): starting the trial again finds that trial, nothing is sent with
    another key, and staff's retry (same key) gets the service's one trial."""
    from billing_integration.outbox import push
    from billing_integration.outbox.retry import retry_failed

    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    monkeypatch.setattr(push, "MAX_ATTEMPTS", 1)
    billing_sandbox.faults(operation="create_subscription", lose_first_answer=True)
    first = start_trial(user, trial_product, "months-1", "XOF")
    first.refresh_from_db()
    assert first.remote_id is None and first.sync_state == SyncState.FAILED
    assert len(billing_sandbox.objects("subscription")) == 1  # applied, answer lost

    again = start_trial(user, trial_product, "months-1", "XOF")
    assert again.pk == first.pk and Subscription.objects.count() == 1
    with pytest.raises(TrialAlreadyUsed):
        Subscription.objects.update(trial_end_date=timezone.now() - timedelta(hours=1))
        start_trial(user, trial_product, "months-1", "XOF")
    calls = billing_sandbox.requests(operation="create_subscription")
    keys = {c["headers"]["x-idempotency-id"] for c in calls}
    assert keys == {str(OutboxEntry.objects.for_object(first).get().idempotency_key)}

    assert retry_failed() == 1
    assert push.push_entry(OutboxEntry.objects.for_object(first).get().pk).status == "done"
    (remote,) = billing_sandbox.objects("subscription")
    first.refresh_from_db()
    assert str(first.remote_id) == remote["id"]


def test_a_trial_the_service_refused_does_not_hold_back_the_next_start(
    billing_sandbox, trial_product, user
):
    """A refusal (4xx, nothing created) is no trial had: the next start is a new trial, pushed
    with a new key."""
    from billing_integration.checkout.services import CheckoutRefused

    billing_sandbox.faults(operation="create_subscription", status=400, count=1)
    with pytest.raises(CheckoutRefused):
        start_trial(user, trial_product, "months-1", "XOF")
    assert not billing_sandbox.objects("subscription")

    trial = start_trial(user, trial_product, "months-1", "XOF")
    (remote,) = billing_sandbox.objects("subscription")
    assert str(trial.remote_id) == remote["id"] and Subscription.objects.count() == 2
    calls = billing_sandbox.requests(operation="create_subscription")
    assert len({c["headers"]["x-idempotency-id"] for c in calls}) == 2


@pytest.mark.parametrize("auto_renew", [True, False])
def test_a_trial_ended_by_the_sandbox_clock_renews_or_cancels(
    hooked, trial_product, user, auto_renew
):
    """The sandbox's default guess: at the trial's end the first period is billed
    (``subscription.renewal``), or, with ``auto_renew`` false, the subscription is canceled."""
    trial = start_trial(user, trial_product, "months-1", "XOF", days=14, auto_renew=auto_renew)
    trial_end = trial.trial_end_date
    summary = hooked.advance(days=15)
    assert hooked.wait_for_deliveries(timeout=20)
    trial.refresh_from_db()
    after = trial_end + timedelta(days=1)
    if auto_renew:
        assert summary["renewals"] == 1
        assert hooked.events("subscription.renewal")
        assert trial.status == "published" and trial.cycle_end_date > after
        assert Subscription.objects.active(after).filter(pk=trial.pk).exists()
        assert trial.payments.filter(status="completed").exists()
    else:
        assert summary["canceled"] == 1 and hooked.events("subscription.canceled")
        assert trial.status == "canceled"
        assert not Subscription.objects.active(after).exists()
    assert not hooked.events("payment.failed")


def test_a_trial_that_lapses_in_the_sandbox_ends_access_without_an_event(
    billing_sandbox, trial_product, user
):
    """The other guess (sandbox config ``trial_end="lapse"``): no event; access ends with the
    trial's dates, and a pull brings the ``expired`` status."""
    billing_sandbox.config(trial_end="lapse")
    trial = start_trial(user, trial_product, "months-1", "XOF", days=14, auto_renew=True)
    after = trial.trial_end_date + timedelta(days=1)
    summary = billing_sandbox.advance(days=15)
    assert summary["lapsed_trials"] == 1 and summary["renewals"] == 0
    assert not billing_sandbox.events()
    trial.refresh_from_db()
    assert trial.status == "published"  # nothing told the app: the dates end the access
    assert not Subscription.objects.active(after).exists()
    pull_subscriptions(trial.customer)
    trial.refresh_from_db()
    assert trial.status == "expired" and not trial.is_active and trial.trial_ends_at is None
    assert not subscribed(user) and not on_trial(user)
    assert not billing_sandbox.objects("payment")


def test_a_trial_of_another_plan_is_refused_while_the_first_is_not_confirmed_yet(
    billing_sandbox, trial_product, user, recorded_enqueues
):
    """The first trial not pushed yet (the outbox finishes it, or a request at the same
    moment) has no status: it is a plan all the same, and a trial of another plan is refused."""
    team = offer_trial(make_product("Team plan"))
    first = start_trial(user, trial_product, "months-1", "XOF", wait=False)
    assert first.remote_id is None and first.status == ""
    with pytest.raises(PlanAlreadyHeld):
        start_trial(user, team, "months-1", "XOF", wait=False)
    assert list(Subscription.objects.values_list("product", flat=True)) == [trial_product.pk]


def test_a_trial_that_renews_by_itself_is_not_bought_again(
    billing_sandbox, trial_product, logged_in, user
):
    """A trial started with ``auto_renew`` bills its first period at its end by itself: a
    checkout of its product beside it would be billed too. The billing page offers no
    "Subscribe now" for it, and a checkout of the product is refused as a product held."""
    trial = start_trial(user, trial_product, "months-1", "XOF", auto_renew=True)
    assert trial.remote_id is not None and on_trial(user, trial_product)

    html = logged_in.get(ACCOUNT).content.decode()
    assert "Trial ends on" in html and "billing-convert-trial" not in html
    response = logged_in.post(
        CHECKOUT, {"product": trial_product.pk, "cycle": "months-1", "currency": "XOF"}
    )
    assert response.status_code == 409 and error_code(response) == "already_subscribed"
    assert billing_sandbox.requests(operation="create_checkout_session") == []
    assert not CheckoutSession.objects.exists()


def test_a_trial_that_renews_by_itself_not_confirmed_yet_is_not_bought_again(
    billing_sandbox, trial_product, logged_in, user
):
    """The same while the trial's push is left to the outbox (no status yet): the trial will
    bill its first period once pushed, so the checkout is refused before anything is sent."""
    trial = start_trial(user, trial_product, "months-1", "XOF", auto_renew=True, wait=False)
    assert trial.remote_id is None and trial.status == ""

    response = logged_in.post(
        CHECKOUT, {"product": trial_product.pk, "cycle": "months-1", "currency": "XOF"}
    )
    assert response.status_code == 409 and error_code(response) == "already_subscribed"
    assert billing_sandbox.requests(operation="create_checkout_session") == []
    assert not CheckoutSession.objects.exists()


def test_a_trial_converted_by_checkout_cannot_be_resumed(
    billing_sandbox, trial_product, logged_in, user, settings
):
    """A trial (``auto_renew`` off) converted by a checkout of its product: resuming the trial
    would bill it beside the paid subscription. No Resume on the page; refused (409)."""
    billing_sandbox.config(patch_subscriptions=True)
    settings.BILLING = {**settings.BILLING, "GUESSES": {"patch_auto_renew": True}}
    trial = start_trial(user, trial_product, "months-1", "XOF")
    response = logged_in.post(
        CHECKOUT, {"product": trial_product.pk, "cycle": "months-1", "currency": "XOF"}
    )
    assert response.status_code == 302
    session = CheckoutSession.objects.get()
    assert billing_sandbox.complete_checkout(str(session.remote_id)).status_code == 200
    logged_in.get(RETURN, {"session_id": str(session.remote_id)})
    assert Subscription.objects.filter(auto_renew=True, product=trial_product).count() == 1

    html = logged_in.get(ACCOUNT).content.decode()
    assert f'action="/billing/account/subscriptions/{trial.pk}/resume/"' not in html
    response = logged_in.post(f"/billing/account/subscriptions/{trial.pk}/resume/")
    assert response.status_code == 409
    assert billing_sandbox.requests(operation="update_subscription") == []


@pytest.mark.parametrize("status", ["canceled", "expired", "ended"])
def test_a_trial_closed_before_its_end_is_not_the_trial_a_new_start_finds(
    billing_sandbox, trial_product, logged_in, user, settings, status
):
    """A trial the service closed before its ``trial_end_date`` (canceled, expired, ended) is
    no double click's trial to return: a new start is refused as a second trial, or with
    repeat trials allowed, starts a new one."""
    assert post_trial(logged_in, trial_product).status_code == 302
    Subscription.objects.update(status=status)

    refused = post_trial(logged_in, trial_product)
    assert refused.status_code == 409 and error_code(refused) == "trial_used"

    settings.BILLING = {**settings.BILLING, "TRIALS": {"repeat": True}}
    trial = start_trial(user, trial_product, "months-1", "XOF")
    assert not getattr(trial, "reused", False) and trial.remote_id is not None
    assert Subscription.objects.count() == 2
    assert len(billing_sandbox.requests(operation="create_subscription")) == 2


def test_trials_the_service_refuses_are_capped_per_customer_and_day(
    billing_sandbox, trial_product, logged_in, user, other_user
):
    """The product archived on the service, not yet pulled here: each start is sent and refused,
    and leaves a failed trial and its outbox entry. Past ``MAX_REFUSED_TRIALS_PER_DAY`` refusals
    in 24 hours the customer is refused here (429): nothing more is sent or stored. Another
    customer is not held back; refusals older than 24 hours no longer count."""
    from billing_integration.checkout.trials import MAX_REFUSED_TRIALS_PER_DAY

    trial_product.archive()
    push_open_entries()
    seen = {**trial_product.remote_data, "status": "published"}
    Product.objects.filter(pk=trial_product.pk).update(status="published", remote_data=seen)
    entries = OutboxEntry.objects.count()
    for _ in range(MAX_REFUSED_TRIALS_PER_DAY):
        refused = post_trial(logged_in, trial_product)
        assert refused.status_code == 409 and error_code(refused) == "product_archived"
    sent = len(billing_sandbox.requests())
    assert len(billing_sandbox.requests(operation="create_subscription")) == (
        MAX_REFUSED_TRIALS_PER_DAY
    )

    capped = post_trial(logged_in, trial_product)
    assert capped.status_code == 429 and error_code(capped) == "too_many_trials"
    assert "too many free trials" in capped.content.decode()
    assert post_trial(logged_in, trial_product).status_code == 429
    assert len(billing_sandbox.requests()) == sent, "nothing more sent to the service"
    trials = Subscription.objects.filter(trial_end_date__isnull=False)
    assert trials.count() == MAX_REFUSED_TRIALS_PER_DAY
    # one entry per refused trial, and the customer's
    assert OutboxEntry.objects.count() == entries + MAX_REFUSED_TRIALS_PER_DAY + 1

    # another customer still reaches the service (and is refused by it)
    logged_in.force_login(other_user)
    assert error_code(post_trial(logged_in, trial_product)) == "product_archived"
    assert len(billing_sandbox.requests(operation="create_subscription")) == (
        MAX_REFUSED_TRIALS_PER_DAY + 1
    )
    # a day later the first customer's refusals no longer count
    trials.update(created_at=timezone.now() - timedelta(days=1, minutes=1))
    logged_in.force_login(user)
    assert error_code(post_trial(logged_in, trial_product)) == "product_archived"
