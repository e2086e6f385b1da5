"""Change plan, stop renewal and resume, over real HTTP with the sandbox, in both modes: the
guesses on (the sandbox switched to accept them) and the request to staff (the default, and
the fallback when the service refuses a guess). Done is shown only once a pull shows it."""

from __future__ import annotations

import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core import mail
from django.core.management import call_command
from django.utils import timezone

from billing_integration.access import subscribed
from billing_integration.checkout.changes import (
    NoPlanToChange,
    RenewalUnchanged,
    SamePlan,
    cancel_at_period_end,
    change_plan,
    doubled_plans,
    probe_change_action,
    probe_patch_subscription,
    resume,
    settle,
)
from billing_integration.checkout.services import (
    CheckoutInProgress,
    PlanAlreadyHeld,
    ServiceUnavailable,
    start_checkout,
)
from billing_integration.health import diagnose
from billing_integration.models import (
    ChangeRequest,
    ChangeState,
    ChangeVia,
    CheckoutSession,
    Customer,
    Payment,
    Price,
    Product,
    Subscription,
    SwitchedOffGuess,
)
from billing_integration.sync.pull import pull_subscriptions

from .conftest import first_save_fails, make_product, push_open_entries
from .test_one_purchase import RETURN, button, hold, post

pytestmark = pytest.mark.django_db(transaction=True)

ON = {"change_plan_action": "upgrade", "patch_auto_renew": True}


@pytest.fixture
def plans(billing_sandbox, transactional_db) -> tuple[Product, Product]:
    basic = make_product("Basic")
    pro = make_product("Pro", push=False)
    # Pro costs more a month than Basic in XOF (10000 a month), before it is sent
    Price.objects.filter(cycle__product=pro, currency_id=1, cycle__unit="months").update(
        amount=20000
    )
    push_open_entries()
    pro.refresh_from_db()
    return basic, pro


@pytest.fixture
def staff(settings):
    settings.MANAGERS = [("Staff", "staff@example.com")]
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


def guesses(settings, **values):
    settings.BILLING = {**settings.BILLING, "GUESSES": values}


def subscribe(sandbox, client, user, product, cycle="months-1") -> Subscription:
    """Check out ``product`` through the view, pay on the hosted page, come back."""
    assert post(client, product, cycle=cycle).status_code == 302
    session = CheckoutSession.objects.order_by("-pk").first()
    assert sandbox.complete_checkout(str(session.remote_id)).status_code == 200
    client.get(RETURN, {"session_id": str(session.remote_id)})
    return Subscription.objects.get(product=product, customer__subscriber=user)


def pull(user) -> None:
    customer = Customer.objects.get(subscriber=user)
    pull_subscriptions(customer)
    settle(customer)


def renewing(sandbox) -> list[dict]:
    return [
        s for s in sandbox.objects("subscription") if s["status"] == "published" and s["auto_renew"]
    ]


def renewals(sandbox) -> list[dict]:
    """Completed payments that were renewals (an invoice after the first of its subscription)."""
    return [p for p in sandbox.objects("payment") if p["status"] == "completed"]


# --- change of plan ------------------------------------------------------------------------
def test_change_through_the_guessed_checkout_leaves_one_plan_renewing(
    billing_sandbox, plans, logged_in, user, settings, staff
):
    basic, pro = plans
    billing_sandbox.config(change_actions=["upgrade"])
    guesses(settings, **ON)
    old = subscribe(billing_sandbox, logged_in, user, basic)

    request = change_plan(user, pro, "months-1", "XOF")

    assert request.via == ChangeVia.CHECKOUT and request.direction == "upgrade"
    assert request.checkout_url and request.checkout_url.endswith(
        str(request.checkout_session.remote_id)
    )
    [call] = billing_sandbox.requests(operation="create_checkout_session")[-1:]
    assert call["body"]["action"] == "upgrade"
    assert call["body"]["upgrade_to"] == str(old.remote_id)  # the held subscription's id
    assert "downgrade_to" not in call["body"]
    assert mail.outbox == []  # no staff needed
    # not done until the service shows it
    pull(user)
    request.refresh_from_db()
    assert request.state == ChangeState.PENDING

    billing_sandbox.complete_checkout(str(request.checkout_session.remote_id))
    pull(user)
    request.refresh_from_db()
    assert request.state == ChangeState.CONFIRMED
    assert request.new_subscription.product == pro
    old.refresh_from_db()
    assert old.auto_renew is False and old.is_active  # paid period runs to its end

    summary = billing_sandbox.advance(days=32)
    assert summary["renewals"] == 1 and summary["canceled"] == 1
    assert [s["product"] for s in renewing(billing_sandbox)] == [str(pro.remote_id)]
    paid = renewals(billing_sandbox)
    # Basic's first month, Pro's first month, one renewal (Pro) for the next period
    assert sorted(p["product"] for p in paid) == sorted(
        [str(basic.remote_id), str(pro.remote_id), str(pro.remote_id)]
    )
    pull(user)
    assert not doubled_plans()


def test_a_second_change_waits_for_the_first_changes_open_page(
    billing_sandbox, plans, logged_in, user, settings
):
    """The first change's hosted page is open: a change to another option is refused
    (both pages could be paid), the same change again finds the first one."""
    basic, pro = plans
    billing_sandbox.config(change_actions=["upgrade", "downgrade"])
    guesses(settings, **ON)
    subscribe(billing_sandbox, logged_in, user, basic)  # its session paid: not in the way
    first = change_plan(user, pro, "months-1", "XOF")

    with pytest.raises(CheckoutInProgress) as info:
        change_plan(user, pro, "years-1", "XOF")
    assert info.value.session == first.checkout_session
    assert change_plan(user, pro, "months-1", "XOF").pk == first.pk
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 2
    assert ChangeRequest.objects.get().state == ChangeState.PENDING

    CheckoutSession.objects.filter(pk=first.checkout_session.pk).update(expires_at=timezone.now())
    assert change_plan(user, pro, "years-1", "XOF").via == ChangeVia.CHECKOUT


