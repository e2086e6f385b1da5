"""Authenticity of event deliveries: Standard Webhooks signatures (several ``whsec_`` secrets
during a rotation) or HTTP basic auth. No message raised here holds a secret."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from django.views.decorators.debug import sensitive_variables

from ..conf import billing_settings
from ..exceptions import WebhookVerificationError
from ..timestamps import TOLERANCE

logger = logging.getLogger("billing_integration.webhooks")
#: Django's error reports (and tools that follow its marks) hide every local variable of these
#: calls (not of what they call): the secrets, the credentials and the settings holding them.
_secret_frames = sensitive_variables()

_SECRET_PREFIX = "whsec_"
_MAX_HEADER = 4096
#: The shortest key that verifies a delivery (E004 reports a shorter one): a shorter one can be
#: guessed.
MIN_KEY_BYTES = 16


class MissingHeadersError(WebhookVerificationError):
    status, reason = 400, "missing_headers"  # signature headers or credentials absent, malformed


class StaleTimestampError(WebhookVerificationError):
    status, reason = 401, "stale_timestamp"  # webhook-timestamp outside the tolerance


class BadSignatureError(WebhookVerificationError):
    """No signature of the delivery matches a configured secret (or the settings cannot
    verify it: the answer is the same, ``log_hint`` says why)."""

    status, reason = 401, "bad_signature"
    message = "No valid webhook signature."
    #: For the log line only: the answer, which the sender reads, names no setting.
    log_hint = (
        "Check BILLING['WEBHOOK_SECRET']: it must be the secret the billing service signs "
        "this callback's deliveries with."
    )

    def __init__(self, log_hint: str | None = None) -> None:
        super().__init__(self.message)
        if log_hint is not None:
            self.log_hint = log_hint


class BasicAuthError(BadSignatureError):
    """Wrong HTTP basic credentials: the answer carries a Basic challenge."""

    message = "Invalid HTTP basic credentials."
    #: For the log line only, as ``BadSignatureError.log_hint``.
    log_hint = (
        "Check BILLING['WEBHOOK_BASIC_AUTH']: it must be the user:password the billing "
        "service sends with this callback's deliveries."
    )


@dataclass(frozen=True)
class Verification:
    """How a delivery was authenticated (``method``) and its ``webhook-id`` if signed."""

    method: str  # signature, basic or none
    message_id: str | None = None


def whsec_key(secret: object) -> bytes | None:
    """The key of a ``whsec_<base64>`` secret, padded or not; None for another form."""
    if not isinstance(secret, str) or not secret.startswith(_SECRET_PREFIX):
        return None
    value = secret.removeprefix(_SECRET_PREFIX)
    try:
        return base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


@lru_cache(maxsize=16)  # decoded once, not on every delivery
def _decode_secret(secret: str) -> bytes:
    key = whsec_key(secret)
    try:
        return key if key is not None else base64.b64decode(secret, validate=True)
    except (binascii.Error, ValueError):  # not base64: some services hand out raw secrets
        return secret.removeprefix(_SECRET_PREFIX).encode("utf-8")


@_secret_frames
def sign(body: bytes, secret: str, msg_id: str, timestamp: int) -> str:
    """The ``webhook-signature`` value for a body (``v1,<base64>``)."""
    digest = hmac.new(
        _decode_secret(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256
    ).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def webhook_header(headers: Mapping[str, str], name: str) -> str | None:
    """A ``webhook-*`` header, or its ``svix-*`` synonym."""
    return headers.get(f"webhook-{name}") or headers.get(f"svix-{name}")


@_secret_frames
def verify_signature(
    body: bytes,
    headers: Mapping[str, str],
    secrets: str | Sequence[str],
    *,
    tolerance: int = TOLERANCE,
    now: float | None = None,
) -> Verification:
    """Check a Standard Webhooks signature (``svix-*`` headers accepted too); raise
    ``WebhookVerificationError`` if it fails. ``headers``: ``request.headers`` or lower case."""
    msg_id, timestamp = webhook_header(headers, "id"), webhook_header(headers, "timestamp")
    signature = webhook_header(headers, "signature")
    if not msg_id or not timestamp or not signature:
        raise MissingHeadersError(
            "Missing webhook-id, webhook-timestamp or webhook-signature header."
        )
    if len(msg_id) > 255 or len(signature) > _MAX_HEADER or len(timestamp) > 20:
        raise MissingHeadersError("Malformed webhook signature headers.")
    try:
        ts = int(timestamp.strip())
    except ValueError:
        raise MissingHeadersError("webhook-timestamp is not an integer.") from None
    current = time.time() if now is None else now
    sent = ts / 1000 if ts > 1e11 else ts  # milliseconds (1e11 s is the year 5138)
    if abs(current - sent) > tolerance:
        # Rounded away from now: a refused timestamp never reads as within the tolerance.
        off = math.ceil(abs(current - sent))
        when = f"{off} s in the future" if sent > current else f"{off} s old"
        raise StaleTimestampError(
            f"webhook-timestamp is {when}: more than the tolerance of {tolerance} s."
        )
    # A key of under 16 bytes (``whsec_`` alone is none) verifies nothing: it can be guessed.
    listed = [secrets] if isinstance(secrets, str) else secrets
    keys = [key for key in (_decode_secret(s) for s in listed if s) if len(key) >= MIN_KEY_BYTES]
    if not keys:
        raise BadSignatureError(
            f"BILLING['WEBHOOK_SECRET'] holds no key of at least {MIN_KEY_BYTES} bytes: it "
            "verifies nothing."
        )
    signed = f"{msg_id}.{ts}.".encode() + body
    expected = [hmac.new(key, signed, hashlib.sha256).digest() for key in keys]
    valid = False
    for version, _, value in (candidate.partition(",") for candidate in signature.split()):
        try:
            given = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            continue
        for digest in expected:  # every comparison made: the time taken reveals no match
            valid |= version == "v1" and hmac.compare_digest(digest, given)
    if not valid:
        raise BadSignatureError()
    return Verification("signature", message_id=msg_id)


@_secret_frames
def verify_basic_auth(headers: Mapping[str, str], credentials: str) -> Verification:
    """Check ``Authorization: Basic`` against ``"user:password"`` in constant time, written in
    UTF-8 or in ISO-8859-1 (RFC 7617 leaves the charset to the sender; many clients, requests
    among them, send ISO-8859-1). Credentials without a password verify nothing."""
    if not credentials.partition(":")[2]:  # no password: anyone can send these credentials
        raise BasicAuthError("BILLING['WEBHOOK_BASIC_AUTH'] has no password: it verifies nothing.")
    authorization = headers.get("authorization") or ""
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "basic" or not value or len(value) > _MAX_HEADER:
        raise MissingHeadersError("Missing HTTP basic credentials.")
    try:
        given = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise MissingHeadersError("Malformed HTTP basic credentials.") from None
    forms = [credentials.encode("utf-8")]
    with contextlib.suppress(UnicodeEncodeError):  # a character ISO-8859-1 does not have
        forms.append(credentials.encode("latin-1"))
    valid = False
    for form in forms:  # every comparison made: the time taken reveals no match
        valid |= hmac.compare_digest(given, form)
    if not valid:
        raise BasicAuthError()
    return Verification("basic")


@_secret_frames
def verify_request(body: bytes, headers: Mapping[str, str]) -> Verification:
    """Authenticate one delivery by ``WEBHOOK_SECRET`` or ``WEBHOOK_BASIC_AUTH``; with neither
    set, refused unless ``WEBHOOK_ALLOW_UNVERIFIED`` (then accepted with a warning). A delivery
    that carries the other method's proof (signed with no secret set, or basic credentials
    unsigned with none set) is refused as a bad signature, not as missing headers: it is the
    service's delivery and the settings are wrong (``billing_doctor`` fails on it)."""
    conf = billing_settings.as_dict()
    secrets, basic = conf.get("WEBHOOK_SECRET"), conf.get("WEBHOOK_BASIC_AUTH")
    may_be_basic = basic and headers.get("authorization")
    signed = webhook_header(headers, "signature") is not None
    unverified = conf.get("WEBHOOK_ALLOW_UNVERIFIED")
    if signed and not secrets and not may_be_basic and not unverified:
        raise BadSignatureError(
            "A signed delivery, but BILLING['WEBHOOK_SECRET'] is not set: set it to the "
            "secret the billing service signs this callback's deliveries with."
        )
    if secrets and not signed and not basic and headers.get("authorization"):
        raise BadSignatureError(
            "Basic credentials, but only BILLING['WEBHOOK_SECRET'] is set: set "
            "BILLING['WEBHOOK_BASIC_AUTH'] if the billing service sends credentials."
        )
    if secrets and (signed or not may_be_basic):
        try:
            return verify_signature(body, headers, secrets)
        except WebhookVerificationError:
            if not may_be_basic:
                raise
    if basic:
        return verify_basic_auth(headers, str(basic))
    if unverified:
        logger.warning(
            "Accepting an unverified event delivery (BILLING['WEBHOOK_ALLOW_UNVERIFIED'] is True)."
        )
        return Verification("none", message_id=webhook_header(headers, "id"))
    raise BadSignatureError(
        "Event deliveries cannot be verified: set BILLING['WEBHOOK_SECRET'] or "
        "BILLING['WEBHOOK_BASIC_AUTH']."
    )
