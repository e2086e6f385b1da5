"""Only what the service is known to sell is offered: an archived product published again
here while the service refuses (400 ``invalid_transition``) stays archived for checkout,
the button and the pricing page (its last confirmed state)."""

from __future__ import annotations

import pytest

from billing_integration.checkout.services import ProductUnavailable, start_checkout
from billing_integration.models import CheckoutSession, OutboxEntry, Product
from billing_integration.outbox.push import PushOutcome, push_entry

from .conftest import make_product, push_open_entries
from .test_one_purchase import button, post

pytestmark = pytest.mark.django_db(transaction=True)


def republished_but_refused() -> Product:
    """Pushed published, archived (the service agrees), published again (it refuses)."""
    product = make_product("Pro plan")
    product.archive()
    push_open_entries()
    product.publish()
    [entry] = OutboxEntry.objects.open()
    assert push_entry(entry.pk).status == PushOutcome.FAILED
    product.refresh_from_db()
    assert (product.status, product.sync_state) == ("published", "failed")
    assert "invalid_transition" in product.sync_error
    return product


def test_a_refused_publication_is_not_sold(billing_sandbox, logged_in, user):
    product = republished_but_refused()
    assert product.confirmed_status == "archived"
    billing_sandbox.clear_requests()

    with pytest.raises(ProductUnavailable) as info:
        start_checkout(user, product, "months-1", "XOF")
    assert info.value.code == "product_archived"
    response = post(logged_in, product)
    assert response.status_code == 409
    assert "retired and can no longer be bought" in response.content.decode()
    assert billing_sandbox.requests(operation="create_checkout_session") == []
    assert not CheckoutSession.objects.exists()

    html = button(product, user, cycle="months-1", currency="XOF")
    assert "<form" not in html and "billing-checkout-unavailable" in html
    assert list(Product.objects.on_sale()) == []


def test_the_pricing_page_lists_it_only_once_the_service_confirms(billing_sandbox, logged_in, user):
    product = republished_but_refused()
    other = make_product("Starter")
    html = logged_in.get("/pricing/").content.decode()
    assert f'data-product="{other.pk}"' in html
    assert f'data-product="{product.pk}"' not in html

    # a later answer of the service saying "published" puts it back on sale
    Product.objects.filter(pk=product.pk).update(
        remote_data={**product.remote_data, "status": "published"}
    )
    assert f'data-product="{product.pk}"' in logged_in.get("/pricing/").content.decode()
    assert set(Product.objects.on_sale()) == {product, other}


def test_products_never_refused_are_sold_per_their_status(billing_sandbox):
    product = make_product("Pro plan")
    draft = make_product("Draft plan", status="draft")
    assert product.confirmed_status == "published" and draft.confirmed_status == "draft"
    # a failed push of something else (the service's status is the same) changes nothing
    Product.objects.filter(pk=product.pk).update(sync_state="failed")
    product.refresh_from_db()
    assert product.confirmed_status == "published"
    assert list(Product.objects.on_sale()) == [product]


def test_the_services_status_in_capitals_is_read_as_the_mapping_reads_it(billing_sandbox):
    """The last status the service confirmed, in ``remote_data``, may be spelled ``" ARCHIVED"``:
    the product is still retired for checkout and the pricing page."""
    product = republished_but_refused()
    data = dict(product.remote_data, status=" ARCHIVED")
    Product.objects.filter(pk=product.pk).update(remote_data=data)
    product.refresh_from_db()
    assert product.confirmed_status == "archived"
    assert list(Product.objects.on_sale()) == []


def assert_sold_as_archived(product, billing_sandbox, logged_in, user) -> None:
    """Not on sale anywhere, and a checkout of it is refused before anything is sent."""
    billing_sandbox.clear_requests()
    assert product.confirmed_status == "archived"
    assert list(Product.objects.on_sale()) == []
    assert "<form" not in button(product, user, cycle="months-1", currency="XOF")
    assert post(logged_in, product).status_code == 409
    assert billing_sandbox.requests(operation="create_checkout_session") == []


def test_a_publication_not_confirmed_yet_is_not_sold(billing_sandbox, logged_in, user):
    """Published again here, its push still to come: the service still says archived, so it
    is not sold until it answers (the admin's warning says so)."""
    product = make_product("Pro plan")
    product.archive()
    push_open_entries()
    product.publish()
    product.refresh_from_db()
    assert (product.status, product.sync_state) == ("published", "pending")
    assert_sold_as_archived(product, billing_sandbox, logged_in, user)


def test_a_draft_published_here_is_sold_once_the_service_confirms(billing_sandbox, user):
    draft = make_product("Draft plan", status="draft")
    draft.publish()
    draft.refresh_from_db()
    assert (draft.confirmed_status, list(Product.objects.on_sale())) == ("draft", [])
    push_open_entries()
    draft.refresh_from_db()
    assert (draft.sync_state, draft.confirmed_status) == ("synced", "published")
    assert list(Product.objects.on_sale()) == [draft]
    assert "<form" in button(draft, user, cycle="months-1", currency="XOF")


def test_a_refused_publication_stays_off_sale_after_another_edit(billing_sandbox, logged_in, user):
    """An unrelated edit after the refusal (the product pending again) does not put it back
    on sale: the service still says archived."""
    product = republished_but_refused()
    product.description = "New wording"
    product.save()
    product.refresh_from_db()
    assert product.sync_state == "pending"
    assert_sold_as_archived(product, billing_sandbox, logged_in, user)
