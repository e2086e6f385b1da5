"""The checkout views: thin wrappers around ``services``."""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable
from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.db import transaction
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from ..access import get_subscriber
from ..client import get_client, interactive_deadline
from ..client.retry import Deadline
from ..exceptions import BillingError
from ..models import CheckoutSession, Customer, Payment, Subscription
from ..models.records import of_customer
from ..models.subscriptions import CANCELED_STATUSES
from ..pages import render_page
from ..sync.coalesce import note_window, once_per_window, window_note
from ..sync.tasks import refresh_in_background
from .services import CheckoutError, NoSubscriber, ServiceUnavailable, checkout_url
from .trials import start_trial

logger = logging.getLogger("billing_integration.checkout")

NEXT_SESSION_KEY = "billing_checkout_next"
ERROR_TEMPLATE = "billing_integration/checkout_error.html"
RETURN_TEMPLATE = "billing_integration/checkout_return.html"
#: The return page pulls a customer's subscriptions at most once in this many seconds.
RETURN_PULL_INTERVAL = 5.0

ACCOUNT_URL_NAME = "billing_integration:account"


def account_url() -> str:
    """The billing page's URL, ``/`` where the app's URLs are not mounted."""
    try:
        return reverse(ACCOUNT_URL_NAME)
    except NoReverseMatch:
        return "/"


