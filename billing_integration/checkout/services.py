"""Start a hosted checkout: validate the choice, push the customer, create the session."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.contenttypes.models import ContentType
from django.db import DatabaseError, connections, router, transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django.db.models.functions import Lower
from django.http import HttpResponseRedirect
from django.utils import formats, timezone
from django.utils.translation import gettext, gettext_lazy

from .. import currencies
from ..access import (
    _is_subscriber,
    lapsed_may_renew,
    live_subscriptions,
    plan_to_replace,
    resolve_product,
)
from ..client import get_client, interactive_deadline
from ..client.retry import Deadline
from ..conf import EXPIRY, checked, expiry_ok, shared_cache
from ..customers import ensure_customer_pushed, get_or_create_customer
from ..exceptions import (
    BillingAPIError,
    BillingConfigurationError,
    BillingError,
    BillingIdempotencyConflict,
    BillingServiceMismatchError,
    BillingValidationError,
)
from ..mapping import checkout as checkout_map
from ..models import (
    BillingCycle,
    ChangeKind,
    ChangeRequest,
    ChangeState,
    CheckoutSession,
    Customer,
    CycleUnit,
    OutboxEntry,
    Payment,
    PaymentStatus,
    Product,
    ProductStatus,
    ProductType,
    Refund,
    RefundStatus,
    Subscription,
)
from ..models.base import SyncState
from ..models.records import of_customer, of_product
from ..models.subscriptions import CANCELED_STATUSES, PAUSED_STATUS, SubscriptionQuerySet
from ..outbox import from_remote
from ..service import ensure_service

logger = logging.getLogger("billing_integration.checkout")

ACTION_NEW = "new_subscription"
#: Session statuses that say it can no longer be paid (compared in lower case): such a session
#: is not reused. Any other status, ``open`` in any spelling or one not known, is payable.
CLOSED_SESSION = ("expired", "completed", "complete", "canceled", "cancelled")
#: How long after its hosted page closed (``expires_at``) a session the customer came back from
#: (``returned_at``) holds back a purchase that could double it while its outcome is not
#: recorded here (``confirming_sessions``): its events may be late, and no wait is for good.
CONFIRMING_FOR = timedelta(minutes=30)


class CheckoutError(BillingError):
    """A checkout that cannot start: HTTP ``status``, customer ``message``, stable ``code``."""

    status: int = 400
    code: str = "checkout_error"
    default_message = gettext_lazy("The checkout could not be started.")

    def __init__(
        self, message: str | None = None, *, status: int | None = None, code: str | None = None
    ) -> None:
        self.message = message or self.default_message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code
        super().__init__(self.message)


class ProductUnavailable(CheckoutError):
    status = 409
    code = "product_unavailable"
    default_message = gettext_lazy("This product is not available for purchase.")


class InvalidChoice(CheckoutError):
    code = "invalid_choice"
    default_message = gettext_lazy("This billing option is not offered for this product.")


class NoSubscriber(CheckoutError):
    status = 403
    code = "no_subscriber"
    default_message = gettext_lazy(
        "Your account cannot subscribe (no billing account is linked to it)."
    )


class ServiceUnavailable(CheckoutError):
    status = 503
    code = "service_unavailable"
    default_message = gettext_lazy(
        "The payment service is temporarily unavailable. Nothing was charged; please try "
        "again in a few minutes."
    )


class AlreadySubscribed(CheckoutError):
    status = 409
    code = "already_subscribed"
    default_message = gettext_lazy(
        "You already have an active subscription to this product, so there is nothing to "
        "buy. You can see and manage it from your account."
    )


class StillRenewing(AlreadySubscribed):
    """The subscriber's subscription to the product lapsed here but may still renew on the
    service (``access.lapsed_may_renew``): a second one could be billed beside it (409). One
    paused (``paused``) says so: the service may resume it."""

    default_message = gettext_lazy(
        "Your subscription to this product may still renew: the payment service may try its "
        "payment again, so a new purchase could be charged beside it. Stop its renewal from "
        "your billing page, then buy it again."
    )
    paused_message = gettext_lazy(
        "Your subscription to this product is paused, and the payment service may resume it: "
        "a new purchase would then be charged beside it. Stop its renewal from your billing "
        "page, then buy it again."
    )


class AlreadyBought(AlreadySubscribed):
    """A one-time product bought once (``bought_once``): a second purchase is a second charge."""

    code = "already_bought"
    default_message = gettext_lazy(
        "You have already bought this product, so there is nothing to buy. Your billing page "
        "shows your payments."
    )


class PlanAlreadyHeld(CheckoutError):
    """The subscriber holds another plan of the product's group (409), ``held``."""

    status = 409
    code = "plan_held"

    def __init__(self, held: Subscription, wanted: Product) -> None:
        self.held = held
        self.held_name = held.product.name if held.product is not None else ""
        self.wanted_name = wanted.name
        if held.status == PAUSED_STATUS:  # no access, but the service may resume it
            text = gettext(
                "Your %(held)s plan is paused, and the payment service may resume it: "
                "%(wanted)s would then be a second plan charged beside it, so it was not "
                "bought. Stop the renewal of %(held)s from your billing page, then buy "
                "%(wanted)s, or ask us to change your plan."
            )
        else:
            text = gettext(
                "You already have the %(held)s plan, and you can hold one plan at a time: "
                "%(wanted)s would be a second plan beside it, so it was not bought. To move "
                "to %(wanted)s, ask us to change your plan; your billing page shows the plan "
                "you have."
            )
        super().__init__(text % {"held": self.held_name, "wanted": self.wanted_name})


