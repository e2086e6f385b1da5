"""``BillingClient``: every operation of the billing interface, and nothing else speaks HTTP.

Wire rules (billing-service-interface.md, section 4):
- billing paths are ``{BASE_URL}/v1/api/billing/...``; the token is at
  ``{AUTH_URL}/realms/{REALM}/protocol/openid-connect/token``, form-encoded;
- every billing call sends ``Accept`` and ``Content-Type: application/json`` and the token in
  ``x-kc-token`` (never ``Authorization``); every POST and PATCH sends ``x-idempotency-id``;
- responses are wrapped in ``data``; POST /subscriptions answers an array.

Every operation takes ``deadline=`` (seconds, or a shared ``Deadline``): the call, its
retries, the waits between them and a token fetch it needs end by then (each attempt's
connect and read timeouts are cut to the time left, and so is their total). Calls a person
waits on use it (``interactive_deadline()``: ``BILLING['INTERACTIVE_DEADLINE']`` less the
page's margin); they never wait on the shared backoff window, and one that fails to the end
marks the service known down (``backoff.py``). Background work leaves it out and keeps the
patient ``MAX_RETRIES`` policy. ``with_deadline(deadline)`` gives a view of the client whose
calls all share one deadline (for code that takes a ``client``, such as a pull).
"""

from __future__ import annotations

import copy
import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import requests
from requests.adapters import HTTPAdapter

from ..conf import billing_settings
from ..exceptions import (
    BillingAnswerLostError,
    BillingAPIError,
    BillingAuthenticationError,
    BillingError,
    BillingIdempotencyConflict,
    BillingRateLimitError,
    BillingTransportError,
    error_for_status,
    excerpt,
    redact,
)
from .backoff import KNOWN_DOWN_SECONDS, SharedBackoff
from .retry import MIN_ATTEMPT, Deadline, RetryPolicy, parse_retry_after
from .tokens import TokenProvider

logger = logging.getLogger("billing_integration.client")

API_PREFIX = "/v1/api/billing"
RESOURCES = ("products", "customers", "subscriptions")
#: Pages read at most from one list (a hard stop for a list that never ends).
MAX_PAGES = 100_000
#: A deadline argument: seconds from now, a shared ``Deadline``, or ``None`` (no deadline).
DeadlineArg = Deadline | float | None
_JSON_HEADERS = {"Accept": "application/json", "Content-Type": "application/json"}