def _safe_next(request: HttpRequest, value: str | None) -> str | None:
    if value and url_has_allowed_host_and_scheme(
        value, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return value
    return None


def login_first(view: View) -> View:
    """``login_required`` for a POST-only view: the login page sends the visitor back to the
    page the click came from (the ``Referer``, else the posted ``next``), not to this view,
    which a GET after login could only answer 405."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.user.is_authenticated:
            return view(request, *args, **kwargs)
        back = _safe_next(request, request.headers.get("referer"))
        back = back or _safe_next(request, request.POST.get("next")) or account_url()
        return redirect_to_login(back)

    return wrapped


def posted_choice(request: HttpRequest) -> tuple[Any, Any, Any]:
    """The posted product, cycle and currency (an empty cycle or currency is ``None``)."""
    data = request.POST
    return data.get("product"), data.get("cycle") or None, data.get("currency") or None


def error_page(request: HttpRequest, error: CheckoutError, *, change: bool = False) -> HttpResponse:
    """The page of a refused checkout, trial or (``change``) change of a subscription
    (``error.status``)."""
    return render_page(
        request,
        ERROR_TEMPLATE,
        {
            "error": error,
            "message": error.message,
            "code": error.code,
            "status": error.status,
            "account_url": account_url(),
            "change": change,
        },
        status=error.status,
    )


View = Callable[..., HttpResponse]


def refusals_as_pages(action: str, *, change: bool = False) -> Callable[[View], View]:
    """A ``CheckoutError`` the view raises becomes its error page (headed as a change of a
    subscription with ``change``); any other ``BillingError`` (e.g. configuration) is logged
    and shown as the service being unavailable."""

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                return view(request, *args, **kwargs)
            except CheckoutError as exc:
                return error_page(request, exc, change=change)
            except BillingError as exc:
                logger.error("%s failed: %s", action, exc)
                return error_page(request, ServiceUnavailable(), change=change)

        return wrapped

    return decorate


@transaction.non_atomic_requests  # calls the service: see docs/production.md
@never_cache
@login_first
@require_POST
@refusals_as_pages("checkout")
def checkout(request: HttpRequest) -> HttpResponse:
    """Start a hosted checkout for the request's subscriber; 302 to the hosted page."""
    deadline = interactive_deadline()  # first: the whole request ends by it
    url = checkout_url(get_subscriber(request), *posted_choice(request), deadline=deadline)
    next_url = _safe_next(request, request.POST.get("next"))
    if hasattr(request, "session"):
        if next_url:
            request.session[NEXT_SESSION_KEY] = next_url
        else:
            request.session.pop(NEXT_SESSION_KEY, None)
    return HttpResponseRedirect(url)


@transaction.non_atomic_requests  # calls the service: see docs/production.md
@never_cache
@login_first
@require_POST
@refusals_as_pages("trial")
def trial(request: HttpRequest) -> HttpResponse:
    """Start a free trial of the posted product (its ``trial_days``) for the request's
    subscriber; 302 to ``next`` or the billing page."""
    deadline = interactive_deadline()  # first: the whole request ends by it
    start_trial(get_subscriber(request), *posted_choice(request), deadline=deadline)
    return HttpResponseRedirect(_safe_next(request, request.POST.get("next")) or account_url())


ACTIVE, PENDING, FAILED, NONE = "active", "pending", "failed", "none"


def checkout_outcome(customer: Customer | None, session: CheckoutSession | None) -> dict[str, Any]:
    """The outcome of ``session`` (or of the customer's checkouts if ``None``) from local data:
    active (an active subscription; for a session, to its product, out of trial, not
    canceled and recorded since the session started), failed (a failed payment, or expired),
    else pending."""
    result = {"outcome": NONE, "subscription": None, "payment": None, "session": session}
    if customer is None:
        return result
    subs = Subscription.objects.active().for_customer(customer).select_related("product")
    if session is not None and session.product_id:
        # What the checkout bought: a trial it converts, a canceled plan in its grace period
        # bought again, or the plan a change of cycle replaces, grants access but was there
        # before; it is no outcome.
        subs = (
            subs.filter(product_id=session.product_id, created_at__gte=session.created_at)
            .exclude(status__in=CANCELED_STATUSES)
            .exclude(trial_end_date__gt=timezone.now())
        )
    sub = subs.first()
    if sub is not None:
        return {**result, "outcome": ACTIVE, "subscription": sub}
    if session is None:
        return result
    payments = Payment.objects.filter(
        of_customer(customer), status__in=("failed", "canceled"), created_at__gte=session.created_at
    )
    if session.product is not None and session.product.remote_id is not None:
        payments = payments.filter(
            Q(product_remote_id=session.product.remote_id) | Q(product_remote_id__isnull=True)
        )
    payment = payments.order_by("-created_at", "-pk").first()
    if payment is not None:
        return {**result, "outcome": FAILED, "payment": payment}
    if session.status == "expired" or (
        session.expires_at is not None and session.expires_at <= timezone.now()
    ):
        return {**result, "outcome": FAILED}
    return {**result, "outcome": PENDING}


def _session_for(customer: Customer | None, ref: str | None) -> CheckoutSession | None:
    """The customer's session named by ``ref`` (remote id), else its latest one. Never another
    customer's session, whatever the query string says."""
    if customer is None:
        return None
    sessions = CheckoutSession.objects.filter(customer=customer).select_related("product")
    try:
        found = sessions.filter(remote_id=uuid.UUID(str(ref))).first() if ref else None
    except ValueError:
        found = None
    return found or sessions.order_by("-created_at", "-pk").first()


def _refresh(customer: Customer, deadline: Deadline) -> bool:
    """Pull the customer's subscriptions, at most once per ``RETURN_PULL_INTERVAL`` and within the
    request's ``deadline``."""
    if customer.remote_id is None:
        return True
    client = get_client()
    if client.known_down():
        refresh_in_background()
        return False
    key = f"billing:return-pull:{customer.pk}"
    if not once_per_window(key, RETURN_PULL_INTERVAL):
        return bool(window_note(key) != "failed")
    from ..sync.pull import pull_subscriptions

    try:
        pull_subscriptions(customer, client=client.with_deadline(deadline))
    except BillingError as exc:
        logger.warning("checkout return: could not refresh subscriptions: %s", exc)
        note_window(key, "failed", RETURN_PULL_INTERVAL)
        refresh_in_background()
        return False
    return True


@never_cache
@login_required
@require_GET
def checkout_return(request: HttpRequest) -> HttpResponse:
    """After the hosted page: refresh the subscriber's subscriptions, show the outcome."""
    deadline = interactive_deadline()  # first: the whole request ends by it
    subscriber = get_subscriber(request)
    if subscriber is None:
        return error_page(request, NoSubscriber())
    customer = Customer.objects.filter(subscriber=subscriber).first()
    refreshed = _refresh(customer, deadline) if customer is not None else True
    ref = request.GET.get("session_id") or request.GET.get("session")
    session = _session_for(customer, ref)
    if session is not None and session.returned_at is None:
        # Back from its page, it may have been paid: a purchase that could double it waits for
        # its outcome (``confirming_sessions``). Only ever more careful, and only its own.
        session.returned_at = timezone.now()
        CheckoutSession.objects.filter(pk=session.pk, returned_at__isnull=True).update(
            returned_at=session.returned_at
        )
    context = checkout_outcome(customer, session)
    next_url = None
    if hasattr(request, "session"):
        next_url = _safe_next(request, request.session.get(NEXT_SESSION_KEY))
    context.update(
        account_url=account_url(),
        refreshed=refreshed,
        next_url=next_url or "/",
        subscriptions=(
            Subscription.objects.for_customer(customer).select_related("product")
            if customer is not None
            else Subscription.objects.none()
        ),
    )
    return render_page(request, RETURN_TEMPLATE, context)
