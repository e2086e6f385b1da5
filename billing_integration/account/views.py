"""The customer's billing page (login required): subscriptions, payments, invoices, refunds."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.contrib.auth.decorators import login_required
from django.db.models import Prefetch, prefetch_related_objects
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from .. import currencies
from ..access import (
    get_subscriber,
    lapsed_in_the_way,
    may_renew,
    plan_in_the_way,
    renews_in_place,
)
from ..checkout import changes
from ..checkout.services import bought_products, is_bought
from ..client import get_client
from ..conf import billing_settings
from ..exceptions import BillingConfigurationError
from ..models import (
    BillingCycle,
    ChangeKind,
    CheckoutSession,
    Customer,
    Invoice,
    Payment,
    Product,
    ProductStatus,
    Refund,
    Subscription,
    SyncState,
)
from ..models.subscriptions import PAUSED_STATUS
from ..pages import render_page
from ..sync.tasks import refresh_in_background

ACCOUNT_TEMPLATE = "billing_integration/account.html"
#: Payment statuses a customer may pay again for.
PAY_AGAIN_STATUSES = ("failed", "canceled")


def pricing_url() -> str:
    """``BILLING['PRICING_URL']`` (a URL name or a path): where a customer chooses a plan."""
    target = str(billing_settings.PRICING_URL or "/")
    if "/" in target:
        return target
    try:
        return reverse(target)
    except NoReverseMatch:
        return "/"


def _price_of(sub: Subscription) -> Decimal | None:
    """The amount of the subscription's cycle and currency (prefetched): the one the service
    confirmed holding (``Product.confirmed_prices``: what it charges), else the price here."""
    if sub.product is None or not sub.selected_billing_cycle or not sub.selected_currency:
        return None
    try:
        currency_id = currencies.currency_id(sub.selected_currency)
    except BillingConfigurationError:
        return None
    for cycle in sub.product.cycles.all():
        if cycle.code == sub.selected_billing_cycle:
            confirmed = sub.product.confirmed_prices(cycle) or {}
            if currency_id in confirmed:
                return confirmed[currency_id]
            for price in cycle.prices.all():
                if price.currency_id == currency_id:
                    return price.amount
    return None


def _pay_again(
    payments: list[Payment],
    held: set[int],
    cycles: dict[int, str],
    subscriptions: list[Subscription],
    bought: set[Any],
) -> dict[int, dict[str, str]]:
    """Payment pk -> the checkout form's fields, for the latest failed payment of each
    product that is on sale (the status the service last confirmed), not held now (nor, a
    one-time product, bought: ``is_bought`` over ``bought``), not beside a subscription of it
    that may still renew (``access.lapsed_in_the_way``: checkout refuses it), and not a second
    plan beside one of ``subscriptions`` (``access.plan_in_the_way``; ``payments`` newest
    first)."""
    offers: dict[int, dict[str, str]] = {}
    seen: set[int] = set()
    for payment in payments:
        product = payment.product
        if product is None or product.pk in seen:
            continue
        seen.add(product.pk)  # only the latest payment of a product counts
        if (
            payment.status not in PAY_AGAIN_STATUSES
            or product.confirmed_status != ProductStatus.PUBLISHED
            or (product.pk in held and not product.multiple_purchases)
            or is_bought(bought, product)  # a one-time product paid for (409 already_bought)
            or lapsed_in_the_way(subscriptions, product)
            or plan_in_the_way(subscriptions, product)
        ):
            continue
        cycle = payment.subscription.selected_billing_cycle if payment.subscription else ""
        cycle = "" if product.is_one_time else (cycle or cycles.get(product.pk, ""))
        if not _sold(product, cycle, payment.currency):
            continue  # checkout refuses it: a cycle or price the service has not confirmed
        offers[payment.pk] = {"cycle": cycle, "currency": payment.currency}
    return offers


def _sold(product: Product, cycle_code: str, currency: str) -> bool:
    """Whether checkout sells ``product`` in that cycle (none: its only one) and currency
    (``Product.sold_prices``: what the service confirmed holding; prefetched)."""
    try:
        currency_id = currencies.currency_id(currency)
    except BillingConfigurationError:
        return False
    if product.is_one_time:
        return currency_id in product.sold_prices()
    found = [c for c in product.cycles.all() if c.code == cycle_code or not cycle_code]
    return len(found) == 1 and currency_id in product.sold_prices(found[0])


def _records(model: Any, customer: Customer, *related: str) -> list[Any]:
    """The customer's payments, invoices or refunds, newest first."""
    rows = model.objects.filter(customer=customer).select_related(*related)
    return list(rows.order_by("-remote_created", "-id"))


