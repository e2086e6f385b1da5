"""Change plan, stop renewal and resume: guesses about the service (``BILLING['GUESSES']``),
with a request to staff as the default and the fallback. A request is shown done only when the
mirror (an event or a pull) shows it; see docs/changes.md."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from contextlib import suppress
from datetime import timedelta
from decimal import Decimal
from typing import Any, TypeGuard

from django.core.mail import mail_managers
from django.db import DatabaseError, IntegrityError, router, transaction
from django.utils import formats, timezone
from django.utils.translation import gettext, gettext_lazy

from .. import currencies
from ..access import (
    _is_subscriber,
    live_subscriptions,
    may_renew,
    plan_to_replace,
    renews_in_place,
)
from ..client import get_client, interactive_deadline
from ..client.retry import Deadline
from ..conf import guesses, shared_cache
from ..customers import ensure_customer_pushed
from ..exceptions import (
    BillingAPIError,
    BillingConfigurationError,
    BillingError,
    BillingIdempotencyConflict,
)
from ..models import (
    ChangeKind,
    ChangeRequest,
    ChangeState,
    ChangeVia,
    CheckoutSession,
    Customer,
    Payment,
    PaymentStatus,
    Price,
    Product,
    ProductType,
    Subscription,
    SwitchedOffGuess,
)
from ..models.records import of_product
from ..models.subscriptions import CANCELED_STATUSES, PAUSED_STATUS
from .services import (
    CONFIRMING_FOR,
    Attempt,
    CheckoutError,
    CheckoutInProgress,
    CheckoutSelection,
    NoSubscriber,
    PaymentBeingConfirmed,
    ProductUnavailable,
    ServiceUnavailable,
    _cache_call,
    _create_session,
    _lock_customer,
    attempt_for,
    checkout_in_the_way,
    confirming_in_the_way,
    forget_unsent,
    session_closed,
    validate_selection,
)

logger = logging.getLogger("billing_integration.changes")

#: The guesses a refusal switches off, by name.
CHANGE_ACTION, PATCH_AUTO_RENEW = "change_plan_action", "patch_auto_renew"
#: An answer that switches a guess off: no such route or method (the service does not know it).
NO_SUCH_OPERATION = (404, 405)
#: A refused body: this request goes to staff; the guess is switched off only when the error
#: names the guess's field unknown or unsupported (``refuses_guess``).
REFUSED_BODY = (400, 422)
#: The fields each guess adds to what the app sends.
GUESSED_FIELDS = {
    CHANGE_ACTION: ("action", "upgrade_to", "downgrade_to"),
    PATCH_AUTO_RENEW: ("auto_renew",),
}
# What an error says of a field the service does not take at all (``_`` and ``-`` read as
# spaces); an error that says something is not found is about an object (a target).
_UNKNOWN = re.compile(
    r"\b(?:unknown|unrecogni[sz]ed|unsupported|not (?:supported|allowed|permitted)"
    r"|invalid (?:value|choice|field|parameter))\b"
)
UPGRADE, DOWNGRADE = "upgrade", "downgrade"
#: Seconds between two urgent notices about the same pair of renewing plans.
ALERT_EVERY = 86400
#: Requests (changes of plan, stops, resumes) a customer may make in 24 hours; past it a change
#: or a resume is refused (a stop of renewal never is, though it counts).
MAX_REQUESTS_PER_DAY = 10
#: Seconds a stop's or resume's PATCH key is kept while its request is not stored here (the
#: next click resends it, ``_renewal``).
PATCH_KEY_KEPT_FOR = 86400


class NoPlanToChange(CheckoutError):
    status = 409
    code = "no_plan"
    default_message = gettext_lazy("You have no plan to change: choose a plan to subscribe.")


class SamePlan(CheckoutError):
    code = "same_plan"
    default_message = gettext_lazy("This is already your plan.")


class RenewalUnchanged(CheckoutError):
    status = 409
    code = "renewal_unchanged"
    default_message = gettext_lazy("There is nothing to change in this subscription's renewal.")


class TooManyChanges(CheckoutError):
    status = 429
    code = "too_many_changes"
    default_message = gettext_lazy(
        "You have asked for too many changes to your subscriptions in the last 24 hours. "
        "Please try again tomorrow, or contact us."
    )


def _within_quota(customer: Customer) -> None:
    """Refuse a new request once ``customer`` made ``MAX_REQUESTS_PER_DAY`` in 24 hours (each
    one may email staff or call the service). Called under the customer's lock."""
    since = timezone.now() - timedelta(days=1)
    made = ChangeRequest.objects.filter(customer=customer, created_at__gte=since).count()
    if made >= MAX_REQUESTS_PER_DAY:
        logger.warning("customer %s: change request refused, %s in 24 hours", customer.pk, made)
        raise TooManyChanges()