class BillingClient:
    """A client for one account of the billing service.

    Build it with ``get_client()`` (one per process) unless you need a second account.
    All keyword arguments default to ``settings.BILLING``.
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        auth_url: str | None = None,
        checkout_url: str | None = None,
        realm: str | None = None,
        client_id: str | None = None,
        client_secret: str | None = None,
        session: requests.Session | None = None,
        retry: RetryPolicy | None = None,
        timeout: tuple[float, float] | None = None,
        page_size: int | None = None,
        sleep: Any = time.sleep,
        backoff: SharedBackoff | None = None,
    ) -> None:
        conf = billing_settings
        self.base_url = (base_url or conf.BASE_URL).rstrip("/")
        self.auth_url = (auth_url or conf.AUTH_URL).rstrip("/")
        self.checkout_base = (checkout_url or conf.CHECKOUT_URL).rstrip("/")
        self.realm = realm or conf.REALM
        self.client_id = client_id or conf.CLIENT_ID
        self.__secret = client_secret or conf.CLIENT_SECRET
        self.retry = retry or RetryPolicy(
            max_retries=conf.MAX_RETRIES,
            backoff_base=conf.BACKOFF_BASE,
            backoff_max=conf.BACKOFF_MAX,
            retry_after_max=conf.RETRY_AFTER_MAX,
        )
        self.timeout = timeout or (conf.CONNECT_TIMEOUT, conf.READ_TIMEOUT)
        self.page_size = page_size or conf.PAGE_SIZE
        self.max_pages = MAX_PAGES
        self._sleep = sleep
        #: The window every worker backs off in together (``client/backoff.py``).
        self.backoff = backoff or SharedBackoff.from_settings()
        #: The deadline of every call made through this client (see ``with_deadline``).
        self.deadline: Deadline | None = None
        self.session = session or _new_session()
        self.tokens = TokenProvider(
            self._request_token,
            cache_alias=conf.TOKEN_CACHE,
            # The key is a hash: credentials changed -> another token; nothing readable stored.
            scope=f"{self.auth_url}|{self.realm}|{self.client_id}|{self.__secret}",
            refresh_ratio=conf.TOKEN_REFRESH_RATIO,
            lock_timeout=conf.TOKEN_LOCK_TIMEOUT,
        )

    def __repr__(self) -> str:
        return f"BillingClient(base_url={self.base_url!r}, client_id={self.client_id!r})"

    @property
    def token_url(self) -> str:
        return f"{self.auth_url}/realms/{quote(self.realm, safe='')}/protocol/openid-connect/token"

    def checkout_url(self, session_id: str) -> str:
        """Where to send the customer for a checkout session: ``{CHECKOUT_URL}/checkout/<id>``."""
        return f"{self.checkout_base}/checkout/{quote(str(session_id), safe='')}"

    def with_deadline(self, deadline: DeadlineArg) -> BillingClient:
        """This client with ``deadline`` applied to every call made through it (sharing the
        HTTP session, the token provider and the retry policy). Seconds start now."""
        bound = copy.copy(self)
        bound.deadline = _as_deadline(deadline)
        return bound

    # --- products -------------------------------------------------------------------------
    def list_products(self, *, deadline: DeadlineArg = None) -> Iterator[dict[str, Any]]:
        return self._iter_items("products", deadline)

    def create_product(
        self,
        payload: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        deadline: DeadlineArg = None,
    ) -> dict:
        return self._call(
            "create_product", "POST", "/products", payload, idempotency_key, deadline=deadline
        )

    def get_product(self, remote_id: str, *, deadline: DeadlineArg = None) -> dict[str, Any]:
        path = f"/products/{_path_id(remote_id)}"
        return self._call("get_product", "GET", path, deadline=deadline)

    def update_product(
        self,
        remote_id: str,
        payload: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        deadline: DeadlineArg = None,
    ) -> dict[str, Any]:
        path = f"/products/{_path_id(remote_id)}"
        return self._call(
            "update_product", "PATCH", path, payload, idempotency_key, deadline=deadline
        )

    # --- customers ------------------------------------------------------------------------
    def list_customers(self, *, deadline: DeadlineArg = None) -> Iterator[dict[str, Any]]:
        return self._iter_items("customers", deadline)

    def create_customer(
        self,
        payload: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        deadline: DeadlineArg = None,
    ) -> dict:
        return self._call(
            "create_customer", "POST", "/customers", payload, idempotency_key, deadline=deadline
        )

    def find_customer(
        self, identifier: str, *, deadline: DeadlineArg = None
    ) -> dict[str, Any] | None:
        """The remote customer whose ``identifier`` is ``identifier`` (ours, unique per
        subscriber), or ``None``. The interface has no filter: this reads the list."""
        for item in self.list_customers(deadline=deadline):
            if isinstance(item, dict) and item.get("identifier") == identifier:
                return item
        return None

    # --- subscriptions --------------------------------------------------------------------
    def list_subscriptions(self, *, deadline: DeadlineArg = None) -> Iterator[dict[str, Any]]:
        return self._iter_items("subscriptions", deadline)

    def create_subscription(
        self,
        payload: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        deadline: DeadlineArg = None,
    ) -> dict[str, Any]:
        """Create one subscription. The service answers ``{"data": [Subscription]}``."""
        data = self._call(
            "create_subscription",
            "POST",
            "/subscriptions",
            payload,
            idempotency_key,
            deadline=deadline,
        )
        if isinstance(data, list):
            if not data:
                raise BillingAnswerLostError(
                    status=200, operation="create_subscription", message="empty data array"
                )
            return data[0]
        return data

    # --- checkout -------------------------------------------------------------------------
    def create_checkout_session(
        self,
        payload: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        deadline: DeadlineArg = None,
    ) -> dict[str, Any]:
        return self._call(
            "create_checkout_session",
            "POST",
            "/checkout_sessions",
            payload,
            idempotency_key,
            deadline=deadline,
        )

    # --- lists ----------------------------------------------------------------------------
    def iter_pages(
        self, resource: str, *, deadline: DeadlineArg = None
    ) -> Iterator[list[dict[str, Any]]]:
        """Yield the list of ``resource`` page by page (``limit``/``offset``).

        Stops on a short page, and on a page that brings no id not seen before, so a server
        that ignores the parameters ends the loop instead of repeating itself forever. A
        ``deadline`` bounds the whole list (all pages), not each page.
        """
        if resource not in RESOURCES:
            raise ValueError(f"Unknown resource {resource!r}; expected one of {RESOURCES}")
        bound = _as_deadline(deadline)  # seconds start now, once for all pages
        seen: set[str] = set()
        offset = 0
        for _ in range(self.max_pages):
            params = {"limit": self.page_size, "offset": offset}
            items = self._call(
                f"list_{resource}", "GET", f"/{resource}", params=params, deadline=bound
            )
            if not isinstance(items, list):
                raise BillingAPIError(
                    status=200, operation=f"list_{resource}", message="data is not a list"
                )
            fresh = []
            for item in items:
                key = str(item.get("id")) if isinstance(item, dict) else None
                if key is None or key not in seen:
                    if key is not None:
                        seen.add(key)
                    fresh.append(item)
            if not fresh:
                return
            yield fresh
            if len(items) < self.page_size:
                return
            offset += len(items)

    def _iter_items(self, resource: str, deadline: DeadlineArg = None) -> Iterator[dict[str, Any]]:
        for page in self.iter_pages(resource, deadline=deadline):
            yield from page

    # --- health (billing_doctor) -----------------------------------------------------------
    def probe_token(self) -> float:
        """Fetch a new token and return its ``expires_in`` (seconds, 0 if absent): a probe of
        the token endpoint and the credentials. The token is discarded, never cached or
        returned, so the shared token is left alone. Raises like any token fetch."""
        return float(self._request_token().get("expires_in") or 0)

    # --- the one place requests are sent -----------------------------------------------------
    def _call(
        self,
        operation: str,
        method: str,
        path: str,
        payload: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        params: dict[str, Any] | None = None,
        *,
        deadline: DeadlineArg = None,
    ) -> Any:
        url = f"{self.base_url}{API_PREFIX}{path}"
        headers = dict(_JSON_HEADERS)
        if method in ("POST", "PATCH"):
            headers["x-idempotency-id"] = str(idempotency_key or uuid.uuid4())
        body = None if payload is None else json.dumps(payload, separators=(",", ":"))
        bound = _as_deadline(deadline) or self.deadline
        refetched = False
        attempt = 0
        while True:
            _check_time_left(bound, operation)
            if attempt == 0:  # a retry's wait below already covers the window
                self._wait_for_shared_backoff(bound, operation)
            self._wait_for_pace(bound, operation)
            token = self.tokens.get(bound)
            headers["x-kc-token"] = token
            try:
                error = None
                response = self._send(operation, method, url, headers, body, params, bound)
            except BillingTransportError as exc:
                error = exc
            else:
                if response.status_code == 401 and not refetched:
                    # The token may have been revoked or expired early: fetch once more.
                    self.tokens.invalidate(token)
                    refetched = True
                    continue
                if response.status_code < 400:
                    self.backoff.succeeded()
                    try:
                        return _unwrap(response, operation)
                    except BillingAnswerLostError as exc:
                        # Probably applied: in doubt, resent with the same key (a replay).
                        error = exc
                else:
                    error = _api_error(response, operation)
            if isinstance(error, BillingAnswerLostError):
                pass  # a 2xx (counted above): the service is up, no window for every worker
            elif getattr(error, "retryable", False):
                self.backoff.failed(
                    getattr(error, "retry_after", None),
                    self.retry,
                    rate_limited=isinstance(error, BillingRateLimitError),
                )
            else:
                self.backoff.succeeded()  # the service answers: the run of failures is over
            wait = self._wait_before_retry(error, attempt, bound, operation)
            shared = self.backoff.wait()
            if shared > wait:  # another worker (or this one) asked every worker to wait longer
                if bound is not None and shared + MIN_ATTEMPT > bound.remaining():
                    self.backoff.publish(KNOWN_DOWN_SECONDS)
                    raise error
                wait = shared
            logger.warning(
                "billing %s: %s; retry %d/%d in %.2fs",
                operation,
                _short(error),
                attempt + 1,
                self.retry.max_retries,
                wait,
            )
            self._sleep(wait)
            attempt += 1

    def known_down(self) -> bool:
        """Whether the service is known to be down (or asked every worker to wait) now: the
        shared backoff window is open. A request a person waits on then answers without
        calling (from the mirror, or "service unavailable"); a call with a deadline fails at
        once."""
        return self.backoff.wait() > 0

    def _wait_for_shared_backoff(self, deadline: Deadline | None, operation: str) -> None:
        """Wait out the shared backoff window before an attempt. With a ``deadline`` (a person
        waits) fail at once instead, nothing sent: the caller's "service unavailable"."""
        wait = self.backoff.wait()
        if wait <= 0:
            return
        if deadline is not None:
            raise BillingTransportError(
                f"every worker backs off for {wait:.2f}s (the service is down or asked to "
                f"slow down); a call a person waits on does not wait",
                operation=operation,
            )
        logger.info("billing %s: waiting %.2fs, every worker backs off", operation, wait)
        self._sleep(wait)

    def _wait_for_pace(self, deadline: Deadline | None, operation: str) -> None:
        """Wait for a turn under the shared pace that follows a 429 (none: go at once). With
        a ``deadline`` that comes first, fail at once (nothing sent)."""
        while (wait := self.backoff.slot()) > 0:
            if deadline is not None and wait + MIN_ATTEMPT > deadline.remaining():
                raise BillingTransportError(
                    f"every worker keeps to {self.backoff.pace() or 0:.1f} calls a second "
                    f"(the service asked to slow down); no turn within the deadline "
                    f"({deadline.seconds:g}s)",
                    operation=operation,
                )
            self._sleep(wait)

    def _wait_before_retry(
        self, error: BillingError, attempt: int, deadline: Deadline | None, operation: str
    ) -> float:
        """The wait before the next attempt after ``error``; raises ``error`` when it is not
        retryable, the retries are used up, or the deadline leaves no room for another try."""
        if not getattr(error, "retryable", False):
            raise error
        retry_after = getattr(error, "retry_after", None)
        wait = self.retry.wait_before_retry(attempt, retry_after, deadline)
        if wait is None:
            if deadline is not None:
                if attempt < self.retry.max_retries:
                    logger.warning(
                        "billing %s: %s; no retry, the deadline (%.2fs left) comes first",
                        operation,
                        _short(error),
                        deadline.remaining(),
                    )
                # A person waited on a service that failed to the end: it is known down, and
                # the next person is answered at once instead of waiting on it again.
                self.backoff.publish(KNOWN_DOWN_SECONDS)
            raise error
        return wait

    def _send(
        self,
        operation: str,
        method: str,
        url: str,
        headers: dict[str, str],
        body: str | None,
        params: dict[str, Any] | None = None,
        deadline: Deadline | None = None,
    ) -> requests.Response:
        started = time.perf_counter()
        timeout = deadline.timeout(*self.timeout) if deadline is not None else self.timeout
        try:
            response = self.session.request(
                method, url, data=body, headers=headers, params=params, timeout=timeout
            )
        except requests.Timeout:
            raise BillingTransportError("timed out", operation=operation) from None
        except requests.RequestException as exc:
            raise BillingTransportError(
                f"connection failed ({type(exc).__name__})", operation=operation
            ) from None
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "billing %s %s -> %s in %.1f ms (idempotency %s)",
                operation,
                method,
                response.status_code,
                (time.perf_counter() - started) * 1000,
                headers.get("x-idempotency-id", "-"),
            )
        return response

    def _request_token(self, deadline: Deadline | None = None) -> dict[str, Any]:
        """The client-credentials call (form-encoded); retried like any other call, within
        the ``deadline`` of the call that needs the token."""
        form = {
            "grant_type": "client_credentials",
            "client_id": self.client_id,
            "client_secret": self.__secret,
        }
        headers = {
            "Accept": "application/json",
            "Content-Type": "application/x-www-form-urlencoded",
        }
        attempt = 0
        while True:
            _check_time_left(deadline, "token")
            try:
                error = None
                response = self._send(
                    "token", "POST", self.token_url, headers, _form(form), None, deadline
                )
            except BillingTransportError as exc:
                error = exc
            else:
                if response.status_code < 400:
                    try:
                        data = response.json()
                        if not data.get("access_token"):
                            raise ValueError
                    except (ValueError, AttributeError):
                        raise BillingAuthenticationError(
                            status=response.status_code,
                            operation="token",
                            message="token response without access_token",
                        ) from None
                    return data
                error = _api_error(response, "token")
                if response.status_code in (400, 401, 403):
                    raise BillingAuthenticationError(
                        status=response.status_code,
                        operation="token",
                        body=error.body,
                        message="credentials refused (check BILLING['CLIENT_ID'] and "
                        "BILLING['CLIENT_SECRET'])",
                    )
            self._sleep(self._wait_before_retry(error, attempt, deadline, "token"))
            attempt += 1


