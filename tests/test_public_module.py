"""``billing_integration.billing`` is the one module a host imports from: every name of its
``__all__`` resolves, and the README's "Using it" code imports from it alone and runs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.test import RequestFactory

from billing_integration import billing

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def _using_it_code() -> str:
    section = README.split("\n## Using it\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert blocks, "README's 'Using it' has no Python example"
    return "\n".join(blocks)


def _package_imports(code: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("billing_"):
            found += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("billing_")]
    return found


def test_every_public_name_resolves():
    assert len(set(billing.__all__)) == len(billing.__all__)
    for name in billing.__all__:
        assert getattr(billing, name) is not None, name


def test_the_public_module_names_what_a_host_uses():
    wanted = {
        "subscribed", "has_feature", "feature_limit", "subscription_required",
        "feature_required", "SubscriptionRequiredMixin", "FeatureRequiredMixin",
        "HasActiveSubscription", "HasFeature", "checkout_url", "checkout_redirect",
        "start_checkout", "billing_event_received", "payment_failed", "BillingError",
        "CheckoutError", "WebhookVerificationError", "handler", "EventHandler", "get_client",
        "sign_webhook", "start_sandbox", "after_commit_inline", "deliver_event",
        "start_trial", "on_trial",
        "on_grace_period", "in_grace_period", "TrialAlreadyUsed", "TrialNotOffered",
        "change_plan",
        "cancel_at_period_end", "resume", "NoPlanToChange", "SamePlan", "RenewalUnchanged",
        "Product", "BillingCycle", "Price", "Customer", "Subscription", "WebhookEvent",
    }  # fmt: skip
    assert wanted <= set(billing.__all__)
    assert not [n for n in billing.__all__ if n.startswith("_")]


def test_the_readme_imports_only_from_the_public_module():
    imports = _package_imports(_using_it_code())
    assert imports
    assert all(
        i == "billing_integration.billing" or i.startswith("billing_integration.billing.")
        for i in imports
    ), imports


def test_the_import_check_sees_a_private_import():
    assert _package_imports("from billing_integration.access import subscribed") == [
        "billing_integration.access.subscribed"
    ]


@pytest.mark.django_db
def test_the_readme_using_it_code_runs(django_user_model):
    namespace: dict = {}
    exec(compile(_using_it_code(), "README.md: Using it", "exec"), namespace)
    request = RequestFactory().get("/members/")
    request.user = django_user_model.objects.create_user("ada", password="pw")
    response = namespace["members"](request)  # no subscription: sent to the pricing page
    assert response.status_code == 302


@pytest.mark.django_db
def test_the_readme_change_view_answers_a_refused_change(django_user_model):
    """Pasted as it is, the README's ``change`` view shows a refusal (here: no plan held to
    change) as a page with the error's status, as its ``subscribe`` view does, never a 500."""
    import uuid
    from decimal import Decimal

    from django.http import HttpResponse

    from billing_integration.models import BillingCycle, Price, Product
    from billing_integration.outbox import from_remote

    with from_remote():  # "Pro", on sale yearly in XOF: the change's choice is valid
        product = Product.objects.create(
            name="Pro", status="published", remote_id=uuid.uuid4(), selected_currencies=[1]
        )
        yearly = BillingCycle.objects.create(product=product, unit="years", frequency=1)
        Price.objects.create(cycle=yearly, currency_id=1, amount=Decimal("100000"))
    namespace: dict = {}
    exec(compile(_using_it_code(), "README.md: Using it", "exec"), namespace)
    rendered = []

    def render(request, template, context, status=200):  # the project's pricing.html
        rendered.append((template, context))
        return HttpResponse(status=status)

    namespace["render"] = render
    request = RequestFactory().post("/change/")
    request.user = django_user_model.objects.create_user("ada", password="pw")
    response = namespace["change"](request)
    assert response.status_code == billing.NoPlanToChange.status
    [(template, context)] = rendered
    assert template == "pricing.html" and context["error"]


@pytest.mark.django_db
def test_the_readme_views_that_buy_or_change_refuse_a_get(django_user_model, mailoutbox):
    """A signed-in customer's browser sends the session cookie with a top-level GET from
    another site (a link, a redirect: SameSite=Lax lets it through, and CSRF checks only
    POST). Pasted as they were, the README's ``change`` and ``subscribe`` views took that GET:
    any page could ask for a change of the visitor's plan (an email to staff, who then bill
    the new plan) or open a checkout. They take POST only."""
    import uuid
    from datetime import timedelta
    from decimal import Decimal

    from django.http import HttpResponse
    from django.utils import timezone

    from billing_integration.models import (
        BillingCycle,
        ChangeRequest,
        CheckoutSession,
        Customer,
        Price,
        Product,
        Subscription,
    )
    from billing_integration.outbox import from_remote

    user = django_user_model.objects.create_user("ada", password="pw")
    with from_remote():  # Basic held, Pro on sale yearly in XOF
        plans = {}
        for name, unit in (("Basic", "months"), ("Pro", "years")):
            plans[name] = Product.objects.create(
                name=name, status="published", remote_id=uuid.uuid4(), selected_currencies=[1]
            )
            cycle = BillingCycle.objects.create(product=plans[name], unit=unit, frequency=1)
            Price.objects.create(cycle=cycle, currency_id=1, amount=Decimal("100000"))
        customer = Customer.objects.create(
            subscriber=user, identifier=f"auth.user:{user.pk}", remote_id=uuid.uuid4()
        )
        end = timezone.now() + timedelta(days=20)
        Subscription.objects.create(
            remote_id=uuid.uuid4(),
            customer=customer,
            product=plans["Basic"],
            status="published",  # the service's active status
            cycle_start_date=end - timedelta(days=30),
            cycle_end_date=end,
            selected_billing_cycle="months-1",
            selected_currency="XOF",
        )
    namespace: dict = {}
    exec(compile(_using_it_code(), "README.md: Using it", "exec"), namespace)
    namespace["render"] = lambda request, template, context, status=200: HttpResponse(status=status)
    for view, path in (("change", "/change/"), ("subscribe", "/subscribe/")):
        request = RequestFactory().get(path)
        request.user = user
        assert namespace[view](request).status_code == 405, view
    assert not ChangeRequest.objects.exists() and not mailoutbox
    assert not CheckoutSession.objects.exists()
