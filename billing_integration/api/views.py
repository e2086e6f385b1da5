"""DRF endpoints for single-page front ends."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils.decorators import method_decorator
from rest_framework import generics, permissions, status
from rest_framework.exceptions import ParseError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ..access import get_subscriber
from ..checkout.services import (
    AlreadySubscribed,
    CheckoutError,
    CheckoutInProgress,
    PaymentBeingConfirmed,
    PlanAlreadyHeld,
    ServiceUnavailable,
    start_checkout,
)
from ..checkout.views import account_url
from ..client import get_client, interactive_deadline
from ..exceptions import BillingError
from ..models import Subscription
from .serializers import (
    CheckoutSessionCreateSerializer,
    CheckoutSessionSerializer,
    SubscriptionSerializer,
)

if TYPE_CHECKING:  # generic in the stubs, not subscriptable at run time
    ListAPIView = generics.ListAPIView[Subscription]
else:
    ListAPIView = generics.ListAPIView


@method_decorator(transaction.non_atomic_requests, name="dispatch")  # see docs/production.md
class CheckoutSessionCreate(APIView):
    permission_classes = [permissions.IsAuthenticated]

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        deadline = interactive_deadline()  # first: the whole request ends by it
        try:
            body = request.data
        except RecursionError:  # DRF's JSON parser turns only ValueError into a 400
            raise ParseError("JSON parse error - the body is nested too deeply.") from None
        incoming = CheckoutSessionCreateSerializer(data=body)
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        try:
            session = start_checkout(
                get_subscriber(request),
                data["product"],
                data.get("cycle") or None,
                data.get("currency") or None,
                deadline=deadline,
            )
            url = get_client().checkout_url(str(session.remote_id))
        except CheckoutError as exc:
            error: dict[str, Any] = {"detail": exc.message, "code": exc.code}
            if isinstance(exc, (AlreadySubscribed, PlanAlreadyHeld, PaymentBeingConfirmed)):
                error["account_url"] = account_url()
            if isinstance(exc, PlanAlreadyHeld):
                error["held_plan"] = exc.held_name
            if isinstance(exc, CheckoutInProgress):
                error["open_url"] = exc.open_url
                until = exc.session.expires_at
                error["open_until"] = until.isoformat() if until is not None else None
            return Response(error, status=exc.status)
        except BillingError:
            down = ServiceUnavailable()
            return Response({"detail": down.message, "code": down.code}, status=down.status)
        body = CheckoutSessionSerializer(session, context={"checkout_url": url}).data
        code = status.HTTP_200_OK if session.reused else status.HTTP_201_CREATED
        return Response(body, status=code)


class SubscriptionList(ListAPIView):
    permission_classes = [permissions.IsAuthenticated]
    serializer_class = SubscriptionSerializer
    pagination_class = None

    def get_queryset(self) -> QuerySet[Subscription]:
        subscriber = get_subscriber(self.request)
        if subscriber is None:
            return Subscription.objects.none()
        qs = Subscription.objects.for_subscriber(subscriber)
        if self.request.query_params.get("active") in ("1", "true", "yes"):
            qs = qs.active()
        return qs.select_related("product").order_by("-created_at", "pk")