# --- guesses --------------------------------------------------------------------------------
def guess_on(name: str) -> bool:
    """Whether the guess ``name`` is set in ``BILLING['GUESSES']`` and not switched off."""
    value = guesses()[name]
    return bool(value) and not SwitchedOffGuess.objects.filter(name=name).exists()


def switch_off(name: str, error: BillingAPIError) -> None:
    """Record that the service refused the guess ``name`` (a row: every process sees it)."""
    logger.error("billing guess %s switched off: the service answered %s", name, error.status)
    # IntegrityError: another process recorded it first.
    with suppress(IntegrityError), transaction.atomic():
        SwitchedOffGuess.objects.create(
            name=name, status=error.status or 0, operation=error.operation or ""
        )


def refuses_guess(name: str, status: int, body: Any) -> bool:
    """Whether an answer (``status``, the error ``body``) says the service does not know the
    guess ``name``: a 404 or 405, or a 400 or 422 one of whose errors names a field of the
    guess (its ``field`` or ``param``, else anywhere in it) unknown, unsupported, not allowed
    or an invalid value or choice, and nothing not found. Any other 400 or 422 is about this
    request (an object's state, a value such as an expiry): the guess stays on."""
    if status in NO_SUCH_OPERATION:
        return True
    if status not in REFUSED_BODY:
        return False
    fields = "|".join(f.replace("_", "[_-]") for f in GUESSED_FIELDS[name])
    named = re.compile(rf"\b(?:{fields})\b", re.IGNORECASE)
    for error in _errors(body):
        where = [error[k] for k in ("field", "param") if error.get(k)] or [error]
        words = _text(error).lower().replace("_", " ").replace("-", " ")
        if named.search(_text(where)) and _UNKNOWN.search(words) and "not found" not in words:
            return True
    return False


def _errors(body: Any) -> list[dict[str, Any]]:
    """The errors of an error body, whatever its shape (the interface shows none): the items
    of its ``errors``, ``error`` or ``detail`` when a list or an object, else the body."""
    if isinstance(body, dict):
        inner = next((body[k] for k in ("errors", "error", "detail") if k in body), None)
        body = inner if isinstance(inner, (list, dict)) else body
    items = body if isinstance(body, list) else [body]
    return [item if isinstance(item, dict) else {"message": item} for item in items]


def _text(value: Any) -> str:
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return " ".join(_text(v) for v in value)
    return "" if value is None else str(value)


def _refused(name: str, exc: BaseException | None) -> TypeGuard[BillingAPIError]:
    """Whether the guessed call of ``name`` was refused (the request then goes to staff): a
    refusal of the guess switches it off (``refuses_guess``); another 400 or 422 is logged with
    the service's message and refuses this request only. An idempotency conflict is in doubt
    (the call may have been applied): not a refusal."""
    if not isinstance(exc, BillingAPIError) or isinstance(exc, BillingIdempotencyConflict):
        return False
    if refuses_guess(name, exc.status, exc.body):
        switch_off(name, exc)
        return True
    if exc.status in REFUSED_BODY:
        logger.warning("billing guess %s refused for this request only, kept on: %s", name, exc)
        return True
    return False


# --- the plan held and the direction of a change ---------------------------------------------
def current_plan(subscriber: Any, product: Product) -> Subscription | None:
    """The subscriber's subscription that a change to ``product`` replaces: the same product
    live (another cycle or currency), else the plan of its group that refuses a checkout of
    ``product`` (``plan_to_replace``: a live one, or one that may still renew). A canceled one
    in its grace period renews no more: it is no plan to change."""
    same = live_subscriptions(subscriber, product).order_by("-cycle_start_date", "-pk").first()
    return same or plan_to_replace(subscriber, product)