class CheckoutInProgress(CheckoutError):
    """Another checkout of the subscriber that paying beside this one would double is still
    open (409), ``session``: another plan of the group, or the same product in another cycle
    or currency."""

    status = 409
    code = "checkout_open"

    def __init__(self, session: CheckoutSession) -> None:
        self.session = session
        self.open_name = session.product.name if session.product is not None else ""
        until = formats.time_format(timezone.localtime(session.expires_at))
        super().__init__(
            gettext(
                # No period after %(time)s: an English time ends with one ("3:50 a.m.").
                "You have started buying %(plan)s, and its payment page stays open until "
                "%(time)s, so finish that payment or choose again once it has closed: paying "
                "both would buy both."
            )
            % {"plan": self.open_name, "time": until}
        )

    @property
    def open_url(self) -> str:
        """The open session's hosted payment page."""
        return str(get_client().checkout_url(str(self.session.remote_id)))


class PaymentBeingConfirmed(CheckoutError):
    """A session of the subscriber it came back from may have been paid, and its outcome is
    not recorded here yet (``confirming_sessions``): buying ``session``'s product again, or
    another plan of its group, could charge twice (409)."""

    status = 409
    code = "payment_confirming"

    def __init__(self, session: CheckoutSession) -> None:
        self.session = session
        self.product_name = session.product.name if session.product is not None else ""
        until = session.expires_at + CONFIRMING_FOR if session.expires_at else timezone.now()
        super().__init__(
            gettext(
                # No period after %(time)s: an English time ends with one ("3:50 a.m.").
                "Your payment for %(product)s is being confirmed, so this purchase was not "
                "started: both could be charged. Your billing page shows it once it is "
                "confirmed; if it was not taken, you can buy again after %(time)s"
            )
            % {
                "product": self.product_name,
                "time": formats.time_format(timezone.localtime(until)),
            }
        )


class CheckoutRefused(CheckoutError):
    status = 502
    code = "checkout_refused"
    default_message = gettext_lazy(
        "The payment service refused to start this checkout. Please try again later."
    )


@dataclass(frozen=True)
class CheckoutSelection:
    """A validated choice; ``cycle`` is ``None`` for a one-time product."""

    product: Product
    cycle: BillingCycle | None
    currency_id: int

    @property
    def cycle_code(self) -> str:
        return self.cycle.code if self.cycle is not None else ""


def _unknown_cycle(code: str) -> InvalidChoice:
    return InvalidChoice(
        gettext("The billing cycle %(cycle)s is not offered for this product.")
        % {"cycle": repr(code[:32])},
        code="unknown_cycle",
    )


def _not_confirmed() -> ProductUnavailable:
    return ProductUnavailable(
        gettext(
            "This billing option is not on sale yet: the payment service has not confirmed "
            "it. Please try again later."
        ),
        code="option_not_confirmed",
    )


def validate_selection(product: Any, cycle: Any = None, currency: Any = None) -> CheckoutSelection:
    """Check a product / cycle / currency choice against the local catalogue, the product
    read afresh (``check_selection``)."""
    return check_selection(fresh_product(product), cycle, currency)


def fresh_product(product: Any) -> Product:
    """``product`` (an instance, a pk, a remote id or a name) read afresh from the database;
    ``ProductUnavailable`` (404) if there is none."""
    resolved = product if isinstance(product, Product) else None
    if resolved is None and product not in (None, ""):
        try:
            resolved = resolve_product(product)
        except (ValueError, TypeError):
            resolved = None
    if resolved is None:
        raise ProductUnavailable(
            gettext("This product does not exist."), status=404, code="product_not_found"
        )
    if resolved.pk is not None:
        resolved.refresh_from_db()
    return resolved


