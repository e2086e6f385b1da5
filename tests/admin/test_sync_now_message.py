"""The "Sync now" actions say what the pull did in a sentence, not as a Python dict."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import translation

from billing_integration.sync.pull import PullCounts

from .conftest import make_product

pytestmark = pytest.mark.django_db


def said(client, model: str, selected) -> list[str]:
    """The messages of the page the model's "sync_now" action leads to."""
    data = {"action": "sync_now", "_selected_action": [str(selected.pk)], "index": "0"}
    url = reverse(f"admin:billing_integration_{model}_changelist")
    response = client.post(url, data, follow=True)
    return [f"{m.level_tag}: {m}" for m in response.context["messages"]]


def test_sync_now_of_products_says_what_was_pulled(admin_client, billing_sandbox):
    from billing_integration.client import get_client

    get_client().create_product(
        {
            "name": "Remote plan",
            "description": "",
            "status": "published",
            "selected_currencies": ["1"],
            "prices": [{"currency": 1, "amount": 500}],
        }
    )
    messages = said(admin_client, "product", make_product("Local"))
    assert messages[0] == "success: Products pulled: 1 created, 0 updated, 0 unchanged."


def test_sync_now_of_customers_says_what_was_pulled(admin_client, billing_sandbox):
    from billing_integration.models import Customer

    local = Customer.objects.create(identifier="c1", first_name="A", last_name="B", email="a@b.c")
    assert said(admin_client, "customer", local) == [
        "success: Customers pulled: 0 created, 0 updated, 0 unchanged."
    ]


def test_the_summary_names_the_skipped_stale_and_refused_rows_when_there_are_some():
    from billing_integration.admin.mirror import pull_summary

    counts = PullCounts(created=2, updated=1, unchanged=0, skipped=3, stale=1, errors=2, pages=9)
    assert pull_summary(counts) == (
        "2 created, 1 updated, 0 unchanged, 3 skipped (local changes pending), "
        "1 stale (older than the stored state), 2 not applied (bad data)"
    )
    with translation.override("fr"):
        assert pull_summary(counts) == (
            "2 créés, 1 mis à jour, 0 inchangé, 3 ignorés (modifications locales en attente), "
            "1 périmé (plus ancien que l\u2019état enregistré), 2 non appliqués (données invalides)"
        )