def monthly_price(product: Product | None, cycle: str, currency: Any) -> Decimal | None:
    """The price of ``product`` for ``cycle`` in ``currency``, per month (a year is 12)."""
    if product is None or not cycle:
        return None
    try:
        currency_id = currencies.currency_id(currency)
    except BillingConfigurationError:
        return None
    unit, _, freq = cycle.partition("-")
    if not (freq.isascii() and freq.isdigit()) or unit not in ("months", "years"):
        return None
    price = Price.objects.filter(
        cycle__product=product,
        cycle__unit=unit,
        cycle__frequency=int(freq),
        currency_id=currency_id,
    ).first()
    if price is None:
        return None
    return price.amount / (int(freq) * (12 if unit == "years" else 1))


def direction(held: Subscription, selection: CheckoutSelection) -> str:
    """``upgrade`` when the new option costs more a month than the held one, in the new
    option's currency (else the held one's, when the held plan has no price in it)."""
    new_cycle, new_currency = selection.cycle_code, selection.currency_id
    old = monthly_price(held.product, held.selected_billing_cycle, new_currency)
    new = monthly_price(selection.product, new_cycle, new_currency)
    if old is None:
        old = monthly_price(held.product, held.selected_billing_cycle, held.selected_currency)
        new = monthly_price(selection.product, new_cycle, held.selected_currency)
    return UPGRADE if old is not None and new is not None and new > old else DOWNGRADE


# --- change plan ----------------------------------------------------------------------------
def change_plan(
    subscriber: Any,
    product: Any,
    cycle: Any = None,
    currency: Any = None,
    *,
    client: Any = None,
    deadline: Deadline | None = None,
) -> ChangeRequest:
    """Ask to move ``subscriber``'s plan to ``product`` / ``cycle`` / ``currency``. Returns the
    ``ChangeRequest``; its ``checkout_url`` is set when the customer must confirm on the hosted
    page (the guessed checkout action), else staff were asked (email, admin list)."""
    if not _is_subscriber(subscriber):  # none, anonymous or inactive, as checkout refuses
        raise NoSubscriber()
    selection = validate_selection(product, cycle, currency)
    if not selection.product.is_plan:
        raise NoPlanToChange()
    held = current_plan(subscriber, selection.product)
    if held is None or held.customer is None:
        raise NoPlanToChange()
    code = currencies.currency_code(selection.currency_id)
    if (
        held.product_id == selection.product.pk
        and held.selected_billing_cycle == selection.cycle_code
        and currencies.label(held.selected_currency) == code
    ):
        raise SamePlan()
    way = direction(held, selection)
    # Kept before the transaction: a database cache keeps it if the transaction is lost.
    attempt = None
    if guess_on(CHANGE_ACTION):
        up, down = _change_target(held, selection, way)
        attempt = attempt_for(held.customer, selection, guesses()[CHANGE_ACTION], up, down)
    try:
        return _change(held, selection, code, way, client, deadline, attempt)
    finally:
        forget_unsent(attempt)