def check_selection(
    resolved: Product, cycle: Any = None, currency: Any = None
) -> CheckoutSelection:
    """``validate_selection``'s rule on ``resolved`` as it is: its cycles and prices are read
    through its relations (``prefetch_related`` ones are not read again), so a page of buttons
    asks it without a query per button."""
    # What the service is known to sell: a status change it refused is not on sale.
    status = resolved.confirmed_status
    if status == ProductStatus.ARCHIVED:
        raise ProductUnavailable(
            gettext("This product has been retired and can no longer be bought."),
            code="product_archived",
        )
    if status != ProductStatus.PUBLISHED:
        raise ProductUnavailable(
            gettext("This product is not on sale yet."), code="product_not_published"
        )
    if resolved.remote_id is None:
        raise ProductUnavailable(
            gettext(
                "This product is not available for purchase yet. Please try again in a minute."
            ),
            code="product_not_synced",
        )

    chosen_cycle: BillingCycle | None = None
    if not resolved.is_one_time:
        if isinstance(cycle, BillingCycle):
            if cycle.product_id != resolved.pk:  # another product's: never this one's only cycle
                raise _unknown_cycle(cycle.code)
            code = cycle.code
        else:
            code = str(cycle or "").strip()
        if not code:
            cycles = list(resolved.cycles.all()[:2])
            if len(cycles) != 1:
                raise InvalidChoice(gettext("Choose a billing cycle."), code="cycle_required")
            chosen_cycle = cycles[0]
        else:
            unit, _, freq = code.partition("-")
            if unit in CycleUnit.values and freq.isascii() and freq.isdigit() and len(freq) < 6:
                found = (
                    c for c in resolved.cycles.all() if (c.unit, c.frequency) == (unit, int(freq))
                )
                chosen_cycle = next(found, None)
            if chosen_cycle is None:
                raise _unknown_cycle(code)

    offered = [int(c) for c in (resolved.selected_currencies or []) if currencies.is_id(c)]
    prices = resolved.root_prices.all() if chosen_cycle is None else chosen_cycle.prices.all()
    priced = {price.currency_id for price in prices}
    # What the service confirmed holding (its hosted page charges that): a cycle or price
    # added or changed here is sold once the push that carried it is acknowledged.
    sold = resolved.sold_prices(chosen_cycle)
    if currency in (None, ""):
        usable = [c for c in offered if c in sold]
        if not usable:
            if any(c in priced for c in offered):
                raise _not_confirmed()
            raise InvalidChoice(
                gettext("This product has no price in any currency."), code="no_price"
            )
        currency_id = usable[0]
    else:
        try:
            currency_id = currencies.currency_id(currency)
        except BillingConfigurationError:
            raise InvalidChoice(
                gettext("The currency %(currency)s is not offered.")
                % {"currency": repr(str(currency)[:16])}
            ) from None
        if currency_id not in offered or currency_id not in priced:
            code_text = currencies.label(currency_id)
            raise InvalidChoice(
                gettext("This product is not sold in %(currency)s.") % {"currency": code_text},
                code="unknown_currency",
            )
        if currency_id not in sold:
            raise _not_confirmed()
    return CheckoutSelection(product=resolved, cycle=chosen_cycle, currency_id=currency_id)


def holds_paid(subscriber: Any, product: Product) -> bool:
    """A subscription to ``product`` bought (``Subscription.bought``): a trial that does not
    renew by itself may be converted (bought), and so may a canceled subscription in its grace
    period."""
    return any(s.bought for s in live_subscriptions(subscriber, product))


def bought_once(subscriber: Any, product: Product) -> bool:
    """Whether ``subscriber`` paid for ``product``, a one-time product sold once (not
    ``multiple_purchases``): a completed payment of its customer for it, not refunded (an
    approved refund). No subscription ever holds a one-time product: its payment does."""
    if not product.is_one_time or product.multiple_purchases:
        return False
    paid = _kept_payments(Customer.objects.filter(subscriber=subscriber).first())
    return paid.filter(of_product(product)).exists()


def bought_products(customer: Customer | None) -> set[Any]:
    """What ``bought_once`` reads, for a page of buttons in one query: the pks and the remote
    ids of the products ``customer`` paid for, not refunded (``is_bought`` asks it)."""
    rows = _kept_payments(customer)
    found: set[Any] = set()
    for pk, remote_id in rows.values_list("product_id", "product_remote_id"):
        found |= {key for key in (pk, remote_id) if key is not None}
    return found


