"""Template tags of billing_integration: ``{% load billing %}``."""

from __future__ import annotations

from typing import Any, NamedTuple

from django import template
from django.urls import reverse
from django.utils.translation import gettext

from .. import currencies, display
from ..access import (
    _is_subscriber,
    get_subscriber,
    lapsed_in_the_way,
    on_grace_period,
    on_trial,
    plan_in_the_way,
    resolve_product,
    subscribed,
)
from ..checkout.services import (
    CheckoutError,
    _trials_in_progress,
    bought_products,
    check_selection,
    confirming_sessions,
    is_bought,
    open_sessions,
    session_in_the_way,
    trial_of_another_plan,
)
from ..checkout.trials import check_trial, trial_products, trial_settings
from ..checkout.views import account_url
from ..exceptions import BillingConfigurationError
from ..models import BillingCycle, CheckoutSession, Customer, Product, Subscription
from ..models.subscriptions import PAUSED_STATUS

register = template.Library()


def _request_subscriber(context: template.Context) -> Any:
    request = context.get("request")
    if request is not None:
        return get_subscriber(request)
    user = context.get("user")
    return user if user is not None and getattr(user, "is_authenticated", False) else None


def _button_args(
    context: template.Context, product: Any, cycle: Any, currency: Any
) -> tuple[Product | None, str | None, str | None, Any]:
    """A button's product (an instance, a pk, a remote id or a name), cycle code, currency
    code and the subscriber of the request."""
    resolved = product if isinstance(product, Product) else resolve_product(product)
    if isinstance(cycle, BillingCycle):
        cycle = cycle.code
    if currencies.is_id(currency):
        currency = currencies.label(currency)
    return resolved, cycle, currency, _request_subscriber(context)


def _checked(check: Any, product: Product | None, cycle: Any, currency: Any) -> Any:
    """What ``check`` (``check_selection``, ``check_trial``) returns for the choice, or None
    where it refuses it: a button offers only what its view would accept."""
    if product is None:
        return None
    try:
        return check(product, cycle, currency)
    except CheckoutError:
        return None


class Held(NamedTuple):
    """What the subscriber holds, read once per page (a pricing page has buttons per plan and
    option): its subscriptions and its customer's trials in progress and open checkout
    sessions (with their products), the products it had a trial of, and those it paid for
    (``bought_products``: a one-time product bought once is held by its payment), and the
    sessions that may have been paid (``confirming_sessions``)."""

    subscriptions: list[Subscription]
    trials_had: set[int]
    trials_running: list[Subscription]
    sessions: list[CheckoutSession]
    bought: set[Any]
    confirming: list[CheckoutSession]


def _held(context: template.Context, subscriber: Any) -> Held:
    if not _is_subscriber(subscriber):
        return Held([], set(), [], [], set(), [])
    key = f"billing_held:{subscriber.pk}"
    if key not in context.render_context:
        rows = Subscription.objects.for_subscriber(subscriber).select_related("product")
        customer = Customer.objects.filter(subscriber=subscriber).first()
        context.render_context[key] = Held(
            list(rows),
            trial_products(subscriber),
            list(_trials_in_progress(customer)) if customer is not None else [],
            list(open_sessions(customer)) if customer is not None else [],
            bought_products(customer),
            list(confirming_sessions(customer)) if customer is not None else [],
        )
    held: Held = context.render_context[key]
    return held


def _in_the_way(held: Held, product: Product, selection: Any = None) -> bool:
    """Whether ``start_checkout`` and ``start_trial`` refuse ``product`` for a plan of its
    group held (or that may renew), a subscription of it that lapsed but may renew, or a trial
    or an open checkout beside it (``session_in_the_way``; ``selection``'s own session is no
    rival), or a session that may have been paid (``confirming_sessions``, its own too)."""
    return (
        plan_in_the_way(held.subscriptions, product)
        or lapsed_in_the_way(held.subscriptions, product)
        or trial_of_another_plan(held.trials_running, product) is not None
        or session_in_the_way(held.sessions, product, selection) is not None
        or session_in_the_way(held.confirming, product) is not None
    )


def _form(
    context: template.Context,
    view: str,
    product: Product | None,
    cycle: Any,
    currency: Any,
    next: str | None,
    css_class: str,
) -> dict[str, Any]:
    """What a button's POST form carries to ``view``."""
    return {
        "action": reverse(f"billing_integration:{view}"),
        "product": product,
        "cycle": cycle or "",
        "currency": currency or "",
        "next": next or "",
        "css_class": css_class,
        "csrf_token": context.get("csrf_token"),
    }


