"""Crafted admin list URLs (a NUL in a filter or search value, which PostgreSQL refuses in
text; a number past its numeric type; a date part past ``datetime``'s range) are answered as
Django answers any bad list parameter (``IncorrectLookupParameters``): a redirect to ``?e=1``,
never a 500."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.urls import reverse

from billing_integration.models import Health, Report

pytestmark = [pytest.mark.django_db, pytest.mark.postgresql]

CRAFTED = (
    "status__exact=a%00",
    "sync_state__exact=%00",
    "status=a%00",  # the subscription and checkout-session status filters
    "q=a%00",
    "amount__exact=1E%2B99999999",  # past PostgreSQL's numeric (invoices, payments, refunds)
    "created_at__year=99999999999",
    "created_at__year=10000",
    "received_at__year=99999999999",
    "remote_created__year=99999999999",
)


def _changelists() -> dict[str, str | None]:
    """The app's lists built by Django's changelist (health and reports are pages of their
    own), with their date hierarchy."""
    return {
        reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist"): (
            model_admin.date_hierarchy
        )
        for model, model_admin in admin.site._registry.items()
        if model._meta.app_label == "billing_integration" and model not in (Health, Report)
    }


@pytest.mark.parametrize("query", CRAFTED)
def test_crafted_list_parameters_redirect_to_the_error_flag(admin_client, query) -> None:
    answers = {}
    for url in _changelists():
        response = admin_client.get(f"{url}?{query}")
        answers[url] = (response.status_code, response.get("Location"))
    assert answers == {url: (302, f"{url}?e=1") for url in answers}
    assert admin_client.get(f"{url}?e=1").status_code == 200


@pytest.mark.parametrize("part", ["year=99999999999", "year=2026&{field}__month=99999999999"])
def test_a_date_hierarchy_past_datetimes_range_redirects_to_the_error_flag(
    admin_client, part
) -> None:
    answers, expected = {}, {}
    for url, field in _changelists().items():
        if field:
            query = f"{field}__{part.format(field=field)}"
            response = admin_client.get(f"{url}?{query}")
            answers[url] = (response.status_code, response.get("Location"))
            expected[url] = (302, f"{url}?e=1")
    assert answers == expected and len(answers) >= 4
