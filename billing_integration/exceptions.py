"""One exception tree rooted in ``BillingError``. ``BillingAPIError`` (the service answered
with an error status) has one subclass per status class; ``retryable`` says which are retried.
An error's text quotes a bounded excerpt of the service's answer, never a secret."""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from typing import Any
from urllib.parse import quote_plus

from django.core.exceptions import ImproperlyConfigured

_SECRET_FIELD = re.compile(r"password|secret|token", re.IGNORECASE)
_SECRET_TEXT = re.compile(r"((?:secret|token)[\"']?\s*[=:]\s*[\"']?)[^\"'&\s,}]+", re.IGNORECASE)
_MAX_BODY = 2000  # characters of an answer kept on an error
_MAX_PAGE = 64_000  # characters of a page (an HTML answer) read for its text
EXCERPT_CHARS = 300  # characters of the answer an error's text quotes
# The user info of a URL (``user:password@``): after ``scheme://`` (or ``//``, or at the start of
# a value without them), up to the last ``@`` before the path, query or fragment.
_USER_INFO = re.compile(r"^(\s*(?:[A-Za-z][A-Za-z0-9+.-]*:)?//)?[^/?#]*@")
_MESSAGE_KEYS = ("error_description", "message", "error", "detail", "errors")
# A script or style element (to its end, or the end of a body cut short), or any other tag.
_TAG = re.compile(r"<(script|style)\b.*?(?:</\1\s*>|\Z)|<[^>]*>", re.IGNORECASE | re.DOTALL)


class BillingError(Exception):
    """Base class of every error the app raises. ``in_doubt``: an earlier attempt of the same
    call got no answer to go by (a retryable error), or a write was answered with a redirect
    (not followed), so the request may have been applied."""

    retryable = False
    in_doubt = False


class BillingConfigurationError(BillingError, ImproperlyConfigured):
    """A setting is missing or malformed; ``setting`` names the one to fix."""

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class BillingTransportError(BillingError):
    """The request got no HTTP answer (timeout, refused or reset connection)."""

    retryable = True

    def __init__(self, message: str, *, operation: str | None = None) -> None:
        super().__init__(f"{operation}: {message}" if operation else message)
        self.operation = operation


class BillingAPIError(BillingError):
    """The service answered an operation with an error status."""

    retry_after: float | None = None  # seconds, from the answer's Retry-After

    def __init__(
        self,
        *,
        status: int,
        operation: str,
        body: Any = None,
        request_id: str | None = None,
        message: str | None = None,
        sent: Collection[str] = (),
    ) -> None:
        body = without_secrets(body, sent)  # the answer may quote what was sent (the token...)
        self.status = status
        self.operation = operation
        self.body = redact(body)
        # The request id is the service's too: it may quote them as well.
        self.request_id = without_secrets(request_id, sent) if request_id else request_id
        detail = [message, _summary(body)]
        text = ": ".join([f"{operation} failed with HTTP {status}", *filter(None, detail)])
        if self.request_id:
            text += f" (request id {self.request_id})"
        super().__init__(text)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status}, operation={self.operation!r})"


class BillingAnswerLostError(BillingAPIError):
    """A 2xx whose body cannot be read, or a create's naming no new id: in doubt, retried with
    the same idempotency key."""

    retryable = True


class BillingAuthenticationError(BillingAPIError):
    """Credentials refused, or a fresh token refused again."""


class BillingNotFoundError(BillingAPIError):
    """The resource does not exist remotely."""


class BillingValidationError(BillingAPIError):
    """The service refused the request body (400/422); not retried."""


class BillingIdempotencyConflict(BillingValidationError):
    """An idempotency key was refused (409 or 422 naming it): reused with a different body, or
    still in use. The request it repeats may have been applied: in doubt."""


class BillingConflictError(BillingAPIError):
    """409 Conflict."""


class BillingRateLimitError(BillingAPIError):
    """429: retried, its ``Retry-After`` honoured."""

    retryable = True


class BillingServerError(BillingAPIError):
    """5xx: retried."""

    retryable = True


