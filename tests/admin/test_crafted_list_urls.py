"""Crafted admin list URLs (a NUL in a filter or search value, which PostgreSQL refuses in
text; a number past its numeric type; a date part past ``datetime``'s range) are answered as
Django answers any bad list parameter (``IncorrectLookupParameters``): a redirect to ``?e=1``,
never a 500."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.db import DataError
from django.urls import reverse

from billing_integration.admin import mirror
from billing_integration.models import Health, Product, Report

from .conftest import make_product

pytestmark = pytest.mark.django_db

CRAFTED = (
    "status__exact=a%00",
    "sync_state__exact=%00",
    "status=a%00",  # the subscription and checkout-session status filters
    "q=a%00",
    # past PostgreSQL's numeric (invoices, payments, refunds); SQLite takes it (no row matches)
    pytest.param("amount__exact=1E%2B99999999", marks=pytest.mark.postgresql),
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
            admin.site.get_model_admin(model).date_hierarchy
        )
        for model in apps.get_app_config("billing_integration").get_models()
        if admin.site.is_registered(model) and model not in (Health, Report)
    }


@pytest.mark.parametrize("query", CRAFTED)
def test_crafted_list_parameters_redirect_to_the_error_flag(admin_client, query) -> None:
    answers = {}
    for url in _changelists():
        response = admin_client.get(f"{url}?{query}")
        answers[url] = (response.status_code, response.get("Location"))
    assert answers == {url: (302, f"{url}?e=1") for url in answers}
    assert admin_client.get(f"{url}?e=1").status_code == 200


@pytest.mark.parametrize(
    "part",
    [
        "year=99999999999",
        "year=2026&{field}__month=99999999999",
        "year=2026&{field}__month=1&{field}__day=99999999999",
    ],
)
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


def test_an_actions_database_error_is_not_answered_with_the_error_flag(
    admin_client, monkeypatch
) -> None:
    """Only the list's GET is guarded: a POST (an admin action) that fails is a failure, not a
    redirect to ``?e=1`` that would read as a bad filter."""
    product = make_product()

    def refused(queryset):
        raise DataError("refused by the database")

    monkeypatch.setattr(mirror, "retry_failed_pushes", refused)
    url = reverse("admin:billing_integration_product_changelist")
    data = {"action": "retry_failed_push", "_selected_action": [str(product.pk)], "index": "0"}
    with pytest.raises(DataError, match="refused by the database"):
        admin_client.post(url, data)


def test_a_list_that_fails_without_any_parameter_is_an_error_not_a_loop(
    admin_client, monkeypatch, caplog
) -> None:
    """A ``ValueError`` of the list itself (a bug, not a parameter) was answered with a
    redirect to ``?e=1`` again and again; the bare ``?e=1`` list now raises it, and every
    refusal is logged. A crafted parameter beside ``?e=1`` is still redirected."""
    make_product()
    url = reverse("admin:billing_integration_product_changelist")

    def broken(self, request):
        raise ValueError("a bug in the list's query")

    monkeypatch.setattr(type(admin.site.get_model_admin(Product)), "get_queryset", broken)
    first = admin_client.get(url)
    assert (first.status_code, first["Location"]) == (302, f"{url}?e=1")
    with pytest.raises(ValueError, match="a bug in the list's query"):
        admin_client.get(f"{url}?e=1")
    assert [r.getMessage() for r in caplog.records if r.name == "billing_integration.admin"] == [
        f"admin list {url} refused: ValueError",
        f"admin list {url} refused: ValueError",
    ]
    monkeypatch.undo()
    crafted = admin_client.get(f"{url}?e=1&created_at__year=10000")
    assert (crafted.status_code, crafted["Location"]) == (302, f"{url}?e=1")
    assert admin_client.get(f"{url}?e=1").status_code == 200