@register.inclusion_tag("billing_integration/checkout_button.html", takes_context=True)
def billing_checkout_button(
    context: template.Context,
    product: Any,
    cycle: Any = None,
    currency: Any = None,
    label: str | None = None,
    next: str | None = None,  # the form field's name
    css_class: str = "",
    unavailable_label: str | None = None,
    current_label: str | None = None,
    change_label: str | None = None,
    bought_label: str | None = None,
) -> dict[str, Any]:
    """A POST form to the checkout view; "Current plan" for the option the subscriber holds,
    "Already bought" for a one-time product it bought once (``bought_once``: checkout refuses
    it), a "Change plan" form (to the change view, ``checkout.changes.change_plan``) for one
    that would change the plan held, a link to the billing page for a product whose lapsed
    subscription may still renew."""
    resolved, cycle, currency, subscriber = _button_args(context, product, cycle, currency)
    held = change = False
    selection = _checked(check_selection, resolved, cycle, currency)
    holds = _held(context, subscriber)
    if resolved is not None and not resolved.multiple_purchases:
        # a trial (not renewing by itself, nor asked to: ``renewing_trial``) or a grace period
        # is no purchase: the button buys (converts) the product
        subs = holds.subscriptions
        resumed = {t.pk for t in holds.trials_running if getattr(t, "resume_asked", False)}
        own = [s for s in subs if s.product_id == resolved.pk and (s.bought or s.pk in resumed)]
        held = any(_same_option(sub, cycle, currency) for sub in own)
        change = not held and (bool(own) or plan_in_the_way(subs, resolved))
    bought = resolved is not None and is_bought(holds.bought, resolved)
    # What start_checkout would sell (a refused status change is not on sale), and beside what
    # the subscriber holds (the "Change plan" form goes to the change view instead).
    available = selection is not None and (
        held or change or not _in_the_way(holds, selection.product, selection)
    )
    # its own subscription lapsed but may still renew: the billing page can stop that renewal
    renewing = (
        not available and resolved is not None and lapsed_in_the_way(holds.subscriptions, resolved)
    )
    # paused on the service, which may resume it: the billing page can stop that renewal too
    paused = renewing and any(
        resolved is not None
        and s.product_id == resolved.pk
        and s.status == PAUSED_STATUS
        and s.auto_renew
        for s in holds.subscriptions
    )
    label = label or gettext("Subscribe")
    if "{price}" in label or "{cycle}" in label:
        label = _label_with_price(label, resolved, cycle, currency)
    return {
        **_form(context, "checkout", resolved, cycle, currency, next, css_class),
        "held": held,
        "bought": bought,
        "change": change,
        "current_label": current_label or gettext("Current plan"),
        "bought_label": bought_label or gettext("Already bought"),
        "change_label": change_label or gettext("Change plan"),
        "change_action": reverse("billing_integration:change_plan"),
        "account_url": account_url(),
        "available": available,
        "may_renew": renewing,
        "may_renew_label": (
            gettext("Paused: see your billing page")
            if paused
            else gettext("Payment being retried: see your billing page")
        ),
        "label": label,
        "unavailable_label": unavailable_label or gettext("Not available"),
    }


@register.inclusion_tag("billing_integration/trial_button.html", takes_context=True)
def billing_trial_button(
    context: template.Context,
    product: Any,
    cycle: Any = None,
    currency: Any = None,
    label: str | None = None,
    next: str | None = None,  # the form field's name
    css_class: str = "",
) -> dict[str, Any]:
    """A POST form to the trial view, for a product with ``trial_days`` on sale; nothing for a
    subscriber who holds the product or another plan of its group, or had its trial already
    (unless ``BILLING['TRIALS']['repeat']``). ``label`` may hold ``{days}``."""
    resolved, cycle, currency, subscriber = _button_args(context, product, cycle, currency)
    offered = resolved is not None and _checked(check_trial, resolved, cycle, currency) is not None
    if offered and resolved is not None and subscriber is not None:
        held = _held(context, subscriber)
        offered = not (
            any(s.product_id == resolved.pk and s.is_live for s in held.subscriptions)
            or _in_the_way(held, resolved)
            or (not trial_settings()["repeat"] and resolved.pk in held.trials_had)
        )
    days = resolved.trial_days if resolved is not None else None
    text = label or gettext("Start a {days}-day trial")
    return {
        **_form(context, "trial", resolved, cycle, currency, next, css_class),
        "offered": offered,
        "label": text.replace("{days}", str(days or "")),
    }


def _same_option(subscription: Any, cycle: Any, currency: Any) -> bool:
    """Whether ``subscription`` is of this cycle and currency (an omitted one matches any)."""
    if cycle and subscription.selected_billing_cycle != cycle:
        return False
    if not currency:
        return True
    try:
        held = currencies.currency_id(subscription.selected_currency)
        wanted = currencies.currency_id(currency)
    except BillingConfigurationError:
        return str(subscription.selected_currency).upper() == str(currency).upper()
    return held == wanted


def _label_with_price(label: str, product: Product | None, cycle: Any, currency: Any) -> str:
    """``label`` with ``{price}`` (the price sold: ``Product.sold_prices``) and ``{cycle}``
    filled in (empty when not found)."""
    price_text = ""
    if product is not None:
        try:
            currency_id = currencies.currency_id(currency) if currency else None
        except BillingConfigurationError:
            currency_id = None
        if product.is_one_time:  # its prices are at its root
            groups = [product.sold_prices()]
        else:
            cycles = [c for c in product.cycles.all() if not cycle or c.code == cycle]
            groups = [product.sold_prices(c) for c in cycles]
        found = ((c, a) for g in groups for c, a in g.items() if currency_id in (None, c))
        if (price := next(found, None)) is not None:
            price_text = display.format_money(price[1], currencies.label(price[0]))
    return label.replace("{price}", price_text).replace(
        "{cycle}", display.cycle_label(cycle) if cycle else ""
    )


