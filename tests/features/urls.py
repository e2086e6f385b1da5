"""A URLconf for the entitlement tests: each access form, the feature named in the path."""

from django.http import HttpResponse
from django.template import engines
from django.urls import include, path
from django.views.generic import View
from rest_framework.response import Response
from rest_framework.views import APIView

from billing_integration.access import (
    FeatureRequiredMixin,
    HasFeature,
    feature_limit,
    feature_required,
    has_feature,
)

TEMPLATE = engines["django"].from_string(
    "{% load billing %}"
    "filter={% if user|has_feature:key %}yes{% else %}no{% endif %};"
    "request={% if request|has_feature:key %}yes{% else %}no{% endif %};"
    "tag={% if_feature key %}yes{% else %}no{% endif_feature %};"
    "limit={{ user|feature_limit:key }}"
)


def by_decorator(request, key):
    return feature_required(key)(lambda request: HttpResponse("ok"))(request)


@feature_required("sso", redirect_url="/upgrade/")
def sso_page(request):
    return HttpResponse("sso")


class ByMixin(FeatureRequiredMixin, View):
    def get_required_feature(self):
        return self.kwargs["key"]

    def get(self, request, key):
        return HttpResponse("ok")


class SsoMixin(FeatureRequiredMixin, View):
    required_feature = "sso"

    def get(self, request):
        return HttpResponse("ok")


class ByPermission(APIView):
    permission_classes = [HasFeature]

    @property
    def required_feature(self):
        return self.kwargs["key"]

    def get(self, request, key):
        return Response({"ok": True})


class SsoPermission(APIView):
    permission_classes = [HasFeature("sso")]

    def get(self, request):
        return Response({"ok": True})


class NoFeaturePermission(APIView):
    permission_classes = [HasFeature]

    def get(self, request):
        return Response({"ok": True})


def in_template(request, key):
    return HttpResponse(TEMPLATE.render({"key": key}, request))


@feature_required("sso")
def many_checks(request):
    """Every form at once (after the decorator's check): the query-count test's view."""
    checks = [
        has_feature(request.user, "api"),
        has_feature(request, "members"),
        feature_limit(request.user, "seats"),
        feature_limit(request, "seats"),
    ]
    body = TEMPLATE.render({"key": "seats"}, request) + TEMPLATE.render({"key": "api"}, request)
    return HttpResponse(f"{checks}|{body}")


class ManyChecksAPI(APIView):
    permission_classes = [HasFeature("sso"), HasFeature("api")]

    def get(self, request):
        return Response({"seats": feature_limit(request, "seats")})


urlpatterns = [
    path("billing/", include("billing_integration.urls")),
    path("decorator/<str:key>/", by_decorator),
    path("sso/", sso_page),
    path("mixin/<str:key>/", ByMixin.as_view()),
    path("sso-mixin/", SsoMixin.as_view()),
    path("api/<str:key>/", ByPermission.as_view()),
    path("api-sso/", SsoPermission.as_view()),
    path("api-none/", NoFeaturePermission.as_view()),
    path("template/<str:key>/", in_template),
    path("many/", many_checks),
    path("api-many/", ManyChecksAPI.as_view()),
    path("login/", lambda request: HttpResponse("login"), name="login"),
]