@pytest.mark.parametrize("second_cycle", ["months-1", "years-1"])
def test_two_simultaneous_changes_make_one_hosted_page(
    billing_sandbox, plans, logged_in, user, settings, second_cycle
):
    """Two change requests at the same moment (a double click, or two options in two tabs):
    one hosted page. The same option finds the first request; another is refused while the
    first page is open. The sandbox's latency keeps both requests in flight together."""
    import threading

    from django.db import connection

    basic, pro = plans
    billing_sandbox.config(change_actions=["upgrade", "downgrade"])
    guesses(settings, **ON)
    subscribe(billing_sandbox, logged_in, user, basic)
    billing_sandbox.faults(operation="create_checkout_session", latency=0.5)
    barrier = threading.Barrier(2)
    started: list[float] = []
    results: list[object] = []

    def ask(cycle: str) -> None:
        try:
            barrier.wait()
            started.append(time.monotonic())
            results.append(change_plan(user, pro, cycle, "XOF"))
        except CheckoutInProgress as exc:
            results.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=ask, args=(c,)) for c in ("months-1", second_cycle)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 2 and max(started) - min(started) < 0.4  # both asked together
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 2  # 1 + Basic
    assert ChangeRequest.objects.filter(state=ChangeState.PENDING).count() == 1
    if second_cycle == "months-1":
        assert results[0].pk == results[1].pk
    else:
        assert sum(isinstance(r, CheckoutInProgress) for r in results) == 1


def test_a_change_whose_session_answer_was_lost_is_asked_again_with_the_same_key(
    billing_sandbox, plans, logged_in, user, settings, monkeypatch
):
    basic, pro = plans
    billing_sandbox.config(change_actions=["upgrade"])
    guesses(settings, **ON)
    subscribe(billing_sandbox, logged_in, user, basic)
    before = len(billing_sandbox.objects("checkout_session"))
    billing_sandbox.clear_requests()
    monkeypatch.setattr("billing_integration.client.retry.MAX_RETRIES", 0)
    billing_sandbox.faults(operation="create_checkout_session", lose_first_answer=True)
    with pytest.raises(ServiceUnavailable):
        change_plan(user, pro, "months-1", "XOF")
    assert not ChangeRequest.objects.exists()

    request = change_plan(user, pro, "months-1", "XOF")
    assert request.via == ChangeVia.CHECKOUT
    assert len(billing_sandbox.objects("checkout_session")) == before + 1
    first, second = billing_sandbox.requests(operation="create_checkout_session")
    assert first["outcome"] == "answer_lost" and first["body"] == second["body"]
    assert first["headers"]["x-idempotency-id"] == second["headers"]["x-idempotency-id"]


def test_simultaneous_stops_of_renewal_make_one_request_and_one_patch(
    billing_sandbox, plans, logged_in, user, settings
):
    """Stops of renewal at the same moment (a double click, a burst of POSTs): one PATCH, one
    request. The sandbox's latency keeps the first PATCH in flight while the others arrive."""
    import threading

    from django.db import connection

    basic, _pro = plans
    billing_sandbox.config(patch_subscriptions=True)
    guesses(settings, patch_auto_renew=True)
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    billing_sandbox.clear_requests()
    billing_sandbox.faults(operation="update_subscription", latency=0.5)
    barrier = threading.Barrier(4)
    results: list[object] = []

    def ask() -> None:
        try:
            barrier.wait()
            results.append(cancel_at_period_end(Subscription.objects.get(pk=sub.pk)))
        except Exception as exc:
            results.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 4 and all(isinstance(r, ChangeRequest) for r in results), results
    assert len({r.pk for r in results}) == 1  # type: ignore[attr-defined]
    assert len(billing_sandbox.requests(operation="update_subscription")) == 1
    assert ChangeRequest.objects.count() == 1


def test_change_as_a_request_to_staff_done_by_hand_on_the_service(
    billing_sandbox, plans, logged_in, user, staff
):
    basic, pro = plans
    old = subscribe(billing_sandbox, logged_in, user, basic)
    billing_sandbox.clear_requests()

    request = change_plan(user, pro, "months-1", "XOF")

    assert request.via == ChangeVia.REQUEST and request.checkout_url is None
    assert billing_sandbox.requests() == []  # nothing asked of the service
    [email] = mail.outbox
    assert email.to == ["staff@example.com"] and "Change plan requested" in email.subject
    assert str(old.remote_id) in email.body and "Pro" in email.body
    # asked again: the same request, no second email
    assert change_plan(user, pro, "months-1", "XOF").pk == request.pk
    assert len(mail.outbox) == 1
    # the billing page says it is asked for, not done
    page = logged_in.get("/billing/account/").content.decode()
    assert "Change to Pro requested" in page

    # staff apply it on the service (the sandbox dashboard's form does the same)
    billing_sandbox._post(
        f"/_sandbox/subscriptions/{old.remote_id}/apply",
        {"product": str(pro.remote_id), "selected_billing_cycle": "months-1"},
    )
    pull(user)
    request.refresh_from_db()
    assert request.state == ChangeState.CONFIRMED and request.new_subscription_id == old.pk

    summary = billing_sandbox.advance(days=32)
    assert summary["renewals"] == 1
    assert len(renewing(billing_sandbox)) == 1
    paid = renewals(billing_sandbox)
    assert [p["product"] for p in paid] == [str(basic.remote_id), str(pro.remote_id)]
    assert paid[1]["amount"] == 20000  # the renewal is billed at Pro's price


def test_change_of_cycle_on_the_same_product(billing_sandbox, plans, logged_in, user, settings):
    basic, _pro = plans
    billing_sandbox.config(change_actions=["upgrade", "downgrade"])
    guesses(settings, change_plan_action="downgrade", change_plan_target="product")
    old = subscribe(billing_sandbox, logged_in, user, basic)

    with pytest.raises(SamePlan):
        change_plan(user, basic, "months-1", "XOF")
    request = change_plan(user, basic, "years-1", "XOF")

    # 100000 a year is less a month than 10000 a month
    assert request.direction == "downgrade" and request.via == ChangeVia.CHECKOUT
    call = billing_sandbox.requests(operation="create_checkout_session")[-1]
    assert call["body"]["downgrade_to"] == str(basic.remote_id)  # the product's id
    assert call["body"]["selected_billing_cycle"] == "years-1"
    billing_sandbox.complete_checkout(str(request.checkout_session.remote_id))
    pull(user)
    request.refresh_from_db()
    assert request.state == ChangeState.CONFIRMED
    assert request.new_subscription.selected_billing_cycle == "years-1"
    old.refresh_from_db()
    assert old.auto_renew is False

    summary = billing_sandbox.advance(days=32)
    assert summary["renewals"] == 0 and summary["canceled"] == 1  # the month ends, the year runs
    assert [s["selected_billing_cycle"] for s in renewing(billing_sandbox)] == ["years-1"]