_BY_STATUS: dict[int, type[BillingAPIError]] = {
    401: BillingAuthenticationError,
    403: BillingAuthenticationError,
    404: BillingNotFoundError,
    409: BillingConflictError,
    429: BillingRateLimitError,
}


class WebhookError(BillingError):
    """A delivery to the event callback could not be accepted."""


class WebhookVerificationError(WebhookError):
    """Signature, timestamp or credentials of a delivery do not check out."""


class BillingServiceMismatchError(BillingError):
    """The settings point at another service than the mirror's (nothing was sent); the way out
    is ``manage.py billing_service relink`` or ``reset``."""

    def __init__(self, message: str, *, recorded: Any, configured: Any) -> None:
        super().__init__(message)
        self.recorded = recorded
        self.configured = configured


class RemoteDataError(BillingError):
    """A value from the service cannot be stored as it is; ``field`` names the resource field."""

    def __init__(self, field: str, value: Any, problem: str) -> None:
        text = value if isinstance(value, str) else repr(value)
        shown = text if len(text) <= 80 else text[:80] + "..."
        super().__init__(f"{field}: {problem}: {shown!r}")
        self.field = field
        self.problem = problem


def error_for_status(status: int) -> type[BillingAPIError]:
    if status >= 500:
        return BillingServerError
    fallback = BillingValidationError if 400 <= status < 500 else BillingAPIError
    return _BY_STATUS.get(status, fallback)


#: Levels of a parsed answer an error keeps; deeper ones are replaced by ``NESTED``.
MAX_DEPTH = 64
NESTED = "[nested too deeply]"


def redact(value: Any, _depth: int = 0) -> Any:
    """``value`` (parsed JSON, or JSON or form text) with every secret-looking field redacted,
    and an object or list nested deeper than ``MAX_DEPTH`` levels replaced by ``NESTED``."""
    if isinstance(value, (dict, list)) and _depth >= MAX_DEPTH:
        return NESTED
    if isinstance(value, dict):
        return {
            k: "[redacted]" if _SECRET_FIELD.search(str(k)) else redact(v, _depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(v, _depth + 1) for v in value]
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):  # not JSON, or nested deeper than Python reads
            return _SECRET_TEXT.sub(r"\1[redacted]", value)[:_MAX_BODY]
        if isinstance(parsed, (dict, list)):
            return redact(parsed)
        return value[:_MAX_BODY]
    return value


def without_secrets(value: Any, secrets: Collection[str]) -> Any:
    """``value`` (parsed JSON or text) with each of ``secrets``, as sent, as written in JSON
    and as form-encoded, replaced by ``[redacted]``."""
    forms = {form for s in secrets if s for form in (s, json.dumps(s)[1:-1], quote_plus(s))}
    if not forms:
        return value
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    try:
        text = value if isinstance(value, str) else json.dumps(value, default=str)
    except RecursionError:  # nested deeper than Python writes: nothing of it is kept
        return NESTED
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, "[redacted]")
    if isinstance(value, str):
        return text
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # a secret as short as a number or a key, or too
        # deeply nested to read back: the text, still redacted
        return text


def without_user_info(url: Any) -> str:
    """``url`` as written, but its user info (``user:password@``), which may hold a password,
    left out: what a message may quote of a configured URL."""
    return _USER_INFO.sub(lambda match: match.group(1) or "", str(url), count=1)


def _summary(body: Any) -> str:
    """The service's message (else the whole answer) on one line, redacted, a page reduced to
    its text, cut to ``EXCERPT_CHARS``."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str) and body.lstrip().startswith("<"):  # a page: its text
        body = _TAG.sub(" ", body[:_MAX_PAGE])
    body = redact(body)
    if isinstance(body, dict):
        body = next((body[k] for k in _MESSAGE_KEYS if k in body), body)
    text = body if isinstance(body, str) else "" if body is None else json.dumps(body)
    text = " ".join((_TAG.sub(" ", text) if text.lstrip().startswith("<") else text).split())
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 3].rstrip() + "..."
