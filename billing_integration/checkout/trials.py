"""Free trials: a subscription pushed with ``trial_end_date`` (``POST /subscriptions``), under
the checkout's rules (published product, one plan at a time, one purchase, no open checkout
in the way, double clicks)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.db import router, transaction
from django.utils import timezone
from django.utils.translation import gettext, gettext_lazy

from .. import currencies
from ..access import _is_subscriber
from ..client import interactive_deadline
from ..client.retry import Deadline
from ..conf import checked
from ..customers import ensure_customer_pushed, ensure_pushed, get_or_create_customer
from ..exceptions import BillingError
from ..models import Customer, Product, Subscription
from ..models.subscriptions import KNOWN_INACTIVE_STATUSES, PAUSED_STATUS
from .services import (
    AlreadySubscribed,
    CheckoutError,
    CheckoutInProgress,
    CheckoutSelection,
    NoSubscriber,
    PaymentBeingConfirmed,
    PlanAlreadyHeld,
    ProductUnavailable,
    ServiceUnavailable,
    _lock_customer,
    _refuse_if_service_down,
    _refused,
    _translate,
    _trials_in_progress,
    check_selection,
    checkout_in_the_way,
    confirming_in_the_way,
    fresh_product,
    holds_paid,
    refuse_beside,
    trial_in_the_way,
)

logger = logging.getLogger("billing_integration.checkout")

#: ``BILLING['TRIALS']``'s keys and defaults (a key left out keeps its default).
TRIAL_DEFAULTS: dict[str, Any] = {"repeat": False, "notice_days": 3}
#: The longest trial ``start_trial`` starts, in days.
MAX_TRIAL_DAYS = 366
#: Statuses of a trial closed on the service: a new start does not return it (``paused`` may
#: be resumed: not closed).
CLOSED_TRIAL = tuple(s for s in KNOWN_INACTIVE_STATUSES if s != PAUSED_STATUS)
#: Trials the service refused a customer may have in 24 hours; past it a start is refused here
#: (each one calls the service and stores a failed trial and its outbox entry).
MAX_REFUSED_TRIALS_PER_DAY = 5


class TrialNotOffered(CheckoutError):
    status = 409
    code = "trial_not_offered"
    default_message = gettext_lazy("This product offers no free trial.")


class TrialAlreadyUsed(CheckoutError):
    status = 409
    code = "trial_used"
    default_message = gettext_lazy(
        "You have already had a free trial of this product. You can subscribe to it."
    )


class TooManyTrials(CheckoutError):
    status = 429
    code = "too_many_trials"
    default_message = gettext_lazy(
        "You have tried to start too many free trials in the last 24 hours. "
        "Please try again tomorrow, or contact us."
    )


def _within_trial_quota(customer: Customer) -> None:
    """Refuse a new trial once the service refused ``MAX_REFUSED_TRIALS_PER_DAY`` of
    ``customer``'s in 24 hours. Called under the customer's lock."""
    since = timezone.now() - timedelta(days=1)
    trials = Subscription.objects.for_customer(customer).filter(
        trial_end_date__isnull=False, created_at__gte=since
    )
    refused = trials.filter(_refused()).count()
    if refused >= MAX_REFUSED_TRIALS_PER_DAY:
        logger.warning("customer %s: trial refused, %s refused in 24 hours", customer.pk, refused)
        raise TooManyTrials()


#: What ``BILLING['TRIALS']`` must be (check E051).
TRIALS_SHAPE = "a dict with 'repeat' (True/False) and 'notice_days' (a positive integer)"


def trials_ok(value: Any) -> bool:
    """``BILLING['TRIALS']``: known keys only, ``repeat`` a bool, ``notice_days`` >= 1."""
    if not isinstance(value, dict) or set(value) - set(TRIAL_DEFAULTS):
        return False
    days = value.get("notice_days", 1)
    return isinstance(value.get("repeat", False), bool) and (
        isinstance(days, int) and not isinstance(days, bool) and days >= 1
    )


def trial_settings() -> dict[str, Any]:
    """``BILLING['TRIALS']`` over ``TRIAL_DEFAULTS``; raises on a malformed one (a ``"False"``
    read from the environment is truthy: it would allow repeated trials)."""
    return {**TRIAL_DEFAULTS, **checked("TRIALS", trials_ok, TRIALS_SHAPE)}


def trial_products(subscriber: Any) -> set[int]:
    """The pks of the products the subscriber had (or has) a trial of; a trial the service
    refused (its push failed, not in doubt) does not count."""
    rows = Subscription.objects.for_subscriber(subscriber).filter(trial_end_date__isnull=False)
    return set(rows.exclude(_refused()).values_list("product_id", flat=True))


def had_trial(subscriber: Any, product: Product) -> bool:
    """Whether the subscriber had (or has) a trial of ``product`` (``trial_products``)."""
    return product.pk in trial_products(subscriber)


def _trial_days(product: Product, days: Any) -> int:
    value = product.trial_days if days is None else days
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:  # None too
        raise TrialNotOffered()
    if value > MAX_TRIAL_DAYS:
        raise TrialNotOffered(
            gettext("A free trial lasts at most %(days)s days.") % {"days": MAX_TRIAL_DAYS},
            code="trial_too_long",
        )
    return value


def check_trial(
    product: Product, cycle: Any = None, currency: Any = None, days: int | None = None
) -> tuple[CheckoutSelection, int]:
    """What ``start_trial`` checks of the product and the choice (not of the subscriber), on
    ``product`` as it is (``check_selection``): the selection and the trial's length in days;
    raises a ``CheckoutError``. ``{% billing_trial_button %}`` offers a trial only past it."""
    if product.is_one_time:
        raise TrialNotOffered(gettext("A one-time product has no free trial."))
    if not product.blueprint_known or not product.cycles.exists():
        raise ProductUnavailable(
            gettext("The billing cycles of this product are not known here yet."),
            code="cycles_unknown",
        )
    selection = check_selection(product, cycle, currency)
    return selection, _trial_days(product, days)


def start_trial(
    subscriber: Any,
    product: Any,
    cycle: Any = None,
    currency: Any = None,
    days: int | None = None,
    *,
    auto_renew: bool = False,
    wait: bool = True,
    client: Any = None,
    deadline: Deadline | None = None,
) -> Subscription:
    """Start a free trial of ``product`` for ``subscriber`` and return its ``Subscription``
    (docs/trials.md). With ``wait`` (a person waits) the pushes happen within
    ``BILLING['INTERACTIVE_DEADLINE']``; one not done in time is finished by the outbox, and
    the subscription returned has no ``remote_id`` yet. Raises a ``CheckoutError``."""
    if not _is_subscriber(subscriber):  # none, anonymous or inactive (access refuses it)
        raise NoSubscriber()
    selection, length = check_trial(fresh_product(product), cycle, currency, days)
    wanted = selection.product
    if holds_paid(subscriber, wanted):
        raise AlreadySubscribed()
    refuse_beside(subscriber, wanted)
    if wait:
        deadline = deadline or interactive_deadline()
    _refuse_if_service_down("trial", client, known_down=wait)

    customer, _ = get_or_create_customer(subscriber)
    if wait:
        try:
            customer = ensure_customer_pushed(customer, deadline=deadline)
        except BillingError as exc:
            raise _translate(exc, "create_customer") from exc

    # One trial per customer and product at a time: a double click finds the first one's.
    with transaction.atomic(using=router.db_for_write(Subscription)):
        _lock_customer(customer)
        # a trial the service closed before its end is no double click's to return
        running = _trials_in_progress(customer).exclude(status__in=CLOSED_TRIAL)
        existing = running.for_product(wanted).first()
        if existing is not None:
            existing.reused = True
            return existing
        if (other := trial_in_the_way(customer, wanted)) is not None:
            raise PlanAlreadyHeld(other, wanted)
        if (paying := confirming_in_the_way(customer, wanted)) is not None:
            raise PaymentBeingConfirmed(paying)
        if (rival := checkout_in_the_way(customer, wanted)) is not None:
            raise CheckoutInProgress(rival)
        if not trial_settings()["repeat"] and had_trial(subscriber, wanted):
            raise TrialAlreadyUsed()
        _within_trial_quota(customer)
        end = timezone.now() + timedelta(days=length)
        subscription = Subscription(
            customer=customer,
            product=wanted,
            product_remote_id=wanted.remote_id,
            customer_remote_id=customer.remote_id,
            trial_end_date=end.replace(microsecond=end.microsecond // 1000 * 1000),
            auto_renew=bool(auto_renew),
            selected_billing_cycle=selection.cycle_code,
            selected_currency=currencies.currency_code(selection.currency_id),
        )
        subscription.save()  # the outbox entry, pushed on commit
    logger.info(
        "trial of product %s (%s days) recorded for customer %s",
        wanted.remote_id,
        length,
        customer.remote_id or customer.pk,
    )
    if wait:
        try:
            subscription = ensure_pushed(subscription, "create_subscription", deadline=deadline)
        except BillingError as exc:
            failure = _translate(exc, "create_subscription")
            if isinstance(failure, ServiceUnavailable):
                logger.warning("trial %s not pushed in time: the outbox goes on", subscription.pk)
                return subscription
            raise failure from exc
    return subscription
