"""``BillingClient``: every operation of the billing interface, and nothing else speaks HTTP.

Wire rules (billing-service-interface.md, section 4):
- billing paths are ``{BASE_URL}/v1/api/billing/...``; the token is at
  ``{AUTH_URL}/realms/{REALM}/protocol/openid-connect/token``, form-encoded;
- every billing call sends ``Accept`` and ``Content-Type: application/json`` and the token in
  ``x-kc-token`` (never ``Authorization``); every POST and PATCH sends ``x-idempotency-id``;
- responses are wrapped in ``data``; POST /subscriptions answers an array.
"""

from __future__ import annotations

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
    BillingAPIError,
    BillingAuthenticationError,
    BillingError,
    BillingIdempotencyConflict,
    BillingRateLimitError,
    BillingTransportError,
    error_for_status,
)
from .retry import RetryPolicy, parse_retry_after
from .tokens import TokenProvider

logger = logging.getLogger("billing_integration.client")

API_PREFIX = "/v1/api/billing"
RESOURCES = ("products", "customers", "subscriptions")
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
        self.max_pages = conf.MAX_PAGES
        self._sleep = sleep
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

    # --- products -------------------------------------------------------------------------
    def list_products(self) -> Iterator[dict[str, Any]]:
        return self._iter_items("products")

    def create_product(
        self, payload: dict[str, Any], *, idempotency_key: str | None = None
    ) -> dict:
        return self._call("create_product", "POST", "/products", payload, idempotency_key)

    def get_product(self, remote_id: str) -> dict[str, Any]:
        return self._call("get_product", "GET", f"/products/{_path_id(remote_id)}")

    def update_product(
        self, remote_id: str, payload: dict[str, Any], *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        path = f"/products/{_path_id(remote_id)}"
        return self._call("update_product", "PATCH", path, payload, idempotency_key)

    # --- customers ------------------------------------------------------------------------
    def list_customers(self) -> Iterator[dict[str, Any]]:
        return self._iter_items("customers")

    def create_customer(
        self, payload: dict[str, Any], *, idempotency_key: str | None = None
    ) -> dict:
        return self._call("create_customer", "POST", "/customers", payload, idempotency_key)

    # --- subscriptions --------------------------------------------------------------------
    def list_subscriptions(self) -> Iterator[dict[str, Any]]:
        return self._iter_items("subscriptions")

    def create_subscription(
        self, payload: dict[str, Any], *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Create one subscription. The service answers ``{"data": [Subscription]}``."""
        data = self._call("create_subscription", "POST", "/subscriptions", payload, idempotency_key)
        if isinstance(data, list):
            if not data:
                raise BillingAPIError(
                    status=200, operation="create_subscription", message="empty data array"
                )
            return data[0]
        return data

    # --- checkout -------------------------------------------------------------------------
    def create_checkout_session(
        self, payload: dict[str, Any], *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        return self._call(
            "create_checkout_session", "POST", "/checkout_sessions", payload, idempotency_key
        )

    # --- lists ----------------------------------------------------------------------------
    def iter_pages(self, resource: str) -> Iterator[list[dict[str, Any]]]:
        """Yield the list of ``resource`` page by page (``limit``/``offset``).

        Stops on a short page, and on a page that brings no id not seen before, so a server
        that ignores the parameters ends the loop instead of repeating itself forever.
        """
        if resource not in RESOURCES:
            raise ValueError(f"Unknown resource {resource!r}; expected one of {RESOURCES}")
        seen: set[str] = set()
        offset = 0
        for _ in range(self.max_pages):
            params = {"limit": self.page_size, "offset": offset}
            items = self._call(f"list_{resource}", "GET", f"/{resource}", params=params)
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

    def _iter_items(self, resource: str) -> Iterator[dict[str, Any]]:
        for page in self.iter_pages(resource):
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
    ) -> Any:
        url = f"{self.base_url}{API_PREFIX}{path}"
        headers = dict(_JSON_HEADERS)
        if method in ("POST", "PATCH"):
            headers["x-idempotency-id"] = str(idempotency_key or uuid.uuid4())
        body = None if payload is None else json.dumps(payload, separators=(",", ":"))
        refetched = False
        attempt = 0
        while True:
            token = self.tokens.get()
            headers["x-kc-token"] = token
            try:
                error = None
                response = self._send(operation, method, url, headers, body, params)
            except BillingTransportError as exc:
                error = exc
            else:
                if response.status_code == 401 and not refetched:
                    # The token may have been revoked or expired early: fetch once more.
                    self.tokens.invalidate(token)
                    refetched = True
                    continue
                if response.status_code < 400:
                    return _unwrap(response, operation)
                error = _api_error(response, operation)
            if not getattr(error, "retryable", False) or attempt >= self.retry.max_retries:
                raise error
            wait = self.retry.delay(attempt, getattr(error, "retry_after", None))
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

    def _send(
        self,
        operation: str,
        method: str,
        url: str,
        headers: dict[str, str],
        body: str | None,
        params: dict[str, Any] | None = None,
    ) -> requests.Response:
        started = time.perf_counter()
        try:
            response = self.session.request(
                method, url, data=body, headers=headers, params=params, timeout=self.timeout
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

    def _request_token(self) -> dict[str, Any]:
        """The client-credentials call (form-encoded); retried like any other call."""
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
            try:
                error = None
                response = self._send("token", "POST", self.token_url, headers, _form(form))
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
            if not getattr(error, "retryable", False) or attempt >= self.retry.max_retries:
                raise error
            self._sleep(self.retry.delay(attempt, getattr(error, "retry_after", None)))
            attempt += 1


# --- helpers --------------------------------------------------------------------------------
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
    try:
        body = response.json()
    except ValueError:
        raise BillingAPIError(
            status=response.status_code,
            operation=operation,
            body=response.text,
            message="response is not JSON",
        ) from None
    if not isinstance(body, dict) or "data" not in body:
        raise BillingAPIError(
            status=response.status_code,
            operation=operation,
            body=body,
            message="response is not wrapped in 'data'",
        )
    return body["data"]


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
    if isinstance(error, BillingAPIError):
        return f"HTTP {error.status}"
    return str(error)