def test_a_change_moves_the_live_plan_not_a_canceled_one_in_its_grace_period(
    billing_sandbox, plans, logged_in, user, staff
):
    basic, pro = plans
    # Pro canceled (access until its period ends), then Basic bought beside it (allowed)
    hold(user, pro, status="canceled", auto_renew=False)
    live = hold(user, basic)
    assert "billing-change-form" in button(pro, user, cycle="months-1", currency="XOF")

    response = logged_in.post(
        "/billing/account/change-plan/", {"product": pro.pk, "cycle": "months-1", "currency": "XOF"}
    )

    assert response.status_code == 302, response.content.decode()[:400]
    [request] = ChangeRequest.objects.all()
    assert request.subscription == live  # the plan that renews, so it stops renewing
    assert request.target_product == pro and request.direction == "upgrade"
    # with no live plan at all, the canceled one is no plan to change: buy Pro instead
    Subscription.objects.filter(pk=live.pk).delete()
    with pytest.raises(NoPlanToChange):
        change_plan(user, pro, "years-1", "XOF")


def test_a_plan_held_in_a_currency_not_configured_can_be_changed(
    billing_sandbox, plans, logged_in, user, staff
):
    basic, _pro = plans
    # The service's currency is stored as received when BILLING["CURRENCIES"] lacks it.
    held = hold(user, basic, selected_currency="USD")
    asked = change_plan(user, basic, "months-1", "XOF")  # the currency of the plan held
    Subscription.objects.filter(pk=held.pk).update(selected_currency="ZZZ")

    assert logged_in.get("/billing/account/").status_code == 200  # settles, nothing done
    asked.refresh_from_db()
    assert asked.state == ChangeState.PENDING
    request = change_plan(user, basic, "months-1", "XOF")  # not a CheckoutError: a request
    assert request.state == ChangeState.PENDING and request.via == ChangeVia.REQUEST
    assert request.subscription == held and request.target_currency == "XOF"


def test_a_plan_held_in_a_cycle_with_a_non_ascii_digit_can_be_changed(
    billing_sandbox, plans, logged_in, user, staff
):
    """A service cycle "months-²": "²" passes ``str.isdigit()`` but not ``int()``; the
    held plan's price is unknown, so the change is asked of staff instead of failing."""
    basic, pro = plans
    hold(user, basic, selected_billing_cycle="months-\u00b2")
    request = change_plan(user, pro, "months-1", "XOF")
    assert request.state == ChangeState.PENDING and request.target_product == pro


def test_no_plan_to_change(billing_sandbox, plans, user):
    with pytest.raises(NoPlanToChange):
        change_plan(user, plans[1], "months-1", "XOF")


# --- refused guesses -----------------------------------------------------------------------
def test_a_refused_checkout_action_falls_back_to_staff_and_shows_in_the_doctor(
    billing_sandbox, plans, logged_in, user, settings, staff
):
    basic, pro = plans
    guesses(settings, change_plan_action="upgrade")  # the sandbox refuses it, as by default
    subscribe(billing_sandbox, logged_in, user, basic)
    sent = len(billing_sandbox.requests(operation="create_checkout_session"))

    request = change_plan(user, pro, "months-1", "XOF")

    calls = billing_sandbox.requests(operation="create_checkout_session")
    assert len(calls) == sent + 1 and calls[-1]["status"] == 400
    assert request.via == ChangeVia.REQUEST and len(mail.outbox) == 1
    off = SwitchedOffGuess.objects.get()
    assert (off.name, off.status) == ("change_plan_action", 400)
    # never retried: the next change goes straight to staff
    request.state = ChangeState.WITHDRAWN
    request.save()
    change_plan(user, pro, "years-1", "XOF")
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == sent + 1

    out = StringIO()
    call_command("billing_doctor", "--skip", "broker", "workers", "beat", "pull", stdout=out)
    text = out.getvalue()
    assert "WARN guesses: switched off: change_plan_action (HTTP 400" in text


def test_a_refused_patch_falls_back_to_staff(
    billing_sandbox, plans, logged_in, user, settings, staff
):
    basic, _pro = plans
    guesses(settings, patch_auto_renew=True)  # the sandbox has no PATCH, as by default
    sub = subscribe(billing_sandbox, logged_in, user, basic)

    request = cancel_at_period_end(sub)

    [call] = billing_sandbox.requests(operation="update_subscription")
    assert call["status"] == 404 and call["body"] == {"auto_renew": False}
    assert request.via == ChangeVia.REQUEST and len(mail.outbox) == 1
    assert SwitchedOffGuess.objects.filter(name="patch_auto_renew", status=404).exists()
    fact = next(
        f
        for f in diagnose(skip=("token", "broker", "workers", "beat", "pull")).facts
        if f.key == "guesses"
    )
    assert fact.status == "warning" and "patch_auto_renew" in fact.summary
    # a resume asked next goes to staff at once
    request.state = ChangeState.WITHDRAWN
    request.save()
    assert cancel_at_period_end(sub).via == ChangeVia.REQUEST
    assert len(billing_sandbox.requests(operation="update_subscription")) == 1


# --- stop renewal and resume ---------------------------------------------------------------
def test_cancel_at_period_end_with_patch_then_access_stops(
    billing_sandbox, plans, logged_in, user, settings
):
    basic, _pro = plans
    billing_sandbox.config(patch_subscriptions=True)
    guesses(settings, patch_auto_renew=True)
    sub = subscribe(billing_sandbox, logged_in, user, basic)

    request = cancel_at_period_end(sub)

    assert request.via == ChangeVia.PATCH and request.state == ChangeState.PENDING
    [call] = billing_sandbox.requests(operation="update_subscription")
    assert call["status"] == 200
    page = logged_in.get("/billing/account/").content.decode()
    assert "Stop of renewal requested" in page
    pull(user)
    request.refresh_from_db()
    sub.refresh_from_db()
    assert request.state == ChangeState.CONFIRMED and sub.auto_renew is False
    page = logged_in.get("/billing/account/").content.decode()
    assert "Ends on" in page and 'class="billing-resume"' in page
    assert subscribed(user, basic)  # access lasts until the period end

    billing_sandbox.advance(days=32)
    pull(user)
    sub.refresh_from_db()
    assert billing_sandbox.objects("subscription")[0]["status"] == sub.status == "canceled"
    # Access lasts until the period end (ACCESS_AFTER_CANCEL "period_end"), then stops: judged
    # at the sandbox clock's side of the end, as this process's clock did not move.
    held = Subscription.objects.for_subscriber(user).filter(pk=sub.pk)
    assert held.active(sub.cycle_end_date - timedelta(seconds=1)).exists()
    assert not held.active(sub.cycle_end_date + timedelta(seconds=1)).exists()
    settings.BILLING = {**settings.BILLING, "ACCESS_AFTER_CANCEL": "immediately"}
    assert not subscribed(user, basic)


