"""A URLconf for the access-check tests: protected views next to the app's URLs."""

from django.http import HttpResponse
from django.urls import include, path
from django.views.generic import View
from rest_framework.response import Response
from rest_framework.views import APIView

from billing_integration.access import (
    HasActiveSubscription,
    SubscriptionRequiredMixin,
    subscription_required,
)


@subscription_required
def members(request):
    return HttpResponse("members only")


@subscription_required(product="Pro plan")
def pro_only(request):
    return HttpResponse("pro only")


@subscription_required(product="Pro plan", redirect_url="/upgrade/")
def pro_upgrade(request):
    return HttpResponse("pro only")


def pricing(request):
    return HttpResponse("pricing")


class MembersView(SubscriptionRequiredMixin, View):
    def get(self, request):
        return HttpResponse("members cbv")


class ProView(SubscriptionRequiredMixin, View):
    subscription_product = "Pro plan"

    def get(self, request):
        return HttpResponse("pro cbv")


class MembersAPI(APIView):
    permission_classes = [HasActiveSubscription]

    def get(self, request):
        return Response({"ok": True})


class ProAPI(APIView):
    permission_classes = [HasActiveSubscription]
    subscription_product = "Pro plan"

    def get(self, request):
        return Response({"ok": True})


urlpatterns = [
    path("billing/", include("billing_integration.urls")),
    path("members/", members),
    path("pro/", pro_only),
    path("pro-upgrade/", pro_upgrade),
    path("pricing/", pricing, name="pricing"),
    path("members-cbv/", MembersView.as_view()),
    path("pro-cbv/", ProView.as_view()),
    path("api/members/", MembersAPI.as_view()),
    path("api/pro/", ProAPI.as_view()),
    path("login/", pricing, name="login"),
]