# --- helpers --------------------------------------------------------------------------------
def _as_deadline(value: DeadlineArg) -> Deadline | None:
    """A ``Deadline`` from seconds (starting now), a ``Deadline`` or ``None``."""
    if value is None or isinstance(value, Deadline):
        return value
    return Deadline(float(value))


def _check_time_left(deadline: Deadline | None, operation: str) -> None:
    """Refuse to start an attempt the deadline leaves no time for (nothing is sent)."""
    if deadline is not None and deadline.remaining() < MIN_ATTEMPT:
        raise BillingTransportError(
            f"no time left before the deadline ({deadline.seconds:g}s)", operation=operation
        )


def _new_session() -> requests.Session:
    session = requests.Session()
    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=32, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.trust_env = False  # no proxies or netrc credentials slipping in
    return session


def _form(fields: dict[str, str]) -> str:
    from urllib.parse import urlencode

    return urlencode(fields)


def _path_id(value: str) -> str:
    return quote(str(value), safe="")


def _unwrap(response: requests.Response, operation: str) -> Any:
    """The ``data`` of a 2xx answer. A body that cannot be read raises
    ``BillingAnswerLostError``: the request was probably applied, so it is in doubt and
    retried with the same key."""
    try:
        body = response.json()
    except ValueError:
        body, problem = response.text, "the answer is not JSON"
    else:
        if isinstance(body, dict) and "data" in body:
            return body["data"]
        problem = "the answer is not wrapped in 'data'"
    raise BillingAnswerLostError(
        status=response.status_code,
        operation=operation,
        body=body,
        request_id=response.headers.get("x-request-id"),
        message=_with_excerpt(problem, body),
    )