def test_resume_before_the_end_renews(billing_sandbox, plans, logged_in, user, settings):
    basic, _pro = plans
    billing_sandbox.config(patch_subscriptions=True)
    guesses(settings, patch_auto_renew=True)
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    cancel_at_period_end(sub)
    pull(user)

    request = resume(sub)

    assert request.via == ChangeVia.PATCH
    assert billing_sandbox.requests(operation="update_subscription")[-1]["body"] == {
        "auto_renew": True
    }
    pull(user)
    request.refresh_from_db()
    assert request.state == ChangeState.CONFIRMED
    assert "Renews on" in logged_in.get("/billing/account/").content.decode()
    assert billing_sandbox.advance(days=32)["renewals"] == 1
    pull(user)
    assert subscribed(user, basic)


def test_changing_back_and_forth_is_capped_per_customer(
    billing_sandbox, plans, logged_in, user, staff
):
    """A customer who goes round other options makes a new request (and a staff email) each
    time: after MAX_REQUESTS_PER_DAY in 24 hours the change view answers 429, with nothing
    recorded, emailed or sent."""
    from billing_integration.checkout.changes import MAX_REQUESTS_PER_DAY

    basic, pro = plans
    subscribe(billing_sandbox, logged_in, user, basic)
    billing_sandbox.clear_requests()
    options = [(pro, "months-1"), (pro, "years-1"), (basic, "years-1")]

    def ask(option):
        product, cycle = option
        data = {"product": product.pk, "cycle": cycle, "currency": "XOF"}
        return logged_in.post("/billing/account/change-plan/", data)

    statuses = [ask(options[i % 3]).status_code for i in range(MAX_REQUESTS_PER_DAY)]
    assert statuses == [302] * MAX_REQUESTS_PER_DAY
    last = options[(MAX_REQUESTS_PER_DAY - 1) % 3]
    for option in [o for o in options if o != last] * 3:
        response = ask(option)
        assert response.status_code == 429
        html = response.content.decode()
        assert 'data-error-code="too_many_changes"' in html
        assert "We could not make this change" in html and "start your checkout" not in html
    assert ChangeRequest.objects.count() == MAX_REQUESTS_PER_DAY
    assert len(mail.outbox) == MAX_REQUESTS_PER_DAY
    assert billing_sandbox.requests() == []
    # the same change again still finds the pending request; a day later, new ones are taken
    pending = ChangeRequest.objects.get(state=ChangeState.PENDING)
    assert ask(last).status_code == 302 and ChangeRequest.objects.count() == MAX_REQUESTS_PER_DAY
    ChangeRequest.objects.update(created_at=timezone.now() - timedelta(days=1, seconds=1))
    product, cycle = next(o for o in options if o != last)
    assert change_plan(user, product, cycle, "XOF").pk != pending.pk


def test_stopping_and_resuming_back_and_forth_is_capped_per_customer(
    billing_sandbox, plans, logged_in, user, settings
):
    """With the PATCH guess on, each stop or resume the mirror has caught up with sends a
    PATCH: after MAX_REQUESTS_PER_DAY in 24 hours a resume is answered 429 and sends nothing.
    A stop of renewal is never refused (the customer can always stop being billed); each one
    needs a resume before it, so the PATCHes stay bounded."""
    from billing_integration.checkout.changes import MAX_REQUESTS_PER_DAY

    basic, _pro = plans
    billing_sandbox.config(patch_subscriptions=True)
    guesses(settings, patch_auto_renew=True)
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    billing_sandbox.clear_requests()
    statuses = []
    for _ in range(MAX_REQUESTS_PER_DAY + 3):
        renews = Subscription.objects.get(pk=sub.pk).auto_renew
        action = "stop-renewal" if renews else "resume"
        response = logged_in.post(f"/billing/account/subscriptions/{sub.pk}/{action}/")
        statuses.append(response.status_code)
        if response.status_code == 302:  # the mirror catches up (as a pull or an event would)
            Subscription.objects.filter(pk=sub.pk).update(auto_renew=not renews)
    # stop, resume, ... (10 requests), then a stop all the same, then resumes refused
    assert statuses == [302] * (MAX_REQUESTS_PER_DAY + 1) + [429] * 2
    assert len(billing_sandbox.requests(operation="update_subscription")) == 11
    assert ChangeRequest.objects.count() == MAX_REQUESTS_PER_DAY + 1
    assert Subscription.objects.get(pk=sub.pk).auto_renew is False


def test_without_managers_a_request_to_staff_reaches_no_one_and_W023_says_so(
    billing_sandbox, plans, logged_in, user, settings
):
    from billing_integration.checks import check_wiring

    basic, _pro = plans
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    settings.MANAGERS = []
    request = cancel_at_period_end(sub)
    assert request.via == ChangeVia.REQUEST and mail.outbox == []
    [warning] = [m for m in check_wiring() if m.id == "billing_integration.W023"]
    assert "MANAGERS" in warning.msg and "MANAGERS" in warning.hint
    settings.MANAGERS = [("Billing staff", "billing@example.com")]
    assert [m for m in check_wiring() if m.id == "billing_integration.W023"] == []


@pytest.mark.parametrize("managers", ["billing@example.com", [("billing@example.com",)]])
def test_managers_that_mail_managers_refuses_reach_no_one_and_W023_says_so(
    billing_sandbox, plans, logged_in, user, settings, managers, caplog
):
    # Django refuses them (ValueError): the request was logged unsent; the checks said nothing.
    from billing_integration.checks import check_wiring

    basic, _pro = plans
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    settings.MANAGERS = managers
    request = cancel_at_period_end(sub)
    assert request.via == ChangeVia.REQUEST and mail.outbox == []
    assert "staff email not sent" in caplog.text
    [warning] = [m for m in check_wiring() if m.id == "billing_integration.W023"]
    assert warning.msg.startswith(
        f"settings.MANAGERS is not a list of (name, email) pairs: {managers!r}: "
    )


