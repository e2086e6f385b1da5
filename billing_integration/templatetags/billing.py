"""Template tags of billing_integration: ``{% load billing %}``.

Checkout button (a POST form with CSRF to the ``billing_integration:checkout`` view)::

    {% billing_checkout_button product cycle="months-1" currency="XOF" label="Subscribe" %}
    {% billing_checkout_button product cycle=cycle currency=2 next=request.path css_class="btn" %}

``product`` is a ``Product`` (or its pk / remote id / name); ``cycle`` a ``BillingCycle`` or its
code (optional when the product has one cycle, ignored for one-time products); ``currency`` a
code or an integer id (optional: the product's first priced currency). ``next`` is a local
path for the "continue" link of the return page. A product that is not published renders a
short "not available" paragraph instead of the form; a product the request's subscriber
already holds (an active subscription, unless ``BILLING['MULTIPLE_PURCHASE_PRODUCTS']`` names
it) renders "Current plan" (``current_label``) instead of the form.

Access checks (the *active* rule is ``Subscription.objects.active()``)::

    {% if user|subscribed_to:product %}...{% endif %}      {# product: instance/pk/remote id/name #}
    {% if user|subscribed_to:None %}...{% endif %}         {# any product #}
    {% if user|is_subscriber %}...{% endif %}              {# any product #}

    {% is_subscribed as ok %}                 {# the request's subscriber (SUBSCRIBER_RESOLVER) #}
    {% is_subscribed product as ok %}
    {% is_subscribed product subscriber=team as ok %}

    {% if_subscribed product %}members content{% else %}subscribe first{% endif_subscribed %}
    {% if_subscribed %}...{% endif_subscribed %}            {# any product #}

Access by feature (``access.has_feature``: the request's cache, one query per request)::

    {% if user|has_feature:"sso" %}...{% endif %}           {# or request|has_feature:"sso" #}
    {{ user|feature_limit:"seats" }}                         {# 5, or None #}
    {% if_feature "sso" %}SSO settings{% else %}upgrade{% endif_feature %}
"""

from __future__ import annotations

from typing import Any

from django import template
from django.urls import reverse
from django.utils.translation import gettext

from ..access import get_subscriber, resolve_product, subscribed
from ..checkout.services import allows_multiple_purchases
from ..conf import billing_settings
from ..models import BillingCycle, Product, ProductStatus

register = template.Library()


def _request_subscriber(context: template.Context) -> Any:
    request = context.get("request")
    if request is not None:
        return get_subscriber(request)
    user = context.get("user")
    return user if user is not None and getattr(user, "is_authenticated", False) else None


@register.inclusion_tag("billing_integration/checkout_button.html", takes_context=True)
def billing_checkout_button(
    context: template.Context,
    product: Any,
    cycle: Any = None,
    currency: Any = None,
    label: str = "Subscribe",
    next: str | None = None,  # the form field's name
    css_class: str = "",
    unavailable_label: str = "Not available",
    current_label: str | None = None,
) -> dict[str, Any]:
    """A POST form (with ``{% csrf_token %}``) to the checkout view; "Current plan" for a
    product the request's subscriber already holds."""
    resolved = product if isinstance(product, Product) else resolve_product(product)
    if isinstance(cycle, BillingCycle):
        cycle = cycle.code
    if isinstance(currency, int) or (
        isinstance(currency, str) and currency.isascii() and currency.isdigit()
    ):
        currency = billing_settings.CURRENCIES.get(int(currency), currency)
    held = (
        resolved is not None
        and not allows_multiple_purchases(resolved)
        and subscribed(_request_subscriber(context), resolved)
    )
    return {
        "held": held,
        "current_label": current_label or gettext("Current plan"),
        "available": resolved is not None and resolved.status == ProductStatus.PUBLISHED,
        "action": reverse("billing_integration:checkout"),
        "product": resolved,
        "cycle": cycle or "",
        "currency": currency or "",
        "label": label,
        "next": next or "",
        "css_class": css_class,
        "unavailable_label": unavailable_label,
        "csrf_token": context.get("csrf_token"),
    }


@register.filter
def subscribed_to(subscriber: Any, product: Any = None) -> bool:
    """``{{ user|subscribed_to:product }}``: an active subscription to ``product``
    (``None`` = any product)."""
    return subscribed(subscriber, product)


@register.filter
def is_subscriber(subscriber: Any) -> bool:
    """``{{ user|is_subscriber }}``: an active subscription to any product."""
    return subscribed(subscriber)


@register.simple_tag(takes_context=True)
def is_subscribed(context: template.Context, product: Any = None, subscriber: Any = None) -> bool:
    """``{% is_subscribed [product] [subscriber=...] as var %}``; the subscriber defaults
    to the request's (``BILLING['SUBSCRIBER_RESOLVER']`` or the user)."""
    if subscriber is None:
        subscriber = _request_subscriber(context)
    return subscribed(subscriber, product)


class IfSubscribedNode(template.Node):
    def __init__(self, product: template.base.FilterExpression | None,
                 yes: template.NodeList, no: template.NodeList) -> None:
        self.product = product
        self.yes = yes
        self.no = no

    def render(self, context: template.Context) -> str:
        product = self.product.resolve(context) if self.product is not None else None
        ok = subscribed(_request_subscriber(context), product)
        return (self.yes if ok else self.no).render(context)


@register.tag("if_subscribed")
def do_if_subscribed(parser: template.base.Parser, token: template.base.Token) -> IfSubscribedNode:
    """``{% if_subscribed [product] %}...{% else %}...{% endif_subscribed %}``."""
    bits = token.split_contents()
    if len(bits) > 2:
        raise template.TemplateSyntaxError(f"{bits[0]} takes at most one argument (a product)")
    product = parser.compile_filter(bits[1]) if len(bits) == 2 else None
    yes = parser.parse(("else", "endif_subscribed"))
    token = parser.next_token()
    if token.contents == "else":
        no = parser.parse(("endif_subscribed",))
        parser.delete_first_token()
    else:
        no = template.NodeList()
    return IfSubscribedNode(product, yes, no)


# --- access by feature --------------------------------------------------------------------------
def _features(subject: Any) -> dict[str, int | None]:
    """A request's features (its cache), or a subscriber's, memoised on the instance: a
    template renders within one request, and ``request.user`` is built per request."""
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


class IfFeatureNode(template.Node):
    def __init__(self, feature: template.base.FilterExpression,
                 yes: template.NodeList, no: template.NodeList) -> None:
        self.feature = feature
        self.yes = yes
        self.no = no

    def render(self, context: template.Context) -> str:
        request = context.get("request")
        subject = request if request is not None else _request_subscriber(context)
        ok = has_feature_filter(subject, self.feature.resolve(context))
        return (self.yes if ok else self.no).render(context)


@register.tag("if_feature")
def do_if_feature(parser: template.base.Parser, token: template.base.Token) -> IfFeatureNode:
    """``{% if_feature "sso" %}...{% else %}...{% endif_feature %}``: the request's subscriber
    has the feature (through the request's cache)."""
    bits = token.split_contents()
    if len(bits) != 2:
        raise template.TemplateSyntaxError(f"{bits[0]} takes one argument (a feature name)")
    feature = parser.compile_filter(bits[1])
    yes = parser.parse(("else", "endif_feature"))
    token = parser.next_token()
    if token.contents == "else":
        no = parser.parse(("endif_feature",))
        parser.delete_first_token()
    else:
        no = template.NodeList()
    return IfFeatureNode(feature, yes, no)