def _change(
    held: Subscription,
    selection: CheckoutSelection,
    code: str,
    way: str,
    client: Any,
    deadline: Deadline | None,
    attempt: Attempt | None,
) -> ChangeRequest:
    """``change_plan`` of ``held`` to ``selection`` (``code``: its currency), ``way`` up or
    down, its session sent with ``attempt`` (``attempt_for``)."""
    assert held.customer is not None
    # One change per customer at a time: a double click finds the first one's request.
    with transaction.atomic(using=router.db_for_write(ChangeRequest)):
        _lock_customer(held.customer)
        pending = _pending(held, ChangeKind.CHANGE_PLAN)
        if pending is not None and (
            pending.target_product_id,
            pending.target_cycle,
            pending.target_currency,
        ) == (selection.product.pk, selection.cycle_code, code):
            if not _page_closed(pending):
                pending.checkout_url = _session_url(pending, client)
                return pending  # asked already: nothing sent twice
            if _page_paid(pending):
                return pending  # paid: shown done once the service shows it (no URL)
            # its page closed unpaid: a new request with a new page (and a new key)
        _within_quota(held.customer)
        request = ChangeRequest(
            customer=held.customer,
            subscription=held,
            kind=ChangeKind.CHANGE_PLAN,
            via=ChangeVia.REQUEST,
            target_product=selection.product,
            target_cycle=selection.cycle_code,
            target_currency=code,
            direction=way,
        )
        failure: CheckoutError | None = None
        if guess_on(CHANGE_ACTION):
            action = guesses()[CHANGE_ACTION]
            # an earlier page, the customer came back from, may have been paid: not recorded yet
            if (paying := confirming_in_the_way(held.customer, selection.product)) is not None:
                raise PaymentBeingConfirmed(paying)
            rival = checkout_in_the_way(held.customer, selection.product, selection, action)
            if rival is not None:  # an earlier change's or purchase's page: both could be paid
                raise CheckoutInProgress(rival)

            def store(session: CheckoutSession) -> None:  # with its session, or neither
                request.checkout_session, request.via = session, ChangeVia.CHECKOUT
                _withdraw(held, ChangeKind.CHANGE_PLAN)
                request.save()

            try:
                _change_session(request, selection, client, deadline, store, attempt)
            except CheckoutError as exc:
                failure = exc  # raised after the commit: what it remembered must not roll back
        if failure is None and request.pk is None:  # no session: a request to staff
            _withdraw(held, ChangeKind.CHANGE_PLAN)
            request.save()
    if failure is not None:
        raise failure
    if request.via == ChangeVia.REQUEST:
        _tell_staff(request)
    request.checkout_url = _session_url(request, client)
    return request


def _change_session(
    request: ChangeRequest,
    selection: CheckoutSelection,
    client: Any,
    deadline: Deadline | None,
    store: Callable[[CheckoutSession], None],
    attempt: Attempt | None,
) -> CheckoutSession | None:
    """The checkout session of the guessed change action, sent with ``attempt`` and stored
    with ``store`` (the request); ``None`` when the service refuses it (``_refused``: the
    request goes to staff)."""
    client = client or get_client()
    deadline = deadline or interactive_deadline()
    up, down = _change_target(request.subscription, selection, request.direction)
    try:
        customer = ensure_customer_pushed(request.customer, deadline=deadline)
        return _create_session(
            customer,
            selection,
            client,
            deadline,
            action=guesses()[CHANGE_ACTION],
            upgrade_to=up,
            downgrade_to=down,
            store=store,
            attempt=attempt,
        )
    except CheckoutError as exc:
        if not isinstance(exc, ProductUnavailable) and _refused(CHANGE_ACTION, exc.__cause__):
            return None
        raise
    except BillingError as exc:
        raise ServiceUnavailable() from exc


def _change_target(
    held: Subscription, selection: CheckoutSelection, way: str
) -> tuple[str | None, str | None]:
    """The guessed action's ``upgrade_to`` and ``downgrade_to`` (one of them, by ``way``): the
    held subscription's id or the new product's (``change_plan_target``)."""
    held_id = held.remote_id if guesses()["change_plan_target"] == "subscription" else None
    target = str(held_id or selection.product.remote_id)
    return (target, None) if way == UPGRADE else (None, target)


def _page_closed(request: ChangeRequest) -> bool:
    """Whether ``request`` went through a hosted page that can no longer be paid
    (``session_closed``: expired, completed or of a closed status), or whose session row is
    gone (deleted: no link to hand out)."""
    session = request.checkout_session
    return request.via == ChangeVia.CHECKOUT and (session is None or session_closed(session))


def _page_paid(request: ChangeRequest) -> bool:
    """Whether the mirror shows ``request``'s page paid: since it was created, a completed
    payment of the customer for the new plan (not of the plan held: a renewal) or a
    subscription to it. A second page for the same change could be paid too."""
    session, held, target = request.checkout_session, request.subscription, request.target_product
    if session is None or target is None:
        return False
    since = session.created_at
    paid = Payment.objects.filter(
        of_product(target),
        customer=request.customer,
        status=PaymentStatus.COMPLETED,
        created_at__gte=since,
    ).exclude(subscription=held)
    if held.remote_id is not None:
        paid = paid.exclude(subscription_remote_id=held.remote_id)
    subscribed = Subscription.objects.filter(
        customer=request.customer, product=target, created_at__gte=since
    ).exclude(pk=held.pk)
    return paid.exists() or subscribed.exists()