def test_cancel_and_resume_as_requests_done_by_hand(billing_sandbox, plans, logged_in, user, staff):
    basic, _pro = plans
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    request = cancel_at_period_end(sub)
    assert request.via == ChangeVia.REQUEST and len(mail.outbox) == 1
    billing_sandbox._post(f"/_sandbox/subscriptions/{sub.remote_id}/apply", {"auto_renew": False})
    pull(user)
    request.refresh_from_db()
    assert request.state == ChangeState.CONFIRMED
    again = resume(sub)
    assert again.via == ChangeVia.REQUEST and len(mail.outbox) == 2
    billing_sandbox._post(f"/_sandbox/subscriptions/{sub.remote_id}/apply", {"auto_renew": True})
    pull(user)
    again.refresh_from_db()
    assert again.state == ChangeState.CONFIRMED
    assert billing_sandbox.advance(days=32)["renewals"] == 1


# --- safety --------------------------------------------------------------------------------
def test_no_new_subscription_while_another_plan_may_still_renew(
    billing_sandbox, plans, logged_in, user
):
    basic, pro = plans
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    # its paid period is over here, but it may still renew on the service
    Subscription.objects.filter(pk=sub.pk).update(cycle_end_date=timezone.now() - timedelta(days=1))
    billing_sandbox.clear_requests()
    with pytest.raises(PlanAlreadyHeld):
        start_checkout(user, pro, "months-1", "XOF")
    assert post(logged_in, pro).status_code == 409
    assert billing_sandbox.requests() == []


def test_no_trial_of_another_plan_while_one_may_still_renew(
    billing_sandbox, plans, logged_in, user
):
    from django.template import engines

    from billing_integration.checkout.trials import start_trial

    basic, pro = plans
    Product.objects.filter(pk=pro.pk).update(trial_days=14)
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    # its paid period is over here, but it may still renew on the service
    Subscription.objects.filter(pk=sub.pk).update(cycle_end_date=timezone.now() - timedelta(days=1))
    billing_sandbox.clear_requests()
    with pytest.raises(PlanAlreadyHeld):
        start_trial(user, pro, "months-1", "XOF", auto_renew=True)
    data = {"product": pro.pk, "cycle": "months-1", "currency": "XOF"}
    refused = logged_in.post("/billing/trial/", data)
    assert refused.status_code == 409 and 'data-error-code="plan_held"' in refused.content.decode()
    assert billing_sandbox.requests() == []
    assert Subscription.objects.filter(product=pro).count() == 0
    button = engines["django"].from_string("{% load billing %}{% billing_trial_button pro %}")
    assert "billing-trial-form" not in button.render({"user": user, "pro": pro})


def test_two_plans_renewing_raise_the_alert(billing_sandbox, plans, logged_in, user, staff):
    basic, pro = plans
    old = hold(user, basic)
    hold(user, pro)

    report = diagnose(skip=("token", "broker", "workers", "beat", "pull"))
    fact = next(f for f in report.facts if f.key == "plans")
    assert fact.status == "fail" and "1 customer" in fact.summary
    page = logged_in.get("/billing/account/").content.decode()
    assert 'id="billing-doubled"' in page and "Basic" in page
    urgent = [m for m in mail.outbox if "URGENT" in m.subject]
    assert len(urgent) == 1 and str(old.remote_id) in urgent[0].body
    logged_in.get("/billing/account/")
    assert len([m for m in mail.outbox if "URGENT" in m.subject]) == 1  # once a day


def test_the_hourly_check_finds_two_plans_renewing_with_no_page_shown(
    billing_sandbox, plans, user, staff
):
    """Beat's ``billing_integration.alert_doubled_plans`` emails staff without the customer
    opening a page; once a day per pair."""
    from billing_integration.checkout.tasks import alert_doubled_plans
    from billing_integration.schedule import BEAT_SCHEDULE

    assert BEAT_SCHEDULE["billing-doubled-plans"]["task"] == alert_doubled_plans.name
    basic, pro = plans
    old = hold(user, basic)
    assert alert_doubled_plans() == 0 and mail.outbox == []
    hold(user, pro)
    assert alert_doubled_plans() == 1
    [urgent] = [m for m in mail.outbox if "URGENT" in m.subject]
    assert str(old.remote_id) in urgent.body and urgent.to == ["staff@example.com"]
    assert alert_doubled_plans() == 1
    assert len([m for m in mail.outbox if "URGENT" in m.subject]) == 1


def test_with_the_shared_cache_down_page_views_email_no_alert(
    billing_sandbox, plans, logged_in, user, staff, monkeypatch, caplog
):
    """The "sent once a day" mark cannot be read or set: each billing page view (and each
    hourly check) emailed staff again. Unsure whether it was sent, it is not sent again, and
    the log says so."""
    from billing_integration.checkout.tasks import alert_doubled_plans

    class Down:
        def add(self, *args, **kwargs):
            raise ConnectionError("cache down")

    monkeypatch.setattr("billing_integration.checkout.changes.shared_cache", lambda: Down())
    basic, pro = plans
    hold(user, basic)
    hold(user, pro)

    for _ in range(3):
        page = logged_in.get("/billing/account/")
        assert page.status_code == 200 and 'id="billing-doubled"' in page.content.decode()
    assert alert_doubled_plans() == 1
    assert [m for m in mail.outbox if "URGENT" in m.subject] == []
    unsent = [r for r in caplog.records if "email not sent" in r.getMessage()]
    assert len(unsent) == 4 and all(r.levelname == "ERROR" for r in unsent)
    assert "ConnectionError" in unsent[0].getMessage()


# --- what the probe (issue 26) calls -------------------------------------------------------
def test_probe_functions(billing_sandbox, plans, logged_in, user):
    basic, _pro = plans
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    customer = Customer.objects.get(subscriber=user)
    assert probe_change_action("upgrade", customer, basic) is False
    assert probe_patch_subscription(sub) is False
    billing_sandbox.config(change_actions=["upgrade"], patch_subscriptions=True)
    assert probe_change_action("upgrade", customer, basic) is True
    assert probe_patch_subscription(sub) is True
    assert billing_sandbox.object("subscription", str(sub.remote_id))["auto_renew"] is True
    assert not SwitchedOffGuess.objects.exists()  # a probe switches nothing off
    assert ChangeRequest.objects.count() == 0


def assert_resume_refused(billing_sandbox, logged_in, subscription) -> None:
    """``resume`` and the resume view refuse ``subscription`` (409): nothing sent, no request
    left for staff."""
    with pytest.raises(RenewalUnchanged):
        resume(subscription)
    response = logged_in.post(f"/billing/account/subscriptions/{subscription.pk}/resume/")
    assert response.status_code == 409
    assert billing_sandbox.requests(operation="update_subscription") == []
    assert not ChangeRequest.objects.filter(kind="resume").exists()


