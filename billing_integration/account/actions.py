"""The billing page's actions (POST, login required): change plan, stop renewal, resume. Thin
wrappers around ``checkout.changes``."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from ..access import get_subscriber
from ..checkout import changes
from ..checkout.services import NoSubscriber
from ..checkout.views import account_url, login_first, posted_choice, refusals_as_pages
from ..models import Subscription


@transaction.non_atomic_requests  # calls the service: see docs/production.md
@never_cache
@login_first
@require_POST
@refusals_as_pages("change of plan", change=True)
def change_plan(request: HttpRequest) -> HttpResponse:
    """Ask for a change of plan: the hosted page when the service confirms there, else back to
    the billing page, which shows the request pending."""
    change = changes.change_plan(get_subscriber(request), *posted_choice(request))
    return HttpResponseRedirect(change.checkout_url or account_url())


@refusals_as_pages("renewal change", change=True)
def _renewal(request: HttpRequest, pk: int, resume: bool) -> HttpResponse:
    subscriber = get_subscriber(request)
    if subscriber is None:
        raise NoSubscriber()
    subscription = get_object_or_404(Subscription.objects.for_subscriber(subscriber), pk=pk)
    if resume:
        changes.resume(subscription)
    else:
        changes.cancel_at_period_end(subscription)
    return HttpResponseRedirect(account_url())


@transaction.non_atomic_requests
@never_cache
@login_first
@require_POST
def stop_renewal(request: HttpRequest, pk: int) -> HttpResponse:
    return _renewal(request, pk, resume=False)


@transaction.non_atomic_requests
@never_cache
@login_first
@require_POST
def resume_renewal(request: HttpRequest, pk: int) -> HttpResponse:
    return _renewal(request, pk, resume=True)