def _session_url(request: ChangeRequest, client: Any) -> str | None:
    session = request.checkout_session
    if request.via != ChangeVia.CHECKOUT or session is None or session.remote_id is None:
        return None
    return str((client or get_client()).checkout_url(str(session.remote_id)))


# --- stop renewal and resume ----------------------------------------------------------------
def cancel_at_period_end(subscription: Subscription, *, client: Any = None) -> ChangeRequest:
    """Ask that ``subscription`` stop renewing: access runs to the end of the paid period.
    Taken while it may still renew (``access.may_renew``), even after its paid period ended
    here; refused (``RenewalUnchanged``) once canceled or not renewing."""
    return _renewal(subscription, ChangeKind.STOP_RENEWAL, client)


def resume(subscription: Subscription, *, client: Any = None) -> ChangeRequest:
    """Ask that ``subscription`` renew again (before its paid period ends). Refused
    (``NoSubscriber``) for a customer whose subscriber is gone or inactive (``is_active``
    false): it has no access, and would be billed for it."""
    return _renewal(subscription, ChangeKind.RESUME, client)


def _renewal(subscription: Subscription, kind: str, client: Any) -> ChangeRequest:
    subscription.refresh_from_db()
    if subscription.customer is None:
        raise RenewalUnchanged()
    wanted = kind == ChangeKind.RESUME
    if wanted and not _is_subscriber(subscription.customer.subscriber):
        raise NoSubscriber()  # as checkout: no access, so no billing restarted
    # The PATCH's key, kept before the transaction: a database cache keeps it too when the
    # transaction is lost (the process dies during the call); see ``_patch_key``.
    key = _patch_key(subscription, wanted) if guess_on(PATCH_AUTO_RENEW) else None
    try:
        # One change per customer at a time, as change_plan: a double click (or a burst of
        # requests) finds the first one's request, and nothing is sent or emailed twice.
        with transaction.atomic(using=router.db_for_write(ChangeRequest)):
            _lock_customer(subscription.customer)
            subscription.refresh_from_db()
            # a stop is taken while the subscription may still renew on the service, its paid
            # period over here or not (a failed payment it may retry); a resume only while active
            open_to = subscription.is_active if wanted else may_renew(subscription)
            if (
                subscription.remote_id is None
                or not open_to
                or subscription.status in CANCELED_STATUSES  # in its grace period: renews no more
                or subscription.auto_renew == wanted
            ):
                raise RenewalUnchanged()
            others = Subscription.objects.for_customer(subscription.customer)
            if wanted and renews_in_place(others.select_related("product"), subscription):
                raise RenewalUnchanged(  # a change of plan's new plan, a trial's conversion
                    gettext(
                        "Another subscription of yours renews in this one's place: resuming it "
                        "would charge you for both."
                    )
                )
            if wanted:
                _refuse_beside_a_purchase(subscription)
            opposite = ChangeKind.STOP_RENEWAL if wanted else ChangeKind.RESUME
            _withdraw(subscription, opposite)
            pending = _pending(subscription, kind)
            if pending is not None:
                return pending
            if kind != ChangeKind.STOP_RENEWAL:  # stopping being billed is never refused
                _within_quota(subscription.customer)
            request = ChangeRequest(
                customer=subscription.customer,
                subscription=subscription,
                kind=kind,
                via=ChangeVia.REQUEST,
            )
            # a paused subscription is left to staff: a service may refuse to change it while
            # paused (the sandbox does, 400)
            paused = subscription.status == PAUSED_STATUS
            failure: CheckoutError | None = None
            if not paused and key is not None and _patch(subscription, wanted, client, key):
                request.via = ChangeVia.PATCH
            try:
                with transaction.atomic():
                    request.save()
                    transaction.on_commit(lambda: _cache_call("delete", _patch_kept(subscription)))
            except DatabaseError as exc:
                # raised after the commit: the PATCH's key is kept for the next click
                logger.error(
                    "change request of subscription %s not stored: %s", subscription.pk, exc
                )
                failure = ServiceUnavailable()
    except ServiceUnavailable:  # the PATCH refused (rolled back): the next click sends anew
        _cache_call("delete", _patch_kept(subscription))
        raise
    if failure is not None:
        raise failure
    if request.via == ChangeVia.REQUEST:
        _tell_staff(request)
    return request