def test_a_canceled_plan_in_its_grace_period_cannot_be_resumed(
    billing_sandbox, plans, logged_in, user, settings
):
    """Canceled, then another plan bought in the grace period: resuming the canceled one would
    renew both. Refused (409), nothing sent, no request left for staff."""
    basic, _pro = plans
    billing_sandbox.config(patch_subscriptions=True)
    guesses(settings, patch_auto_renew=True)
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    Subscription.objects.filter(pk=sub.pk).update(status="canceled", auto_renew=False)
    sub.refresh_from_db()
    assert sub.is_active  # the grace period (ACCESS_AFTER_CANCEL "period_end")
    billing_sandbox.clear_requests()

    assert_resume_refused(billing_sandbox, logged_in, sub)


def test_a_stop_of_renewal_whose_patch_answer_was_lost_is_not_sent_again(
    billing_sandbox, plans, logged_in, user, settings, staff
):
    """The PATCH applied but never answered (every attempt reset after the commit): the stop
    was a 503 with nothing recorded, and the next click sent a second PATCH with a new key.
    Now the request goes to staff (the PATCH may have been applied), and the next click finds
    it: nothing is sent twice."""
    basic, _pro = plans
    billing_sandbox.config(patch_subscriptions=True)
    guesses(settings, patch_auto_renew=True)
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    billing_sandbox.faults(operation="update_subscription", reset_after_commit_rate=1, count=50)
    first = cancel_at_period_end(Subscription.objects.get(pk=sub.pk))
    again = cancel_at_period_end(Subscription.objects.get(pk=sub.pk))
    assert again.pk == first.pk and first.via == ChangeVia.REQUEST
    assert first.state == ChangeState.PENDING and len(mail.outbox) == 1
    calls = billing_sandbox.requests(operation="update_subscription")
    assert len({c["headers"]["x-idempotency-id"] for c in calls}) == 1
    assert billing_sandbox.objects("subscription")[0]["auto_renew"] is False
    assert not SwitchedOffGuess.objects.exists()


def test_a_plan_that_may_still_renew_is_the_plan_a_person_changes(
    billing_sandbox, plans, logged_in, user, staff
):
    """Basic's paid period is over here, but it may still renew on the service: buying Pro is
    refused ("ask us to change your plan"), so the pricing page offers "Change plan" for Pro,
    and that change is taken (a request to staff about Basic), not refused as no plan."""
    basic, pro = plans
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    Subscription.objects.filter(pk=sub.pk).update(cycle_end_date=timezone.now() - timedelta(days=1))
    refused = post(logged_in, pro)
    assert refused.status_code == 409
    assert 'data-error-code="plan_held"' in refused.content.decode()
    page = logged_in.get("/billing/account/").content.decode()
    assert "billing-choose-plan" in page  # to the pricing page

    html = button(pro, user, cycle="months-1", currency="XOF")
    assert "billing-change-form" in html and "billing-checkout-form" not in html
    response = logged_in.post(
        "/billing/account/change-plan/", {"product": pro.pk, "cycle": "months-1", "currency": "XOF"}
    )

    assert response.status_code == 302 and response["Location"] == "/billing/account/"
    request = ChangeRequest.objects.get()
    assert request.subscription == sub and request.target_product == pro
    assert len(mail.outbox) == 1 and str(sub.remote_id) in mail.outbox[0].body
    page = logged_in.get("/billing/account/").content.decode()
    assert "Change to Pro requested" in page


def test_a_change_page_open_for_the_same_option_refuses_a_checkout_of_it(
    billing_sandbox, plans, logged_in, user, settings
):
    """A change to Pro monthly XOF is open on the hosted page; Basic is then canceled (no plan
    held: checkout may sell Pro). A checkout of that same option must not open a second page
    beside the change's: paying both would buy Pro twice."""
    basic, pro = plans
    billing_sandbox.config(change_actions=["upgrade"])
    guesses(settings, **ON)
    old = subscribe(billing_sandbox, logged_in, user, basic)
    change = change_plan(user, pro, "months-1", "XOF")
    assert change.checkout_session is not None
    Subscription.objects.filter(pk=old.pk).update(status="canceled", auto_renew=False)
    billing_sandbox.clear_requests()

    with pytest.raises(CheckoutInProgress) as info:
        start_checkout(user, pro, "months-1", "XOF")
    assert info.value.session == change.checkout_session
    response = post(logged_in, pro)
    assert response.status_code == 409
    assert 'data-error-code="checkout_open"' in response.content.decode()
    assert billing_sandbox.requests(operation="create_checkout_session") == []
    assert CheckoutSession.objects.filter(product=pro).count() == 1