def is_bought(bought: set[Any], product: Product) -> bool:
    """``bought_once`` over ``bought`` (``bought_products``)."""
    if not product.is_one_time or product.multiple_purchases:
        return False
    return product.pk in bought or (product.remote_id is not None and product.remote_id in bought)


def _kept_payments(customer: Customer | None) -> QuerySet[Payment]:
    """The completed payments of ``customer`` (by row or remote id) not refunded (an approved
    refund)."""
    if customer is None:
        return Payment.objects.none()
    refunded = Refund.objects.filter(
        Q(payment=OuterRef("pk")) | Q(payment_remote_id=OuterRef("remote_id")),
        status=RefundStatus.APPROVED,
    )
    paid = Payment.objects.filter(of_customer(customer), status=PaymentStatus.COMPLETED)
    return paid.exclude(Exists(refunded))


def refuse_beside(subscriber: Any, product: Product) -> None:
    """Refuse a new subscription to ``product`` (a checkout or a trial) that could be billed
    beside one the subscriber has: its own lapsed one that may still renew (``StillRenewing``),
    or another plan of its group (``PlanAlreadyHeld``); a paused one with ``auto_renew`` on
    counts (``access.may_renew``: the service may resume it), and its refusal says so."""
    if (lapsed := lapsed_may_renew(subscriber, product)) is not None:
        paused = lapsed.status == PAUSED_STATUS
        raise StillRenewing(str(StillRenewing.paused_message) if paused else None)
    if (held := plan_to_replace(subscriber, product)) is not None:
        raise PlanAlreadyHeld(held, product)


def _error_codes(node: Any, depth: int = 0) -> set[str]:
    """The ``code`` strings anywhere in an error body of unknown shape."""
    if depth > 4 or not isinstance(node, dict | list):
        return set()
    items = node.items() if isinstance(node, dict) else enumerate(node[:20])
    found: set[str] = set()
    for key, value in items:
        code = key == "code" and isinstance(value, str)
        found |= {value} if code else _error_codes(value, depth + 1)
    return found


def _translate(exc: BillingError, operation: str) -> CheckoutError:
    """A ``CheckoutError`` for a failure of the service (logged without secrets)."""
    if isinstance(exc, CheckoutError):
        return exc
    if isinstance(exc, BillingValidationError):
        codes = _error_codes(exc.body)
        for code in ("product_archived", "product_not_published"):
            if code in codes:
                logger.warning("checkout refused by the service (%s): %s", operation, code)
                return ProductUnavailable(code=code)
        logger.error("checkout: the service refused %s: %s", operation, exc)
        return CheckoutRefused()
    if isinstance(exc, BillingAPIError) and not exc.retryable and exc.status not in (401, 403):
        logger.error("checkout: %s failed: %s", operation, exc)
        return CheckoutRefused()
    logger.error("checkout: %s failed, service unavailable: %s", operation, exc)
    return ServiceUnavailable()


def _refuse_if_service_down(what: str, client: Any, *, known_down: bool = True) -> None:
    """Refuse ``what`` (a checkout, a trial) while the service is known down (``known_down``),
    or when it is not the service this database mirrors."""
    if known_down and (client or get_client()).known_down():
        logger.warning("%s refused at once: the billing service is known to be down", what)
        raise ServiceUnavailable()
    try:
        ensure_service(client=client)
    except BillingServiceMismatchError as exc:
        logger.error("%s refused: %s", what, exc)
        raise ServiceUnavailable() from exc


def _lock_customer(customer: Customer) -> None:
    """Serialise the customer's checkouts until the transaction ends (row lock or no-op update)."""
    using = router.db_for_write(Customer)
    rows = Customer.objects.using(using).filter(pk=customer.pk)
    if connections[using].features.has_select_for_update:
        list(rows.select_for_update().values_list("pk", flat=True))
    else:
        rows.update(updated_at=F("updated_at"))


