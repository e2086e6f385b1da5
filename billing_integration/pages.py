"""Rendering of the app's own pages (checkout return and errors, the billing page)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from .conf import billing_settings

DEFAULT_BASE_TEMPLATE = "billing_integration/base.html"


def base_template() -> str:
    """``BILLING['BASE_TEMPLATE']``, or the app's own base when it is empty."""
    return str(billing_settings.BASE_TEMPLATE or DEFAULT_BASE_TEMPLATE)


def render_page(
    request: HttpRequest, template: str, context: dict[str, Any], status: int = 200
) -> HttpResponse:
    """``render`` with ``billing_base_template`` in the context."""
    return render(
        request, template, {"billing_base_template": base_template(), **context}, status=status
    )