def _refuse_beside_a_purchase(subscription: Subscription) -> None:
    """Refuse to resume ``subscription`` while a page of its customer that would renew in its
    place may be paid: of its product (a trial's conversion) or of another plan of its group
    (a change of plan's), open (``checkout_in_the_way``) or come back from and not recorded yet
    (``confirming_in_the_way``). Once paid, ``renews_in_place`` refuses it."""
    product, customer = subscription.product, subscription.customer
    if product is None or customer is None:
        return
    paying = confirming_in_the_way(customer, product)
    session = paying or checkout_in_the_way(customer, product)
    if session is None or session.expires_at is None:
        return
    until = session.expires_at + CONFIRMING_FOR if paying else session.expires_at
    name = session.product.name if session.product is not None else ""
    raise RenewalUnchanged(
        gettext(
            # No period after %(time)s: an English time ends with one ("3:50 a.m.").
            "A purchase of %(plan)s you started would renew in this one's place, so resuming "
            "this one could charge you for both. Your billing page shows %(plan)s once it is "
            "paid; if it is not, you can resume this one after %(time)s"
        )
        % {"plan": name, "time": formats.time_format(timezone.localtime(until))}
    )


def _patch_kept(subscription: Subscription) -> str:
    """Where the shared cache keeps the key of ``subscription``'s last PATCH (``_patch_key``)."""
    return f"billing:renewal:in-doubt:{subscription.pk}"


def _patch_key(subscription: Subscription, auto_renew: bool) -> str:
    """The PATCH's idempotency key, kept in the shared cache until its request is stored: the
    key of the last PATCH of the same ``auto_renew`` whose request was not stored (the
    database failed) while the subscription's row is unchanged since, else a new one. A row
    changed since (an event, a pull) makes it a new write, not a retry."""
    remembered, version = _patch_kept(subscription), str(subscription.remote_updated)
    earlier = _cache_call("get", remembered)
    if (
        isinstance(earlier, dict)
        and earlier.get("auto_renew") is auto_renew
        and earlier.get("version") == version
    ):
        return str(earlier["key"])
    key = str(uuid.uuid4())
    kept = {"key": key, "auto_renew": auto_renew, "version": version}
    _cache_call("set", remembered, kept, PATCH_KEY_KEPT_FOR)
    return key


def _patch(subscription: Subscription, auto_renew: bool, client: Any, key: str) -> bool:
    """The guessed PATCH, sent with ``key`` (``_patch_key``); False when the service refuses
    it (``_refused``) or has no such subscription (``_no_such_subscription``), or when it may
    have been applied unanswered: then the request goes to staff, who check the service."""
    client = client or get_client()
    try:
        client.update_subscription(
            str(subscription.remote_id),
            {"auto_renew": auto_renew},
            idempotency_key=key,
            deadline=interactive_deadline(),
        )
    except BillingError as exc:
        if _no_such_subscription(subscription, exc, client):
            return False
        if _refused(PATCH_AUTO_RENEW, exc):
            return False
        if exc.retryable or exc.in_doubt:
            logger.error("subscription %s: PATCH in doubt (%s)", subscription.remote_id, exc)
            return False
        raise ServiceUnavailable() from exc
    return True


def _no_such_subscription(subscription: Subscription, exc: BillingError, client: Any) -> bool:
    """Whether a 404 on the guessed PATCH may be about this subscription, not the route: the
    documented list (``GET /subscriptions``) does not show it, or could not be read. That
    request goes to staff and the guess stays on; a 404 for a subscription the list shows is
    no such route (``_refused`` switches the guess off)."""
    if not isinstance(exc, BillingAPIError) or exc.status != 404:
        return False
    remote_id = str(subscription.remote_id)
    try:
        found = client.find_subscription(remote_id, deadline=interactive_deadline())
    except BillingError as error:
        logger.warning(
            "billing guess %s kept on: PATCH of subscription %s answered 404, and the list "
            "of subscriptions could not be read to tell why (%s)",
            PATCH_AUTO_RENEW,
            remote_id,
            error,
        )
        return True
    if found is None:
        logger.warning(
            "billing guess %s kept on: subscription %s is not on the service (PATCH answered "
            "404, the list of subscriptions does not show it)",
            PATCH_AUTO_RENEW,
            remote_id,
        )
        return True
    return False


