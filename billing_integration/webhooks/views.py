"""The event callback: verify the raw body, store it, answer (processing comes after commit).
``POST``: 200 stored (or already; a JSON array of objects: each of them), 400 bad signature
headers or not a JSON object, 401 bad signature, stale timestamp or wrong credentials, 413 too
large, 503 not stored. ``HEAD``, ``GET``: 200 (reachability probes), but 400 with a delivery's
``webhook-*`` headers: a POST redirected here (the callback registered without its trailing
slash, or with http for https) comes as a GET without its body."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from ..exceptions import WebhookVerificationError
from ..health import record_refused
from ..models import EventState
from .ingest import enqueue, split_batch, store_delivery
from .verification import BasicAuthError, verify_request, webhook_header

logger = logging.getLogger("billing_integration.webhooks")


@csrf_exempt
@transaction.non_atomic_requests
@require_http_methods(["POST", "HEAD", "GET"])
def webhook(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        if webhook_header(request.headers, "id") or webhook_header(request.headers, "signature"):
            return _redirected(request)
        return HttpResponse(status=200)
    try:
        body = request.body
    except RequestDataTooBig:  # not stored: logged and counted, as a refused signature is
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        logger.warning(
            "Refused an event delivery (413): its body is over DATA_UPLOAD_MAX_MEMORY_SIZE "
            "(%s bytes)",
            limit,
        )
        record_refused("too_large")  # billing_doctor, Health page
        return JsonResponse({"error": "Body too large."}, status=413)
    try:
        verification = verify_request(body, request.headers)
    except WebhookVerificationError as exc:
        status = getattr(exc, "status", 401)
        hint = getattr(exc, "log_hint", "")  # for the log only: the answer names no setting
        shown = f"{exc} {hint}" if hint else str(exc)
        logger.warning("Refused an event delivery (%s): %s", status, shown)
        record_refused(getattr(exc, "reason", "bad_signature"))  # billing_doctor, Health page
        response = JsonResponse({"error": str(exc)}, status=status)
        if isinstance(exc, BasicAuthError):
            response["WWW-Authenticate"] = 'Basic realm="billing webhooks"'
        return response
    charset = request.encoding  # the Content-Type's, when Python knows it: read after UTF-8
    # several events in one delivery: each stored
    batch = split_batch(body, verification, charset)
    try:
        results = [
            store_delivery(part, request.headers, verified, charset)
            for part, verified in batch or [(body, verification)]
        ]
    except DatabaseError:  # the service's retry stores the rest (the stored are duplicates)
        logger.exception("Could not store an event delivery")
        return JsonResponse({"error": "The event could not be stored; retry later."}, status=503)
    # New, or a redelivery of one not processed yet (its message may have been lost); an event
    # an array repeats is sent once.
    for pk in dict.fromkeys(s.pk for s in results if s.state == EventState.RECEIVED):
        if pk is not None:
            enqueue(pk)
    if batch is not None:
        statuses = {stored.status for stored in results}
        status = next(s for s in ("conflict", "received", "duplicate") if s in statuses)
        return JsonResponse({"status": status, "ids": [stored.event_id for stored in results]})
    (stored,) = results
    if stored.state == EventState.REJECTED:
        return JsonResponse({"error": stored.error or "Malformed body."}, status=400)
    return JsonResponse({"status": stored.status, "id": stored.event_id if stored.pk else None})


def _redirected(request: HttpRequest) -> HttpResponse:
    """A delivery that came as a GET or HEAD: a redirect (APPEND_SLASH, or to https) dropped its
    body. Refused (400, the service retries), logged and counted: answered 200 as a probe, the
    service would count it delivered and the event would be lost unseen."""
    url = request.build_absolute_uri(request.path)
    logger.warning(
        "Refused an event delivery (400): it came as a %s, without its body: the service's "
        "POST was redirected here. Register the callback URL exactly as %s (its trailing "
        "slash, its scheme) with the billing service.",
        request.method,
        url,
    )
    record_refused("redirected")  # billing_doctor, Health page
    text = "A delivery must be POSTed to this URL; this one came as a %s (redirected?)."
    return JsonResponse({"error": text % request.method}, status=400)