def team_of(request):
    """The subscriber resolver of the tests below: the team account, whoever is logged in."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get(username="team-account")


def test_an_inactive_subscriber_cannot_restart_renewal(
    billing_sandbox, plans, logged_in, user, settings, staff
):
    """A deactivated user, or a deactivated team the resolver gives, has no access: restarting
    its renewal would bill a subscriber who cannot use what it pays for. Refused (403
    ``no_subscriber``, as checkout and trials): nothing sent, no request to staff."""
    from django.contrib.auth import get_user_model

    from billing_integration.checkout.services import NoSubscriber

    basic, _pro = plans
    billing_sandbox.config(patch_subscriptions=True)
    guesses(settings, patch_auto_renew=True)
    own = subscribe(billing_sandbox, logged_in, user, basic)
    Subscription.objects.filter(pk=own.pk).update(auto_renew=False)
    team = get_user_model().objects.create_user("team-account", is_active=False)
    teams = hold(team, basic, auto_renew=False)
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)
    user.refresh_from_db()
    billing_sandbox.clear_requests()

    with pytest.raises(NoSubscriber):
        resume(own)
    settings.BILLING = {**settings.BILLING, "SUBSCRIBER_RESOLVER": f"{__name__}.team_of"}
    get_user_model().objects.filter(pk=user.pk).update(is_active=True)
    response = logged_in.post(f"/billing/account/subscriptions/{teams.pk}/resume/")

    assert response.status_code == 403
    assert 'data-error-code="no_subscriber"' in response.content.decode()
    assert billing_sandbox.requests(operation="update_subscription") == []
    assert not ChangeRequest.objects.exists() and mail.outbox == []


def test_an_inactive_subscriber_is_refused_a_change_of_plan_as_no_subscriber(
    billing_sandbox, plans, logged_in, user, settings
):
    """An inactive subscriber was answered ``no_plan`` ("choose a plan to subscribe"), which
    checkout then refuses as ``no_subscriber``: it is ``no_subscriber`` (403) at once."""
    from django.contrib.auth import get_user_model

    from billing_integration.checkout.services import NoSubscriber

    basic, pro = plans
    subscribe(billing_sandbox, logged_in, user, basic)
    team = get_user_model().objects.create_user("team-account", is_active=False)
    hold(team, basic)
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)
    user.refresh_from_db()
    billing_sandbox.clear_requests()

    with pytest.raises(NoSubscriber):
        change_plan(user, pro, "months-1", "XOF")
    settings.BILLING = {**settings.BILLING, "SUBSCRIBER_RESOLVER": f"{__name__}.team_of"}
    get_user_model().objects.filter(pk=user.pk).update(is_active=True)
    data = {"product": pro.pk, "cycle": "months-1", "currency": "XOF"}
    response = logged_in.post("/billing/account/change-plan/", data)

    assert response.status_code == 403
    assert 'data-error-code="no_subscriber"' in response.content.decode()
    assert billing_sandbox.requests() == [] and not ChangeRequest.objects.exists()


def test_the_old_plan_of_a_change_cannot_be_resumed_beside_the_new_one(
    billing_sandbox, plans, logged_in, user, settings, staff
):
    """After a change of plan the old plan runs to its period's end with its renewal stopped:
    resuming it would renew both plans. The billing page offers no Resume on it, and a resume
    is refused (409) with nothing sent and no request for staff."""
    basic, pro = plans
    billing_sandbox.config(change_actions=["upgrade"], patch_subscriptions=True)
    guesses(settings, **ON)
    old = subscribe(billing_sandbox, logged_in, user, basic)
    request = change_plan(user, pro, "months-1", "XOF")
    billing_sandbox.complete_checkout(str(request.checkout_session.remote_id))
    pull(user)
    old.refresh_from_db()
    assert old.auto_renew is False and old.is_active
    billing_sandbox.clear_requests()

    page = logged_in.get("/billing/account/").content.decode()
    assert f'action="/billing/account/subscriptions/{old.pk}/resume/"' not in page
    assert_resume_refused(billing_sandbox, logged_in, old)
    assert [s["product"] for s in renewing(billing_sandbox)] == [str(pro.remote_id)]


def test_a_declined_change_of_cycle_is_not_shown_done_on_the_return_page(
    billing_sandbox, plans, logged_in, user, settings
):
    """A change of cycle through the hosted page buys the product held: the plan held before
    it is no outcome of that page. Declined, the return page does not say active; then paid, it
    does."""
    basic, _pro = plans
    billing_sandbox.config(change_actions=["upgrade", "downgrade"])
    guesses(settings, change_plan_action="downgrade")
    subscribe(billing_sandbox, logged_in, user, basic)
    request = change_plan(user, basic, "years-1", "XOF")
    session_id = str(request.checkout_session.remote_id)

    billing_sandbox.complete_checkout(session_id, phone="0700000002")  # declined
    page = logged_in.get(RETURN, {"session_id": session_id}).content.decode()
    assert 'data-outcome="active"' not in page  # pending: no payment event delivered here

    again = change_plan(user, basic, "years-1", "XOF")  # the same page, paid this time
    assert billing_sandbox.complete_checkout(session_id).status_code == 200
    pull(user)  # the return page pulls at most once in RETURN_PULL_INTERVAL
    page = logged_in.get(RETURN, {"session_id": session_id}).content.decode()
    assert 'data-outcome="active"' in page and again.pk == request.pk


@pytest.mark.parametrize(
    "path",
    [
        "/billing/account/change-plan/",
        "/billing/account/subscriptions/1/stop-renewal/",
        "/billing/account/subscriptions/1/resume/",
    ],
)
def test_an_anonymous_action_goes_to_login_and_back_to_the_billing_page(client, user, path):
    """Logged out (an expired session on the billing page): after login the visitor is back
    on the page of the click, not on the POST-only action (a GET there answers 405)."""
    from urllib.parse import parse_qs, urlsplit

    answer = client.post(path, HTTP_REFERER="http://testserver/billing/account/")
    assert answer.status_code == 302 and "login" in answer["Location"]
    back = parse_qs(urlsplit(answer["Location"]).query)["next"][0]
    assert back == "http://testserver/billing/account/"
    assert ChangeRequest.objects.count() == 0
    client.force_login(user)
    assert client.get(back).status_code == 200


def _expire(billing_sandbox, session) -> None:
    """``session`` (a page of 60 seconds) expires unpaid: on the sandbox's clock, and here."""
    assert billing_sandbox.advance(seconds=61)["expired_sessions"] == 1
    CheckoutSession.objects.filter(pk=session.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )


@pytest.mark.parametrize("closed", ["expired", "EXPIRED", "Canceled", "completed", "deleted"])
def test_the_same_change_after_its_page_closed_unpaid_gets_a_new_page(
    billing_sandbox, plans, logged_in, user, settings, closed
):
    """A change whose hosted page closed unpaid (expired, or a closed status in any case) is
    asked again: a new page with a new key (a new request, not a retry), not the closed one's
    link; paying it completes the change."""
    basic, pro = plans
    billing_sandbox.config(change_actions=["upgrade"])
    guesses(settings, **ON)
    subscribe(billing_sandbox, logged_in, user, basic)
    settings.BILLING = {**settings.BILLING, "CHECKOUT_EXPIRY": 60}
    first = change_plan(user, pro, "months-1", "XOF")
    settings.BILLING = {**settings.BILLING, "CHECKOUT_EXPIRY": 300}
    if closed == "expired":
        _expire(billing_sandbox, first.checkout_session)
    elif closed == "deleted":  # its row deleted (in the admin): no link to hand out
        CheckoutSession.objects.filter(pk=first.checkout_session.pk).delete()
    else:
        CheckoutSession.objects.filter(pk=first.checkout_session.pk).update(status=closed)

    again = change_plan(user, pro, "months-1", "XOF")

    assert again.checkout_session_id != first.checkout_session_id
    assert again.checkout_url.endswith(str(again.checkout_session.remote_id))
    *_, one, two = billing_sandbox.requests(operation="create_checkout_session")
    assert one["headers"]["x-idempotency-id"] != two["headers"]["x-idempotency-id"]
    assert two["body"]["action"] == "upgrade"
    assert ChangeRequest.objects.filter(state=ChangeState.PENDING).get().pk == again.pk
    # a double click on the new page finds it
    assert change_plan(user, pro, "months-1", "XOF").pk == again.pk
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == 3

    page = billing_sandbox.complete_checkout(str(again.checkout_session.remote_id))
    assert page.status_code == 200
    pull(user)
    again.refresh_from_db()
    assert again.state == ChangeState.CONFIRMED and again.new_subscription.product == pro


