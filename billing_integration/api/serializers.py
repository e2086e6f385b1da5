"""Serializers of the DRF endpoints (``billing_integration.api.views``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rest_framework import serializers

from ..models import CheckoutSession, Subscription

if TYPE_CHECKING:  # generic in the stubs, not subscriptable at run time
    Serializer = serializers.Serializer[Any]
    ModelSerializer = serializers.ModelSerializer[Subscription]
else:
    Serializer, ModelSerializer = serializers.Serializer, serializers.ModelSerializer


class CheckoutSessionCreateSerializer(Serializer):
    """The request: ``product`` (pk, remote id or name), ``cycle`` (``"months-1"``; optional
    when the product has one cycle), ``currency`` (code or integer id; optional)."""

    product = serializers.CharField(max_length=255)
    cycle = serializers.CharField(max_length=32, required=False, allow_blank=True, allow_null=True)
    currency = serializers.CharField(
        max_length=16, required=False, allow_blank=True, allow_null=True
    )


class CheckoutSessionSerializer(Serializer):
    """The answer: the session's remote ``id``, the hosted page ``url`` and ``expires_at``."""

    id = serializers.CharField(source="remote_id")
    url = serializers.SerializerMethodField()
    expires_at = serializers.DateTimeField()

    def get_url(self, obj: CheckoutSession) -> str:
        return str(self.context["checkout_url"])


class SubscriptionSerializer(ModelSerializer):
    id = serializers.CharField(source="remote_id", read_only=True)
    product = serializers.SerializerMethodField()
    is_active = serializers.BooleanField(read_only=True)

    class Meta:
        model = Subscription
        fields = [
            "id",
            "product",
            "status",
            "is_active",
            "selected_billing_cycle",
            "selected_currency",
            "cycle_start_date",
            "cycle_end_date",
            "next_billing_date",
            "trial_end_date",
            "auto_renew",
            "last_payment_status",
        ]
        read_only_fields = fields

    def get_product(self, obj: Subscription) -> dict[str, Any] | None:
        product = obj.product
        if product is None:
            remote = obj.product_remote_id
            return {"id": str(remote), "name": None} if remote else None
        return {
            "id": str(product.remote_id) if product.remote_id else None,
            "pk": product.pk,
            "name": product.name,
        }
