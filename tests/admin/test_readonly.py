"""Customers, subscriptions, checkout sessions, invoices, payments, refunds: pages render with
bounded queries for 20 rows, remote-owned fields are read-only, links join them, no delete."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from billing_integration.models import (
    CheckoutSession,
    Customer,
    Health,
    Heartbeat,
    Invoice,
    OutboxEntry,
    Payment,
    Refund,
    Report,
    Subscription,
)
from billing_integration.outbox import from_remote

from .conftest import make_product, staff_with

pytestmark = pytest.mark.django_db


def url(model, view: str, *args) -> str:
    return reverse(f"admin:billing_integration_{model._meta.model_name}_{view}", args=args)


@pytest.fixture
def rows(db):
    """20 of each: customers with a subscription, a checkout session and the three records."""
    product = make_product(remote=True)
    made: dict[str, list] = {
        k: [] for k in ("customer", "subscription", "checkout", "invoice", "payment", "refund")
    }
    with from_remote():
        for i in range(20):
            customer = Customer.objects.create(
                remote_id=uuid.uuid4(),
                identifier=f"user-{i}",
                first_name="Ada",
                last_name=f"L{i}",
                email=f"u{i}@example.com",
                phone="+22500000000",
                sync_state="synced" if i else "failed",
                sync_error="" if i else "HTTP 500 from the service",
            )
            sub = Subscription.objects.create(
                remote_id=uuid.uuid4(),
                customer=customer,
                product=product,
                customer_remote_id=customer.remote_id,
                product_remote_id=product.remote_id,
                status="published",
                selected_billing_cycle="months-1",
                selected_currency="XOF",
                sync_state="synced",
            )
            checkout = CheckoutSession.objects.create(
                remote_id=uuid.uuid4(),
                customer=customer,
                product=product,
                status="open",
                selected_billing_cycle="months-1",
                selected_currency=1,
                sync_state="synced",
            )
            common = {
                "customer": customer,
                "subscription": sub,
                "amount": Decimal("10000"),
                "currency": "XOF",
                "customer_remote_id": customer.remote_id,
                "subscription_remote_id": sub.remote_id,
            }
            invoice = Invoice.objects.create(
                remote_id=uuid.uuid4(), status="paid", product=product, **common
            )
            payment = Payment.objects.create(
                remote_id=uuid.uuid4(),
                status="completed",
                product=product,
                invoice_remote_id=invoice.remote_id,
                **common,
            )
            refund = Refund.objects.create(
                remote_id=uuid.uuid4(),
                status="initiated",
                payment=payment,
                payment_remote_id=payment.remote_id,
                reason="duplicate",
                **common,
            )
            for key, obj in (
                ("customer", customer),
                ("subscription", sub),
                ("checkout", checkout),
                ("invoice", invoice),
                ("payment", payment),
                ("refund", refund),
            ):
                made[key].append(obj)
    return made


MODELS = [Customer, Subscription, CheckoutSession, Invoice, Payment, Refund]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_changelist_and_change_view_render_with_bounded_queries(
    model, rows, admin_client, django_assert_max_num_queries
):
    with django_assert_max_num_queries(12):  # 2: the savepoint around the list's counts
        response = admin_client.get(url(model, "changelist"))
    assert response.status_code == 200
    assert response.context["cl"].result_count == 20
    obj = model.objects.order_by("pk").first()
    with django_assert_max_num_queries(16):
        response = admin_client.get(url(model, "change", obj.pk))
    assert response.status_code == 200
    assert str(obj.remote_id) in response.content.decode()


@pytest.mark.parametrize("model", MODELS[1:], ids=lambda m: m.__name__)
def test_remote_owned_models_are_entirely_read_only(model, rows, admin_client):
    obj = model.objects.order_by("pk").first()
    assert admin_client.get(url(model, "add")).status_code == 403
    page = admin_client.get(url(model, "change", obj.pk))
    html = page.content.decode()
    assert 'name="_save"' not in html and 'name="_continue"' not in html
    assert not page.context["adminform"].form.fields  # no editable field at all
    before = model.objects.get(pk=obj.pk).status
    assert admin_client.post(url(model, "change", obj.pk), {"status": "forged"}).status_code == 403
    assert model.objects.get(pk=obj.pk).status == before
    assert admin_client.post(url(model, "delete", obj.pk), {"post": "yes"}).status_code == 403
    assert model.objects.filter(pk=obj.pk).exists()
    assert "delete_selected" not in admin_client.get(url(model, "changelist")).content.decode()


def test_customer_remote_owned_fields_are_read_only(rows, admin_client):
    customer = rows["customer"][0]
    page = admin_client.get(url(Customer, "change", customer.pk))
    fields = page.context["adminform"].form.fields
    # Pushed: nothing is editable (the service has no customer update).
    assert set(fields) == set()
    html = page.content.decode()
    assert "+22500000000" in html and "billing-badge-failed" in html
    assert "HTTP 500 from the service" in html
    # A forged POST changes nothing, and (nothing to save) queues no push: it queued one,
    # which, with nothing to send, showed the customer synced.
    admin_client.post(url(Customer, "change", customer.pk), {"identifier": "x", "phone": "1"})
    customer.refresh_from_db()
    assert customer.identifier == "user-0" and customer.phone == "+22500000000"
    assert customer.sync_state == "failed" and not OutboxEntry.objects.exists()

    with from_remote():
        local = Customer.objects.create(identifier="not-pushed")
    fields = admin_client.get(url(Customer, "change", local.pk)).context["adminform"].form.fields
    assert {"identifier", "first_name", "last_name", "email"} <= set(fields)
    assert not {"phone", "address_line_1", "status"} & set(fields)


def test_links_between_related_objects(rows, admin_client):
    customer, sub = rows["customer"][0], rows["subscription"][0]
    invoice, payment, refund = rows["invoice"][0], rows["payment"][0], rows["refund"][0]
    pages = {
        Customer: (customer, [sub, rows["checkout"][0]]),
        Subscription: (sub, [customer, payment, invoice, refund]),
        Invoice: (invoice, [customer, sub, payment]),
        Payment: (payment, [customer, sub, invoice, refund]),
        Refund: (refund, [customer, sub, payment]),
    }
    for model, (obj, targets) in pages.items():
        html = admin_client.get(url(model, "change", obj.pk)).content.decode()
        for target in targets:
            assert url(type(target), "change", target.pk) in html, (model, target)


def test_records_are_visible_to_view_only_staff(rows):
    client = Client()
    client.force_login(staff_with("view_payment"))
    payment = rows["payment"][0]
    assert client.get(url(Payment, "changelist")).status_code == 200
    assert client.get(url(Payment, "change", payment.pk)).status_code == 200
    assert client.get(url(Invoice, "changelist")).status_code == 403


def test_no_secret_is_shown(rows, admin_client, settings):
    settings.BILLING = {**settings.BILLING, "CLIENT_SECRET": "s3cr3t-value-xyz"}
    for model in MODELS:
        obj = model.objects.order_by("pk").first()
        for page in (url(model, "changelist"), url(model, "change", obj.pk)):
            assert "s3cr3t-value-xyz" not in admin_client.get(page).content.decode()


@pytest.mark.parametrize("view", ["change", "history"])
def test_the_health_and_report_pages_have_no_object_pages(rows, admin_client, view):
    # Both are pages over a proxy model: a typed object URL answers 404, not a server error.
    heartbeat = Heartbeat.objects.create(name="beat:drain_outbox", at=timezone.now())
    subscription = rows["subscription"][0]
    for model, pk in ((Health, heartbeat.pk), (Report, subscription.pk)):
        assert admin_client.get(url(model, "changelist")).status_code == 200
        path = f"{url(model, 'changelist')}{pk}/{view}/"
        assert admin_client.get(path).status_code == 404
