"""URLconf of the webhook benchmark: the app's callback and a bare INSERT baseline."""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt
from webhook_bench_site import BARE_TABLE


@csrf_exempt
def bare(request: HttpRequest) -> HttpResponse:
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {BARE_TABLE} (body, received_at) VALUES (%s, now())",
            [request.body.decode("utf-8", "replace")],
        )
    return HttpResponse(b'{"status":"ok"}', content_type="application/json")


urlpatterns = [
    path("billing/", include("billing_integration.urls")),
    path("bare/", bare),
]