# --- requests: pending, withdrawn, told to staff, settled by the mirror ----------------------
def _pending(subscription: Subscription, kind: str) -> ChangeRequest | None:
    rows = ChangeRequest.objects.filter(subscription=subscription, kind=kind)
    return rows.filter(state=ChangeState.PENDING).select_related("checkout_session").first()


def _withdraw(subscription: Subscription, kind: str) -> None:
    ChangeRequest.objects.filter(
        subscription=subscription, kind=kind, state=ChangeState.PENDING
    ).update(state=ChangeState.WITHDRAWN)


def describe(request: ChangeRequest) -> str:
    """One line for staff: who, what, from what to what (no secret in it)."""
    sub = request.subscription
    customer = request.customer
    who = f"{customer.email or customer.identifier} (customer {customer.remote_id})"
    held = f"{sub.product} {sub.selected_billing_cycle} {sub.selected_currency}"
    if request.kind == ChangeKind.CHANGE_PLAN:
        what = (
            f"change {held} to {request.target_product} {request.target_cycle} "
            f"{request.target_currency} ({request.direction})"
        )
    else:
        what = f"{request.get_kind_display().lower()} of {held}"
    return f"{who}: {what}; subscription {sub.remote_id}"


def _tell_staff(request: ChangeRequest) -> None:
    """Email Django's MANAGERS; the admin's change request list shows the same."""
    subject = f"Billing: {request.get_kind_display()} requested"
    body = (
        f"{describe(request)}.\n\nDo it on the billing service, then mark the request "
        "'done on the service' in the admin (Change requests). It is shown done to the "
        "customer once the service shows it (an event or the next pull)."
    )
    try:
        mail_managers(subject, body)
    except Exception as exc:  # the request is recorded and listed in the admin anyway
        logger.error("change request %s: staff email not sent (%s)", request.pk, exc)


def _carrier(request: ChangeRequest) -> Subscription | None:
    """The subscription that shows a plan change done: the target option, active."""
    target = Subscription.objects.active().filter(
        customer=request.customer,
        product=request.target_product,
        selected_billing_cycle=request.target_cycle,
    )
    for sub in target.order_by("-cycle_start_date", "-pk"):
        if currencies.label(sub.selected_currency) == request.target_currency:
            return sub
    return None


def settle(customer: Customer | None) -> None:
    """Confirm the customer's pending requests the mirror shows done; alert staff about plans
    renewing twice. Reads the mirror only (never the service)."""
    if customer is None:
        return
    now = timezone.now()
    pending = ChangeRequest.objects.filter(customer=customer, state=ChangeState.PENDING)
    for request in pending.select_related("subscription"):
        sub = request.subscription
        if request.kind == ChangeKind.STOP_RENEWAL:
            done = not sub.auto_renew
        elif request.kind == ChangeKind.RESUME:
            done = sub.auto_renew and sub.is_active
        else:
            carrier = _carrier(request)
            in_place = carrier is not None and carrier.pk == sub.pk
            done = carrier is not None and (in_place or not may_renew(sub))
            request.new_subscription = carrier
        if done:
            request.state, request.confirmed_at = ChangeState.CONFIRMED, now
            request.save(update_fields=["state", "confirmed_at", "new_subscription"])
    for pair in doubled_plans(customer):
        _alert(pair)


def alert_doubled_plans() -> int:
    """Staff's urgent email for every customer found with two plans of a group renewing (at
    most once a day each); the number of such customers."""
    found = doubled_plans()
    for subs in found:
        _alert(subs)
    return len(found)