def _with_excerpt(problem: str, body: Any) -> str:
    """``problem``, then a redacted, bounded excerpt of the answer's ``body``."""
    if body in (None, ""):
        return problem
    shown = redact(body)
    return f"{problem}: {excerpt(shown if isinstance(shown, str) else json.dumps(shown))}"


def _api_error(response: requests.Response, operation: str) -> BillingError:
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    status = response.status_code
    request_id = response.headers.get("x-request-id")
    kwargs = {"status": status, "operation": operation, "body": body, "request_id": request_id}
    if status == 429:
        return BillingRateLimitError(
            retry_after=parse_retry_after(response.headers.get("Retry-After")), **kwargs
        )
    if status >= 500 and response.headers.get("Retry-After"):
        error = error_for_status(status)(**kwargs)
        error.retry_after = parse_retry_after(response.headers.get("Retry-After"))  # type: ignore[attr-defined]
        return error
    if status == 422 and "idempotency" in json.dumps(body).lower():
        return BillingIdempotencyConflict(**kwargs)
    return error_for_status(status)(**kwargs)


def _short(error: BaseException) -> str:
    if isinstance(error, BillingAnswerLostError):
        return f"HTTP {error.status} with an unreadable answer"
    if isinstance(error, BillingAPIError):
        return f"HTTP {error.status}"
    return str(error)