def _reusable_session(customer: Customer, selection: CheckoutSelection) -> CheckoutSession | None:
    """The open session for the same choice, unexpired and with no completed payment for its
    product, nor subscription to it, since: the service sells a session until it expires, so
    one with seconds left, or one whose payment was declined, is still payable and a second
    one beside it could be paid too. Any ``status`` but a closed one (``CLOSED_SESSION``, in any
    case) is open: a session answered ``OPEN``, ``pending`` or with none is payable all the
    same, and a second one beside it too."""
    session = (
        CheckoutSession.objects.filter(
            customer=customer,
            product=selection.product,
            action=ACTION_NEW,
            selected_billing_cycle=selection.cycle_code,
            selected_currency=selection.currency_id,
            completed_at__isnull=True,
            remote_id__isnull=False,
            expires_at__gt=timezone.now(),
        )
        .annotate(status_lower=Lower("status"))
        .exclude(status_lower__in=CLOSED_SESSION)
        .order_by("-created_at", "-pk")
        .first()
    )
    if session is None:
        return None
    # A completed payment for this product (or for one not known) since: the session was used.
    # One for another product, or a declined one, leaves it open, still payable.
    paid_since = Payment.objects.filter(
        Q(customer=customer) | Q(customer_remote_id=customer.remote_id),
        Q(product_remote_id=selection.product.remote_id) | Q(product_remote_id__isnull=True),
        status=PaymentStatus.COMPLETED,
        created_at__gte=session.created_at,
    ).exists()
    subscribed_since = Subscription.objects.filter(
        customer=customer, product=selection.product, created_at__gte=session.created_at
    ).exists()
    return None if paid_since or subscribed_since else session


def session_closed(session: CheckoutSession) -> bool:
    """Whether ``session`` can no longer be paid, so is never reused: expired here
    (``expires_at`` passed), completed, or of a closed status (``CLOSED_SESSION``, any case)."""
    return (
        session.completed_at is not None
        or (session.expires_at is not None and session.expires_at <= timezone.now())
        or session.status.strip().lower() in CLOSED_SESSION
    )


def checkout_in_the_way(
    customer: Customer,
    product: Product,
    selection: CheckoutSelection | None = None,
    action: str = ACTION_NEW,
) -> CheckoutSession | None:
    """The customer's open session that buying ``product`` beside it could double
    (``session_in_the_way`` over ``open_sessions``)."""
    return session_in_the_way(open_sessions(customer), product, selection, action)


def open_sessions(customer: Customer) -> QuerySet[CheckoutSession]:
    """The customer's sessions that could still be paid, latest expiry first: not completed,
    not expired and not paid (no subscription to its product since it started). Their
    ``status`` is not read: sessions are not read back, and a spelling other than ``open``
    must not let a second checkout through."""
    return (
        CheckoutSession.objects.filter(
            customer=customer,
            completed_at__isnull=True,
            remote_id__isnull=False,
            expires_at__gt=timezone.now(),
        )
        .exclude(
            Exists(
                Subscription.objects.filter(
                    customer=customer,
                    product=OuterRef("product"),
                    created_at__gte=OuterRef("created_at"),
                )
            )
        )
        .select_related("product")
        .order_by("-expires_at", "-pk")
    )


def confirming_sessions(customer: Customer) -> QuerySet[CheckoutSession]:
    """The customer's sessions that may have been paid while the mirror does not show it yet:
    sessions it came back from (``returned_at``, the return page) until ``CONFIRMING_FOR``
    after their page closed, with no outcome recorded since they started: no subscription to
    their product, no completed payment for a one-time product (its payment holds it,
    ``bought_once``), no failed or canceled payment for it unless a completed one too (a
    subscription's completed payment is not its subscription yet)."""
    since = OuterRef("created_at")
    payments = Payment.objects.filter(
        of_customer(customer),
        Q(product=OuterRef("product")) | Q(product_remote_id=OuterRef("product__remote_id")),
        created_at__gte=since,
    )
    paid = Exists(payments.filter(status=PaymentStatus.COMPLETED))
    declined = Exists(payments.filter(status__in=(PaymentStatus.FAILED, PaymentStatus.CANCELED)))
    subscribed = Exists(
        Subscription.objects.filter(
            customer=customer, product=OuterRef("product"), created_at__gte=since
        )
    )
    return (
        CheckoutSession.objects.filter(
            customer=customer,
            returned_at__isnull=False,
            remote_id__isnull=False,
            expires_at__gt=timezone.now() - CONFIRMING_FOR,
        )
        .exclude(subscribed)
        .exclude(paid & Q(product__product_type=ProductType.ONE_TIME))
        .exclude(declined & ~paid)
        .select_related("product")
        .order_by("-expires_at", "-pk")
    )


def confirming_in_the_way(customer: Customer, product: Product) -> CheckoutSession | None:
    """The customer's session that may have been paid (``confirming_sessions``) that buying
    ``product`` could double: of ``product`` itself (unless it may be bought more than once,
    whatever the cycle, currency or action) or of another plan of its group."""
    return session_in_the_way(confirming_sessions(customer), product)