def test_the_same_change_after_its_page_was_paid_opens_no_second_page(
    billing_sandbox, plans, logged_in, user, settings
):
    """A change paid on its page, the page then expired, and the new plan not shown here yet
    (no pull): asking again opens no second page, which could be paid too."""
    basic, pro = plans
    billing_sandbox.config(change_actions=["upgrade"])
    guesses(settings, **ON)
    subscribe(billing_sandbox, logged_in, user, basic)
    first = change_plan(user, pro, "months-1", "XOF")
    page = billing_sandbox.complete_checkout(str(first.checkout_session.remote_id))
    assert page.status_code == 200
    # its payment event arrived; the new subscription is not pulled yet
    [paid] = [p for p in billing_sandbox.objects("payment") if p["product"] == str(pro.remote_id)]
    Payment.objects.create(
        remote_id=paid["id"],
        status="completed",
        customer=first.customer,
        product=pro,
        product_remote_id=pro.remote_id,
        subscription_remote_id=paid["subscription"],
    )
    CheckoutSession.objects.filter(pk=first.checkout_session.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    calls = len(billing_sandbox.requests(operation="create_checkout_session"))

    again = change_plan(user, pro, "months-1", "XOF")

    assert again.pk == first.pk and again.checkout_url is None  # the billing page shows it
    assert len(billing_sandbox.requests(operation="create_checkout_session")) == calls


@pytest.mark.parametrize("cache", ["outside", "database"])
@pytest.mark.parametrize("model", [ChangeRequest, CheckoutSession])
def test_a_change_whose_request_could_not_be_stored_makes_no_second_page(
    billing_sandbox, plans, logged_in, user, settings, monkeypatch, cache, model
):
    """The change's session was created, then storing it or its request failed (the
    database): the session row rolled back with it, its key was already forgotten, and the
    next click created a second payable page. The key is now forgotten on commit only, and
    the click answers 503 once its transaction committed (the database cache's key with it)."""
    basic, pro = plans
    billing_sandbox.config(change_actions=["upgrade"])
    guesses(settings, **ON)
    subscribe(billing_sandbox, logged_in, user, basic)
    before = len(billing_sandbox.objects("checkout_session"))
    sessions = CheckoutSession.objects.count()
    failed = first_save_fails(monkeypatch, settings, model, cache=cache)
    with pytest.raises(ServiceUnavailable):
        change_plan(user, pro, "months-1", "XOF")
    assert failed and not ChangeRequest.objects.exists()
    assert CheckoutSession.objects.count() == sessions
    assert len(billing_sandbox.objects("checkout_session")) == before + 1

    request = change_plan(user, pro, "months-1", "XOF")
    assert request.via == ChangeVia.CHECKOUT
    assert len(billing_sandbox.objects("checkout_session")) == before + 1
    calls = billing_sandbox.requests(operation="create_checkout_session")[-2:]
    assert calls[0]["headers"]["x-idempotency-id"] == calls[1]["headers"]["x-idempotency-id"]


@pytest.mark.parametrize("cache", ["outside", "database"])
@pytest.mark.parametrize("kind", ["stop", "resume"])
def test_a_renewal_patch_whose_request_could_not_be_stored_is_resent_with_its_key(
    billing_sandbox, plans, logged_in, user, settings, monkeypatch, kind, cache
):
    """The PATCH was applied and answered, then storing its request failed (the database): the
    next click sent a second PATCH with a new key. The click now answers 503 and the next one
    resends the first one's key and body (kept in ``BILLING['CACHE']``, committed with the
    database cache too, until the request is stored)."""
    basic, _pro = plans
    billing_sandbox.config(patch_subscriptions=True)
    guesses(settings, patch_auto_renew=True)
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    act = cancel_at_period_end
    if kind == "resume":
        cancel_at_period_end(Subscription.objects.get(pk=sub.pk))
        pull(user)
        act = resume
    billing_sandbox.clear_requests()
    failed = first_save_fails(monkeypatch, settings, ChangeRequest, cache=cache)
    with pytest.raises(ServiceUnavailable):
        act(Subscription.objects.get(pk=sub.pk))
    assert failed and not ChangeRequest.objects.filter(state=ChangeState.PENDING).exists()

    request = act(Subscription.objects.get(pk=sub.pk))
    assert request.via == ChangeVia.PATCH and request.state == ChangeState.PENDING
    calls = billing_sandbox.requests(operation="update_subscription")
    assert len({c["headers"]["x-idempotency-id"] for c in calls}) == 1  # a 401 resends it too
    assert len(calls) >= 2 and all(c["body"] == calls[0]["body"] for c in calls)
    assert billing_sandbox.objects("subscription")[0]["auto_renew"] is (kind == "resume")

    # the request stored, the key is forgotten: the next stop or resume is a new PATCH
    pull(user)
    (resume if kind == "stop" else cancel_at_period_end)(Subscription.objects.get(pk=sub.pk))
    calls = billing_sandbox.requests(operation="update_subscription")
    assert len({c["headers"]["x-idempotency-id"] for c in calls}) == 2


def test_a_refused_renewal_patch_is_sent_with_a_new_key_on_the_next_click(
    billing_sandbox, plans, logged_in, user, settings
):
    """A PATCH refused (409, nothing applied) forgets its kept key, even in a cache outside
    the database: the next click is a new PATCH, not a replay of the refusal."""
    basic, _pro = plans
    billing_sandbox.config(patch_subscriptions=True)
    guesses(settings, patch_auto_renew=True)
    sub = subscribe(billing_sandbox, logged_in, user, basic)
    locmem = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "out"}
    settings.CACHES = {**settings.CACHES, "outside": locmem}
    settings.BILLING = {**settings.BILLING, "CACHE": "outside"}
    billing_sandbox.clear_requests()
    billing_sandbox.faults(operation="update_subscription", status=409, error_rate=1, count=1)
    with pytest.raises(ServiceUnavailable):
        cancel_at_period_end(Subscription.objects.get(pk=sub.pk))
    request = cancel_at_period_end(Subscription.objects.get(pk=sub.pk))
    assert request.via == ChangeVia.PATCH
    calls = billing_sandbox.requests(operation="update_subscription")
    assert [c["status"] for c in calls] == [409, 200]
    assert len({c["headers"]["x-idempotency-id"] for c in calls}) == 2
