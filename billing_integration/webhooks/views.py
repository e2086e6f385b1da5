"""The event callback: verify the raw body, store it, answer 2xx; processing comes after.

``POST`` -> 200 for a stored (or already stored) event, 400 for missing or malformed
signature headers and for a body that is not a JSON object (kept as ``rejected``), 401 for
a bad signature, a stale timestamp or wrong credentials, 503 only when the event could not
be stored. ``HEAD`` (and ``GET``) -> 200 with no body, for reachability probes. Each refusal
(400 or 401 from the verification) is counted by reason for ``billing_doctor``.
"""

from __future__ import annotations

import json
import logging

from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from ..exceptions import WebhookVerificationError
from ..models import EventState
from .ingest import count_refusal, enqueue, request_headers, store_delivery
from .verification import verify_request

logger = logging.getLogger("billing_integration.webhooks")

__all__ = ["webhook"]


@csrf_exempt
@transaction.non_atomic_requests
@require_http_methods(["POST", "HEAD", "GET"])
def webhook(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return HttpResponse(status=200)
    try:
        body = request.body
    except RequestDataTooBig:
        return JsonResponse({"error": "Body too large."}, status=413)
    headers = request_headers(request.META)
    try:
        verification = verify_request(body, headers)
    except WebhookVerificationError as exc:
        status = getattr(exc, "status", 401)
        logger.warning("Refused an event delivery (%s): %s", status, exc)
        count_refusal(exc)  # billing_doctor and the Health page report refusals
        response = JsonResponse({"error": str(exc)}, status=status)
        if status == 401 and "basic" in str(exc).lower():
            response["WWW-Authenticate"] = 'Basic realm="billing webhooks"'
        return response
    try:
        stored = store_delivery(body, headers, verification)
    except DatabaseError:
        logger.exception("Could not store an event delivery")
        return JsonResponse({"error": "The event could not be stored; retry later."}, status=503)
    if stored.state == EventState.REJECTED:
        return JsonResponse({"error": stored.error or "Malformed body."}, status=400)
    if stored.pk is not None and (stored.created or stored.state == EventState.RECEIVED):
        # New, or a redelivery of one not processed yet (its task may have been lost).
        enqueue(stored.pk)
    # What JsonResponse would send, without its encoder class and dict check (the hot path).
    status = '"received"' if stored.created else '"duplicate"'
    event_id = json.dumps(stored.event_id) if stored.pk is not None else "null"
    return HttpResponse(
        f'{{"status": {status}, "id": {event_id}}}', content_type="application/json"
    )