def session_in_the_way(
    sessions: Iterable[CheckoutSession],
    product: Product,
    selection: CheckoutSelection | None = None,
    action: str = ACTION_NEW,
) -> CheckoutSession | None:
    """The first of ``sessions`` (``open_sessions``, read with their products) that buying
    ``product`` beside it could double: one of another plan of ``product``'s group
    (``access.held_plan``'s rule), or of ``product`` itself unless it may be bought more than
    once. The session of ``selection`` itself with the same ``action`` (a double click, reused
    or replaced) is not in the way; one of another action (a change of plan's page, a new
    purchase's) is."""
    for session in sessions:
        if selection is not None and (
            session.product_id,
            session.selected_billing_cycle,
            session.selected_currency,
            session.action,
        ) == (selection.product.pk, selection.cycle_code, selection.currency_id, action):
            continue
        if session.product_id == product.pk:
            if not product.multiple_purchases:
                return session
        elif (
            product.is_plan
            and session.product is not None
            and session.product.is_plan
            and session.product.plan_group == product.plan_group
        ):
            return session
    return None


def _refused() -> Q:
    """Subscriptions the service refused: their push failed, not in doubt (a push in doubt
    may have created the subscription; its retry keeps its key)."""
    in_doubt = OutboxEntry.objects.filter(
        content_type=ContentType.objects.get_for_model(Subscription),
        object_id=OuterRef("pk"),
        in_doubt=True,
    )
    return Q(sync_state=SyncState.FAILED) & ~Q(Exists(in_doubt))


def _trials_in_progress(customer: Customer) -> SubscriptionQuerySet:
    """The customer's trials still running or not pushed yet (then with no status), each with
    ``resume_asked``: a resume of it asked (``checkout.changes.resume``) and not shown done."""
    resume = ChangeRequest.objects.filter(
        subscription=OuterRef("pk"), kind=ChangeKind.RESUME, state=ChangeState.PENDING
    )
    return (
        Subscription.objects.for_customer(customer)
        .filter(trial_end_date__gt=timezone.now())
        .exclude(_refused())
        .annotate(resume_asked=Exists(resume))
        .select_related("product")
        .order_by("-created_at", "-pk")
    )


def trial_in_the_way(customer: Customer, product: Product) -> Subscription | None:
    """The customer's trial of another plan of ``product``'s group, running or not confirmed
    yet (``held_plan`` reads statuses: a trial not pushed yet has none), or started by a
    request at the same moment: buying or trying ``product`` beside it is a second plan."""
    return trial_of_another_plan(_trials_in_progress(customer), product)


def trial_of_another_plan(trials: Iterable[Subscription], product: Product) -> Subscription | None:
    """``trial_in_the_way`` over ``trials`` (``_trials_in_progress``, read with products)."""
    if not product.is_plan:
        return None
    return next(
        (
            trial
            for trial in trials
            if trial.product_id != product.pk
            and trial.status not in CANCELED_STATUSES
            and trial.product is not None
            and trial.product.is_plan
            and trial.product.plan_group == product.plan_group
        ),
        None,
    )


def renewing_trial(trials: Iterable[Subscription], product: Product) -> bool:
    """Whether one of ``trials`` (``_trials_in_progress``) is of ``product`` and renews by itself
    (``auto_renew``, or a resume of it asked: the service may have taken it before the mirror
    shows it), confirmed or not pushed yet: its end bills the first period, so a checkout
    beside it would be billed too (``Subscription.bought`` reads confirmed statuses only)."""
    return any(
        t.product_id == product.pk
        and (t.auto_renew or getattr(t, "resume_asked", False))
        and t.status not in CANCELED_STATUSES
        for t in trials
    )


def _cache_call(method: str, *args: Any) -> Any:
    """``method`` of the shared cache; a cache that fails only loses the replay (logged)."""
    try:
        return getattr(shared_cache(), method)(*args)
    except Exception as exc:
        logger.warning("checkout: shared cache unavailable (%s)", type(exc).__name__)
        return None