def doubled_plans(customer: Customer | None = None) -> list[list[Subscription]]:
    """Groups of two or more renewing plans of one plan group held by one customer."""
    rows = Subscription.objects.active().filter(
        auto_renew=True,
        customer__isnull=False,
        product__product_type=ProductType.SUBSCRIPTION,
        product__add_on=False,
    )
    if customer is not None:
        rows = rows.filter(customer=customer)
    groups: dict[tuple[int, str], list[Subscription]] = {}
    for sub in rows.select_related("product", "customer").order_by("cycle_start_date", "pk"):
        assert sub.product is not None and sub.customer_id is not None
        groups.setdefault((sub.customer_id, sub.product.plan_group), []).append(sub)
    return [subs for subs in groups.values() if len(subs) > 1]


def _alert(subs: list[Subscription]) -> None:
    """An urgent email to staff, at most once a day per set of subscriptions. With the shared
    cache down, whether it was sent today cannot be told: it is not sent (logged), rather than
    sent on every billing page view."""
    key = "billing:doubled-plans:" + ":".join(str(s.pk) for s in subs)
    logger.error("URGENT: plans renewing twice for one customer: %s", [s.remote_id for s in subs])
    try:
        first = shared_cache().add(key, 1, timeout=ALERT_EVERY)
    except Exception as exc:
        logger.error(
            "doubled plans: staff email not sent, the shared cache is unavailable (%s) so "
            "whether it was sent today is not known",
            type(exc).__name__,
        )
        return
    if not first:
        return
    customer = subs[0].customer
    lines = "\n".join(
        f"- {s.product} {s.selected_billing_cycle} {s.selected_currency}, subscription "
        f"{s.remote_id}, started {s.cycle_start_date}"
        for s in subs
    )
    who = customer.email or customer.identifier if customer is not None else "?"
    try:
        mail_managers(
            "URGENT billing: a customer has two plans renewing",
            f"{who} has {len(subs)} plans of one group renewing:\n{lines}\n\n"
            "Stop the older one's renewal on the billing service now, or the customer pays twice.",
        )
    except Exception as exc:
        logger.error("doubled plans: staff email not sent (%s)", exc)


def requests_for(customer: Customer | None) -> list[ChangeRequest]:
    """The customer's pending requests, newest first (the billing page)."""
    if customer is None:
        return []
    rows = ChangeRequest.objects.filter(customer=customer, state=ChangeState.PENDING)
    return list(rows.select_related("target_product", "subscription"))


def mark_done_by_staff(requests: Any) -> int:
    """Staff did the requests on the service; still shown pending until the service shows it."""
    return int(
        requests.filter(state=ChangeState.PENDING, staff_done_at__isnull=True).update(
            staff_done_at=timezone.now()
        )
    )


# --- what the probe of issue 26 calls (write mode) -------------------------------------------
def probe_change_action(
    action: str,
    customer: Customer,
    product: Product,
    cycle: Any = None,
    currency: Any = None,
    *,
    client: Any = None,
) -> bool | None:
    """Is ``action`` accepted by ``POST /checkout_sessions``? Creates one session (it expires
    unpaid; by default for the product's first cycle). True: accepted; False: refused as the
    app switches the guess off (``refuses_guess``); None: no answer to go by."""
    first = product.cycles.order_by("pk").first()
    selection = validate_selection(product, cycle or (first.code if first else None), currency)
    client = client or get_client()
    try:
        _create_session(customer, selection, client, interactive_deadline(), action=action)
    except CheckoutError as exc:
        return False if _refuses(CHANGE_ACTION, exc.__cause__) else None
    return True


def probe_patch_subscription(subscription: Subscription, *, client: Any = None) -> bool | None:
    """Does ``PATCH /subscriptions/{id}`` exist? Sends the subscription's own ``auto_renew``
    (a change of nothing). True: answered 2xx; False: refused as the app switches the guess
    off (``refuses_guess``); None: no answer to go by."""
    client = client or get_client()
    try:
        client.update_subscription(
            str(subscription.remote_id), {"auto_renew": bool(subscription.auto_renew)}
        )
    except BillingError as exc:
        return False if _refuses(PATCH_AUTO_RENEW, exc) else None
    return True


def _refuses(name: str, exc: BaseException | None) -> bool:
    return isinstance(exc, BillingAPIError) and refuses_guess(name, exc.status, exc.body)
