"""Rendering of the app's own pages (checkout return and errors, the billing page)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from .conf import DEFAULTS, billing_settings


def render_page(
    request: HttpRequest, template: str, context: dict[str, Any], status: int = 200
) -> HttpResponse:
    """``render`` with ``billing_base_template``: ``BILLING['BASE_TEMPLATE']``, or the app's
    own base when it is empty."""
    base = str(billing_settings.BASE_TEMPLATE or DEFAULTS["BASE_TEMPLATE"])
    return render(request, template, {"billing_base_template": base, **context}, status=status)