def start_checkout(
    subscriber: Any,
    product: Any,
    cycle: Any = None,
    currency: Any = None,
    *,
    client: Any = None,
    deadline: Deadline | None = None,
) -> CheckoutSession:
    """Start a hosted checkout for ``subscriber`` and return the recorded ``CheckoutSession``."""
    deadline = deadline or interactive_deadline()
    if not _is_subscriber(subscriber):  # none, anonymous or inactive (access refuses it)
        raise NoSubscriber()
    selection = validate_selection(product, cycle, currency)
    if not selection.product.multiple_purchases and holds_paid(subscriber, selection.product):
        raise AlreadySubscribed()
    if bought_once(subscriber, selection.product):
        raise AlreadyBought()
    refuse_beside(subscriber, selection.product)
    _refuse_if_service_down("checkout", client)

    # Created if needed, then pushed within the deadline (else the outbox finishes it).
    try:
        customer, _ = get_or_create_customer(subscriber)
        customer = ensure_customer_pushed(customer, deadline=deadline)
    except BillingError as exc:
        raise _translate(exc, "create_customer") from exc
    if customer.remote_id is None:  # pragma: no cover - ensure_customer_pushed raises instead
        raise ServiceUnavailable()

    # Kept before the transaction: a database cache keeps it if the transaction is lost.
    attempt = attempt_for(customer, selection)
    try:
        return _start(customer, selection, client, deadline, attempt)
    finally:
        forget_unsent(attempt)


def _start(
    customer: Customer,
    selection: CheckoutSelection,
    client: Any,
    deadline: Deadline,
    attempt: Attempt,
) -> CheckoutSession:
    """``start_checkout`` once the customer is pushed: the session, reused or new."""
    # One checkout per customer at a time: a double click finds the first one's session.
    with transaction.atomic(using=router.db_for_write(CheckoutSession)):
        _lock_customer(customer)
        if (paying := confirming_in_the_way(customer, selection.product)) is not None:
            raise PaymentBeingConfirmed(paying)
        existing = _reusable_session(customer, selection)
        if existing is not None:
            existing.reused = True
            logger.info(
                "checkout session %s reused for customer %s (a repeated request)",
                existing.remote_id,
                customer.remote_id,
            )
            return existing
        if (rival := checkout_in_the_way(customer, selection.product, selection)) is not None:
            raise CheckoutInProgress(rival)
        trials = list(_trials_in_progress(customer))
        if not selection.product.multiple_purchases and renewing_trial(trials, selection.product):
            raise AlreadySubscribed()
        if (trial := trial_of_another_plan(trials, selection.product)) is not None:
            raise PlanAlreadyHeld(trial, selection.product)
        failure: CheckoutError | None = None
        try:
            session = _create_session(
                customer, selection, client or get_client(), deadline, attempt=attempt
            )
        except CheckoutError as exc:
            failure = exc  # raised after the commit: what it remembered must not roll back
    if failure is not None:
        raise failure
    logger.info(
        "checkout session %s started for customer %s, product %s (%s, currency %s)",
        session.remote_id,
        customer.remote_id,
        selection.product.remote_id,
        selection.cycle_code or "one-time",
        selection.currency_id,
    )
    return session


def checkout_url(
    subscriber: Any, product: Any, cycle: Any = None, currency: Any = None, **kwargs: Any
) -> str:
    """The hosted checkout page's URL (raises a ``CheckoutError`` as ``start_checkout`` does)."""
    session = start_checkout(subscriber, product, cycle, currency, **kwargs)
    return str((kwargs.get("client") or get_client()).checkout_url(str(session.remote_id)))


def checkout_redirect(
    subscriber: Any, product: Any, cycle: Any = None, currency: Any = None, **kwargs: Any
) -> HttpResponseRedirect:
    return HttpResponseRedirect(checkout_url(subscriber, product, cycle, currency, **kwargs))


@dataclass
class Attempt:
    """A session's idempotency key and expiry (its body's ``expires_at``), kept in the shared
    cache under ``remembered`` until the session is stored here (``attempt_for``). ``new``:
    made by this request, not an earlier attempt's; ``sent``: its call was made."""

    remembered: str
    key: str
    expires: datetime
    new: bool
    sent: bool = False