# ``{{ user|subscribed_to:product }}`` (any product if omitted), ``{{ user|is_subscriber }}``.
register.filter("subscribed_to", subscribed)
register.filter("is_subscriber", subscribed)


# ``{{ user|on_trial }}`` / ``{{ user|on_trial:product }}``, ``{{ user|on_grace_period }}``.
register.filter("on_trial", on_trial)
register.filter("on_grace_period", on_grace_period)


@register.simple_tag(takes_context=True)
def is_subscribed(context: template.Context, product: Any = None, subscriber: Any = None) -> bool:
    """``{% is_subscribed [product] [subscriber=...] as var %}`` (default: the request's)."""
    if subscriber is None:
        subscriber = _request_subscriber(context)
    return subscribed(subscriber, product)


class IfNode(template.Node):
    """``yes`` if ``test(context, argument)``, else ``no``."""

    def __init__(
        self,
        test: Any,
        argument: template.base.FilterExpression | None,
        yes: template.NodeList,
        no: template.NodeList,
    ) -> None:
        self.test, self.argument, self.yes, self.no = test, argument, yes, no

    def render(self, context: template.Context) -> str:
        value = self.argument.resolve(context) if self.argument is not None else None
        return (self.yes if self.test(context, value) else self.no).render(context)


def _if_node(parser: template.base.Parser, token: template.base.Token, test: Any) -> IfNode:
    """The node of ``{% tag [argument] %}...{% else %}...{% endtag %}``."""
    bits = token.split_contents()
    end = f"end{bits[0]}"
    argument = parser.compile_filter(bits[1]) if len(bits) == 2 else None
    yes = parser.parse(("else", end))
    if parser.next_token().contents == "else":
        no = parser.parse((end,))
        parser.delete_first_token()
    else:
        no = template.NodeList()
    return IfNode(test, argument, yes, no)


@register.tag("if_subscribed")
def do_if_subscribed(parser: template.base.Parser, token: template.base.Token) -> IfNode:
    """``{% if_subscribed [product] %}...{% else %}...{% endif_subscribed %}``."""
    if len(token.split_contents()) > 2:
        raise template.TemplateSyntaxError("if_subscribed takes at most one argument (a product)")
    return _if_node(
        parser, token, lambda context, product: subscribed(_request_subscriber(context), product)
    )


def _features(subject: Any) -> dict[str, int | None]:
    """A request's features (its cache), or a subscriber's, memoised on the instance."""
    from ..access.features import features_for, features_of, is_request

    return features_for(subject) if is_request(subject) else features_of(subject, memoise=True)


@register.filter(name="has_feature")
def has_feature_filter(subject: Any, feature: Any) -> bool:
    """``{{ user|has_feature:"sso" }}`` (or ``request|has_feature:"sso"``): the feature
    through an active subscription."""
    from ..mapping.products import feature_key

    key = feature_key(feature)
    return bool(key) and key in _features(subject)


@register.filter(name="feature_limit")
def feature_limit_filter(subject: Any, feature: Any) -> int | None:
    """``{{ user|feature_limit:"seats" }}``: the feature's number, or None."""
    from ..mapping.products import feature_key

    key = feature_key(feature)
    return _features(subject).get(key) if key else None


@register.tag("if_feature")
def do_if_feature(parser: template.base.Parser, token: template.base.Token) -> IfNode:
    """``{% if_feature "sso" %}...{% else %}...{% endif_feature %}``: the request's subscriber
    has the feature (through the request's cache)."""
    if len(token.split_contents()) != 2:
        raise template.TemplateSyntaxError("if_feature takes one argument (a feature name)")
    return _if_node(
        parser,
        token,
        lambda context, feature: has_feature_filter(
            context.get("request") or _request_subscriber(context), feature
        ),
    )


@register.filter
def currency_code(value: Any) -> str:
    """``{{ price.currency_id|currency_code }}``: the ISO code of a currency id (or code)."""
    return currencies.label(value).upper()


@register.filter
def money(amount: Any, currency: Any) -> str:
    """``{{ amount|money:"XOF" }}``: the amount in the currency (a code or an id)."""
    return display.format_money(amount, currency_code(currency))


@register.filter
def price_label(price: Any) -> str:
    """``{{ price|price_label }}``: a ``Price`` (amount and integer currency id) formatted."""
    if price is None or price == "":
        return ""
    return display.format_money(price.amount, currency_code(price.currency_id))


# ``{{ "months-1"|cycle_label }}``, ``{{ subscription|status_label }}``,
# ``{{ payment.failure_reason|failure_reason }}``: the labels of ``display``.
register.filter("cycle_label", display.cycle_label)
register.filter("status_label", display.status_label)
register.filter("failure_reason", display.failure_reason_label)