@never_cache
@login_required
@require_GET
def account(request: HttpRequest) -> HttpResponse:
    """The billing page of the request's subscriber."""
    subscriber = get_subscriber(request)
    customer = (
        Customer.objects.filter(subscriber=subscriber).first() if subscriber is not None else None
    )
    subscriptions: list[Subscription] = []
    payments: list[Payment] = []
    invoices: list[Invoice] = []
    refunds: list[Refund] = []
    if customer is not None:
        changes.settle(customer)  # requests the mirror shows done; plans renewing twice
        priced = Prefetch(
            "product__cycles", queryset=BillingCycle.objects.prefetch_related("prices")
        )
        subscriptions = list(
            Subscription.objects.for_customer(customer)
            .select_related("product")
            .prefetch_related(priced)
            .order_by("-created_at", "-pk")
        )
        payments = _records(Payment, customer, "product", "subscription")
        # what "Pay again" needs to know what is sold (``_sold``): three queries for all payments
        prefetch_related_objects(payments, priced, "product__root_prices")
        invoices = _records(Invoice, customer, "product")
        refunds = _records(Refund, customer, "payment")
    # The page reads the mirror only. While the service is known down, it says the mirror may
    # not be up to date and asks a worker for a pull (nothing is sent from the request).
    stale = customer is not None and get_client().known_down()
    if stale:
        refresh_in_background()
    pending = changes.requests_for(customer)
    doubled = changes.doubled_plans(customer) if customer is not None else []
    held = {s.product_id for s in subscriptions if s.product_id and s.is_active}
    # the cycle of a payment without a subscription: the latest subscription or checkout
    # session of its product (none needed for a product with one cycle)
    cycles: dict[int, str] = {}
    if customer is not None:
        cycles = dict(
            CheckoutSession.objects.filter(customer=customer, product__isnull=False)
            .exclude(selected_billing_cycle="")
            .order_by("created_at", "pk")
            .values_list("product_id", "selected_billing_cycle")
        )
    for sub in reversed(subscriptions):  # oldest first: the latest wins
        if sub.product_id and sub.selected_billing_cycle:
            cycles[sub.product_id] = sub.selected_billing_cycle
    offers = _pay_again(payments, held, cycles, subscriptions, bought_products(customer))
    # products bought (out of trial, or a trial renewing by itself): no "Subscribe now" for them
    paid = {s.product_id for s in subscriptions if s.bought}
    rows = [
        {
            "subscription": s,
            "active": s.is_active,
            "price": _price_of(s),
            "lapsed": not s.is_active and s.product_id not in held,
            # no access here, but the service may still renew it (a failed payment it may
            # retry): its renewal can be stopped (checkout.changes.cancel_at_period_end)
            "may_renew": not s.is_active and s.remote_id is not None and may_renew(s),
            # paused: the service may resume it (and bill it); its renewal can be stopped too
            "paused": s.status == PAUSED_STATUS,
            "trial_ends_at": s.trial_ends_at,
            # "Subscribe now" to the product of a trial not converted yet, nor asked to renew
            # by itself (a resume pending: checkout refuses it)
            "convert": s.trial_ends_at is not None
            and s.product_id not in paid
            and not any(r.subscription_id == s.pk and r.kind == ChangeKind.RESUME for r in pending)
            and s.product is not None
            and s.product.confirmed_status == ProductStatus.PUBLISHED,
            "grace_until": s.cycle_end_date if s.on_grace_period else None,
            "trial_pending": s.remote_id is None
            and s.trial_end_date is not None
            and s.sync_state == SyncState.PENDING,
            # another subscription renews in its place (a change's, a conversion's): no Resume
            "replaced": not s.auto_renew and renews_in_place(subscriptions, s),
            "requests": [r for r in pending if r.subscription_id == s.pk],
            "renewal_asked": any(
                r.subscription_id == s.pk and r.kind != "change_plan" for r in pending
            ),
        }
        for s in subscriptions
    ]
    payment_rows = [{"payment": p, "pay_again": offers.get(p.pk)} for p in payments]
    return render_page(
        request,
        ACCOUNT_TEMPLATE,
        {
            "customer": customer,
            "subscriber": subscriber,
            "subscription_rows": rows,
            "payment_rows": payment_rows,
            "invoices": invoices,
            "refunds": refunds,
            "any_lapsed": any(r["lapsed"] for r in rows),
            "pricing_url": pricing_url(),
            "checkout_action": reverse("billing_integration:checkout"),
            "account_path": request.path,
            "stale": stale,
            # the older plan of each pair renewing twice: staff stop it
            "doubled": [subs[0] for subs in doubled],
        },
    )