def attempt_for(
    customer: Customer,
    selection: CheckoutSelection,
    action: str = ACTION_NEW,
    upgrade_to: str | None = None,
    downgrade_to: str | None = None,
) -> Attempt:
    """The attempt of a session for this choice: an earlier attempt's kept in the shared cache
    (until its session would expire: the next attempt for the same choice replays it), else a
    new key and expiry, kept there at once. Taken before the checkout's transaction, so a
    database cache keeps it when that transaction rolls back or its process dies after the
    call; the caller forgets one it did not send (``forget_unsent``)."""
    remembered = (
        f"billing:checkout:in-doubt:{customer.pk}:{selection.product.pk}:"
        f"{selection.cycle_code}:{selection.currency_id}:{action}:{upgrade_to}:{downgrade_to}"
    )
    earlier = _kept_attempt(remembered)
    if earlier is not None:
        return earlier
    key = str(uuid.uuid4())  # one key per attempt; the client's retries reuse it
    expires = timezone.now() + timedelta(seconds=checked("CHECKOUT_EXPIRY", expiry_ok, EXPIRY))
    expires = expires.replace(microsecond=expires.microsecond // 1000 * 1000)
    seconds = int((expires - timezone.now()).total_seconds())
    kept = {"key": key, "expires_at": expires.isoformat()}
    if seconds > 0 and _cache_call("add", remembered, kept, seconds) is False:
        # another request for the same choice kept its attempt first: one key for both
        if (earlier := _kept_attempt(remembered)) is not None:
            return earlier
        _cache_call("set", remembered, kept, seconds)  # what it kept was no attempt
    return Attempt(remembered, key, expires, new=True)


def _kept_attempt(remembered: str) -> Attempt | None:
    earlier = _cache_call("get", remembered)
    if isinstance(earlier, dict) and datetime.fromisoformat(earlier["expires_at"]) > timezone.now():
        expires = datetime.fromisoformat(earlier["expires_at"])
        return Attempt(remembered, str(earlier["key"]), expires, new=False)
    return None


def forget_unsent(attempt: Attempt | None) -> None:
    """Forget ``attempt`` if this request made it and never sent it (a double click's session
    reused, a checkout refused before the call): a later attempt gets a full expiry."""
    if attempt is not None and attempt.new and not attempt.sent:
        _cache_call("delete", attempt.remembered)


def _create_session(
    customer: Customer,
    selection: CheckoutSelection,
    client: Any,
    deadline: Deadline,
    *,
    action: str = ACTION_NEW,
    upgrade_to: str | None = None,
    downgrade_to: str | None = None,
    store: Callable[[CheckoutSession], None] | None = None,
    attempt: Attempt | None = None,
) -> CheckoutSession:
    """Create the remote session with ``attempt`` (``attempt_for``, taken now when none), then
    record it locally (never a half-made session). A plan change (``checkout.changes``) gives
    its guessed ``action`` and its target, and in ``store`` what it stores with the session
    (its request): both are stored, or neither."""
    if attempt is None:
        attempt = attempt_for(customer, selection, action, upgrade_to, downgrade_to)
    remembered, key, expires = attempt.remembered, attempt.key, attempt.expires
    session = CheckoutSession(
        customer=customer,
        product=selection.product,
        expires_at=expires,
        action=action,
        selected_billing_cycle=selection.cycle_code,
        selected_currency=selection.currency_id,
        upgrade_to=upgrade_to,
        downgrade_to=downgrade_to,
    )
    payload = checkout_map.to_remote(session)
    # Kept until the session's row commits here: an answer lost, or a row not stored (or
    # rolled back with the caller's transaction), replays the key on the next attempt.
    attempt.sent = True
    try:
        data = client.create_checkout_session(payload, idempotency_key=key, deadline=deadline)
    except BillingError as exc:
        in_doubt = exc.retryable or exc.in_doubt or isinstance(exc, BillingIdempotencyConflict)
        if in_doubt:
            logger.warning("checkout: session %s in doubt, kept for a replay", key)
        else:  # refused: nothing was created, the next attempt starts afresh
            _cache_call("delete", remembered)
        raise _translate(exc, "create_checkout_session") from exc
    remote = checkout_map.from_remote(data) if isinstance(data, dict) else {}
    if remote.get("remote_id") is None:
        # A 2xx naming the session by no UUID (no hosted page to go to): probably created
        # there, so a lost answer as one without an id (the client's), kept for a replay.
        logger.error("checkout: the service answered without a session id that is a UUID")
        raise ServiceUnavailable()

    for name, value in remote.items():
        if value is not None or name not in ("expires_at", "selected_currency"):
            setattr(session, name, value)
    session.sync_state = SyncState.SYNCED
    session.last_synced_at = timezone.now()
    try:
        with transaction.atomic():
            with from_remote():
                session.save()
            if store is not None:
                store(session)
    except DatabaseError as exc:
        # Created there, not stored here: a 503 raised once the caller's transaction commits
        # (the key kept, in the database cache too) so the next attempt replays the session.
        logger.error("checkout: session %s created, not stored here: %s", key, exc)
        raise ServiceUnavailable() from exc
    transaction.on_commit(lambda: _cache_call("delete", remembered))
    return session
