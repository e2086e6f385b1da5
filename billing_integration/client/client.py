"""``BillingClient``: every operation of the billing interface (wire rules in docs/client.md).
Every operation takes ``deadline=`` (seconds or a ``Deadline``): the call, its retries and
waits end by then, and it never waits on the shared backoff window (``backoff.py``)."""

from __future__ import annotations

import copy
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any, TypedDict, TypeVar, Unpack, cast
from urllib.parse import quote, urlencode

import requests
import urllib3
from django.views.decorators.debug import sensitive_variables
from requests.adapters import HTTPAdapter

from ..conf import billing_settings
from ..exceptions import (
    BillingAnswerLostError,
    BillingAPIError,
    BillingAuthenticationError,
    BillingError,
    BillingIdempotencyConflict,
    BillingNotFoundError,
    BillingTransportError,
    error_for_status,
    without_secrets,
)
from .backoff import KNOWN_DOWN_SECONDS, SharedBackoff
from .retry import MIN_ATTEMPT, Deadline, RetryPolicy, default_policy, parse_retry_after
from .tokens import TokenProvider, expires_in

logger = logging.getLogger("billing_integration.client")
#: Django's error reports (and tools that follow its marks) hide every local variable of these
#: calls and of what they call: the client secret, the token and the headers that carry it.
_secret_frames = sensitive_variables()

API_PREFIX = "/v1/api/billing"
RESOURCES = ("products", "customers", "subscriptions")
CONNECT_TIMEOUT = 5.0  # seconds to connect, on every request
READ_TIMEOUT = 30.0  # seconds to wait for an answer, on every request
PAGE_SIZE = 100  # limit= of list calls
MAX_PAGES = 100_000  # hard stop for a list that never ends
#: The settings a failed token call names: no answer from the token URL (its host or port), no
#: token endpoint at it (404), credentials refused (400, 401, 403).
TOKEN_ADDRESS = "BILLING['AUTH_URL']"
TOKEN_URL_SETTINGS = "BILLING['AUTH_URL'] and BILLING['REALM']"
CREDENTIAL_SETTINGS = "BILLING['CLIENT_ID'] and BILLING['CLIENT_SECRET']"
#: ``raw`` and ``raw_token`` (billing_probe): the most of one answer they read, and the time
#: they take to read it; an answer over either is dropped (``BillingTransportError``).
RAW_MAX_BYTES = 8 * 1024 * 1024
RAW_MAX_SECONDS = READ_TIMEOUT
#: A deadline argument: seconds from now, a shared ``Deadline``, or ``None`` (no deadline).
DeadlineArg = Deadline | float | None
Item = dict[str, Any]  # one resource, as the service writes it
T = TypeVar("T")


@dataclass(frozen=True)
class RawAnswer:
    """One answer as the service sent it (``raw`` and ``raw_token``): the status, the headers
    (names in lower case) and the body (parsed JSON, else the text). The token's answer holds
    the token: whoever keeps one removes it first."""

    status: int
    headers: dict[str, str]
    body: Any


class WriteOptions(TypedDict, total=False):
    """A write's keywords: its idempotency key (default: a new one) and its deadline."""

    idempotency_key: str | None
    deadline: DeadlineArg


#: A token ``x-kc-token`` can carry: visible ASCII (a JWT, an opaque string), nothing else.
_SENDABLE = re.compile(r"[!-~]+")
_JSON_HEADERS = {"Accept": "application/json", "Content-Type": "application/json"}
_FORM_HEADERS = {**_JSON_HEADERS, "Content-Type": "application/x-www-form-urlencoded"}


class BillingClient:
    """A client for one account of the service; build it with ``get_client()`` unless you
    need another account. Keyword arguments default to ``settings.BILLING``."""

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
        sleep: Callable[[float], None] = time.sleep,
        backoff: SharedBackoff | None = None,
    ) -> None:
        conf = billing_settings
        self.base_url: str = (base_url or conf.BASE_URL).rstrip("/")
        self.auth_url: str = (auth_url or conf.AUTH_URL).rstrip("/")
        self.checkout_base: str = (checkout_url or conf.CHECKOUT_URL).rstrip("/")
        self.realm: str = realm or conf.REALM
        self.client_id: str = client_id or conf.CLIENT_ID
        self.__secret: str = client_secret or conf.CLIENT_SECRET
        # None: the module constants, read at each call (tests may patch them).
        self._retry, self.timeout, self._page_size = retry, timeout, page_size
        self._sleep = sleep
        self.backoff = backoff or SharedBackoff()
        #: The deadline of every call made through this client (see ``with_deadline``).
        self.deadline: Deadline | None = None
        self.session = session or _new_session()
        self.tokens = TokenProvider(
            self._request_token,
            scope=f"{self.auth_url}|{self.realm}|{self.client_id}|{self.__secret}",
        )

    @property
    def retry(self) -> RetryPolicy:
        return self._retry or default_policy()

    @property
    def page_size(self) -> int:
        return self._page_size or PAGE_SIZE

    def __repr__(self) -> str:
        return f"BillingClient(base_url={self.base_url!r}, client_id={self.client_id!r})"

    @property
    def token_url(self) -> str:
        return f"{self.auth_url}/realms/{quote(self.realm, safe='')}/protocol/openid-connect/token"

    def checkout_url(self, session_id: str) -> str:
        """Where to send the customer for a checkout session."""
        return f"{self.checkout_base}/checkout/{_quoted(session_id)}"

    def with_deadline(self, deadline: DeadlineArg) -> BillingClient:
        """This client (same session and token) with ``deadline`` on every call."""
        bound = copy.copy(self)
        bound.deadline = _as_deadline(deadline)
        return bound

    def known_down(self) -> bool:
        """Whether the service is known down (a page a person waits on then calls nothing)."""
        return self.backoff.wait() > 0

    # --- operations ------------------------------------------------------------------------
    def list_products(self, *, deadline: DeadlineArg = None) -> Iterator[Item]:
        return chain.from_iterable(self.iter_pages("products", deadline=deadline))

    def list_customers(self, *, deadline: DeadlineArg = None) -> Iterator[Item]:
        return chain.from_iterable(self.iter_pages("customers", deadline=deadline))

    def list_subscriptions(self, *, deadline: DeadlineArg = None) -> Iterator[Item]:
        return chain.from_iterable(self.iter_pages("subscriptions", deadline=deadline))

    def get_product(self, remote_id: str, *, deadline: DeadlineArg = None) -> Item:
        return self._one("get_product", "GET", f"/products/{_quoted(remote_id)}", deadline=deadline)

    def create_product(self, payload: Item, **kw: Unpack[WriteOptions]) -> Item:
        return self._one("create_product", "POST", "/products", payload, **kw)

    def update_product(self, remote_id: str, payload: Item, **kw: Unpack[WriteOptions]) -> Item:
        path = f"/products/{_quoted(remote_id)}"
        return self._one("update_product", "PATCH", path, payload, **kw)

    def create_customer(self, payload: Item, **kw: Unpack[WriteOptions]) -> Item:
        return self._one("create_customer", "POST", "/customers", payload, **kw)

    def create_checkout_session(self, payload: Item, **kw: Unpack[WriteOptions]) -> Item:
        return self._one("create_checkout_session", "POST", "/checkout_sessions", payload, **kw)

    def create_subscription(self, payload: Item, **kw: Unpack[WriteOptions]) -> Item:
        """Create one subscription (the service answers an array of one)."""
        return self._one("create_subscription", "POST", "/subscriptions", payload, **kw)

    def update_subscription(
        self, remote_id: str, payload: Item, **kw: Unpack[WriteOptions]
    ) -> Item:
        """``PATCH /subscriptions/{id}``: not in the interface (a guess, see docs/changes.md)."""
        path = f"/subscriptions/{_quoted(remote_id)}"
        return self._one("update_subscription", "PATCH", path, payload, **kw)

    def find_customer(self, identifier: str, *, deadline: DeadlineArg = None) -> Item | None:
        """The remote customer whose ``identifier`` is ``identifier``, or ``None`` (the
        interface has no filter: this reads the list); one of digits listed as a JSON number
        (``42`` for ``"42"``) is the same."""
        for item in self.list_customers(deadline=deadline):
            found = item.get("identifier") if isinstance(item, dict) else None
            if isinstance(found, int) and not isinstance(found, bool):
                found = str(found)
            if found == identifier:
                return item
        return None

    def find_subscription(self, remote_id: str, *, deadline: DeadlineArg = None) -> Item | None:
        """The remote subscription whose ``id`` is ``remote_id``, or ``None`` (the interface
        has no single read: this reads the list, ``GET /subscriptions``); the id in any
        spelling of the same UUID (capitals, braces) is the same."""
        wanted = _uuid(remote_id) or remote_id
        for item in self.list_subscriptions(deadline=deadline):
            if isinstance(item, dict) and (_uuid(item.get("id")) or str(item.get("id"))) == wanted:
                return item
        return None

    def iter_pages(self, resource: str, *, deadline: DeadlineArg = None) -> Iterator[list[Item]]:
        """The list of ``resource`` page by page (``limit``/``offset``), within one deadline.
        A row seen on an earlier page comes again only if it changed since (the list moved
        while it was read: the caller keeps the newer copy). Stops on an empty page, or a page
        with no id not seen before (a server ignoring the parameters; a full one is logged: a
        server ignoring only ``offset`` leaves the rest unread); a short page does not
        end the list (a service may answer fewer rows than ``limit`` asks). ``"data": null``
        is an empty page. A list still going at ``MAX_PAGES`` pages raises ``BillingAPIError``
        (the pages before it given)."""
        if resource not in RESOURCES:
            raise ValueError(f"Unknown resource {resource!r}; expected one of {RESOURCES}")
        bound = _as_deadline(deadline)  # seconds start now, once for all pages
        seen: dict[str, int] = {}  # id -> the hash of the row's JSON as last seen
        offset, size = 0, self.page_size
        for _ in range(MAX_PAGES):
            params = {"limit": size, "offset": offset}
            items = self._call(
                f"list_{resource}", "GET", f"/{resource}", params=params, deadline=bound
            )
            if items is None:  # {"data": null}: an empty page
                return
            if not isinstance(items, list):
                raise BillingAPIError(
                    status=200, operation=f"list_{resource}", message="data is not a list"
                )
            fresh: list[Any] = []
            new = False
            for item in items:
                copy = _fingerprint(item)
                # a row that is no object (the caller reports it) is known by its JSON
                key = str(item.get("id")) if isinstance(item, dict) else f"not an object {copy}"
                new = new or key not in seen
                if seen.get(key) != copy:
                    fresh.append(item)
                    seen[key] = copy
            if fresh:
                yield fresh
            if not new:
                if offset and len(items) == size:  # limit honoured, offset not: more unread
                    logger.warning(
                        "billing list_%s: the page at offset %d repeats rows read before (the "
                        "service may ignore offset): the list may not be read to its end",
                        resource,
                        offset,
                    )
                return
            offset += len(items)
        problem = f"more than {MAX_PAGES} pages: the list was not read to its end"
        raise BillingAPIError(status=200, operation=f"list_{resource}", message=problem)

    def probe_token(self) -> float:
        """Fetch a new token (discarded, never cached) and return its ``expires_in`` (0.0 when
        missing or unreadable)."""
        return expires_in(self._request_token()) or 0.0

    def scrub(self, value: Any) -> Any:
        """``value`` (parsed JSON or text) with the client secret replaced (``without_secrets``)."""
        return without_secrets(value, (self.__secret,))

    # --- raw answers (billing_probe) -----------------------------------------------------
    @_secret_frames
    def raw_token(self) -> RawAnswer:
        """The token call once, its answer as sent (not cached, not retried, never raised)."""
        form = self._token_form()
        response = self._raw_send("token", "POST", self.token_url, data=form, headers=_FORM_HEADERS)
        return _raw(response, "token")

    @_secret_frames
    def raw(
        self,
        method: str,
        path: str,
        *,
        token: str | None,
        payload: Item | None = None,
        params: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> RawAnswer:
        """One call to ``{BASE_URL}/v1/api/billing{path}`` with ``token`` as ``x-kc-token``
        (none: no header), once: no retry, no token fetch, an error status answered, not
        raised. A write sends ``idempotency_key`` (default a new one). An answer over
        ``RAW_MAX_BYTES``, or not read within ``RAW_MAX_SECONDS``, raises
        ``BillingTransportError``."""
        headers = _json_headers(method, idempotency_key, token)
        url = f"{self.base_url}{API_PREFIX}{path}"
        operation = f"{method} {path}"
        response = self._raw_send(
            operation, method, url, data=_json(payload), headers=headers, params=params
        )
        return _raw(response, operation)

    def _raw_send(self, operation: str, method: str, url: str, **kw: Any) -> requests.Response:
        """One streamed request, its error raised as it is (never retried)."""
        try:
            return self._send(operation, None, method, url, stream=True, **kw)
        except _Sent as sent:
            raise sent.error from None

    # --- sending ---------------------------------------------------------------------------
    def _one(self, operation: str, method: str, path: str, *args: Any, **kw: Any) -> Item:
        """A call answered with one resource (also read from an array of one, the way the
        service answers a new subscription)."""
        data = self._call(operation, method, path, *args, one=True, **kw)
        return cast(Item, data[0] if isinstance(data, list) else data)

    @_secret_frames
    def _call(
        self,
        operation: str,
        method: str,
        path: str,
        payload: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        deadline: DeadlineArg = None,
        params: dict[str, Any] | None = None,
        one: bool = False,
    ) -> Any:
        """The answer's ``data`` (``one``: the one object it is, see ``_answer``)."""
        url = f"{self.base_url}{API_PREFIX}{path}"
        headers = _json_headers(method, idempotency_key)
        body = _json(payload)
        bound = _as_deadline(deadline) or self.deadline
        _check_time_left(bound, operation)
        wait = self.backoff.wait()
        if wait > 0:
            if bound is not None:
                problem = f"known down: every worker backs off for {wait:.2f}s"
                raise BillingTransportError(problem, operation=operation)
            logger.info("billing %s: waiting %.2fs, every worker backs off", operation, wait)
            self._sleep(wait)
        refetched = False

        def attempt(token: str) -> Any:
            nonlocal refetched
            headers["x-kc-token"] = token
            response = self._send(
                operation, bound, method, url, data=body, headers=headers, params=params
            )
            if response.status_code == 401 and not refetched:  # revoked or expired early
                refetched = True
                self.tokens.invalidate(token)
                return attempt(self.tokens.get(bound))
            if response.status_code == 403:  # revoked or re-scoped: the next call fetches
                self.tokens.invalidate(token)  # a new one; this one is not resent
            write = method in ("POST", "PATCH")
            return _answer(
                response, operation, (token,), one=one, created=method == "POST", write=write
            )

        return self._retrying(operation, bound, lambda: attempt(self.tokens.get(bound)))

    def _retrying(self, operation: str, deadline: Deadline | None, attempt: Callable[[], T]) -> T:
        """``attempt()`` until it returns, retrying its retryable errors with backoff (the
        server's ``Retry-After`` honoured) within the policy and the deadline. An error raised
        before anything is sent (the token) is not retried here. The error raised after an
        attempt with no answer to go by (a retryable error) is marked ``in_doubt``."""
        in_doubt = False
        for n in range(self.retry.max_retries + 1):
            try:
                _check_time_left(deadline, operation)
                return attempt()
            except _Sent as sent:
                error = sent.error
            except BillingError as exc:
                exc.in_doubt = exc.in_doubt or in_doubt
                raise
            error.in_doubt = error.in_doubt or in_doubt
            in_doubt = in_doubt or error.retryable
            retry_after = getattr(error, "retry_after", None)
            if retry_after is not None:  # the service asked every worker to wait
                self.backoff.publish(min(retry_after, self.retry.retry_after_max))
            wait = None
            if error.retryable:
                wait = self.retry.wait_before_retry(n, retry_after, deadline)
            if wait is not None and deadline is None:
                wait = max(wait, self.backoff.wait())
            if wait is None:
                # Failed to the end (a person's deadline, or every retry) with no Retry-After to
                # go by: the service is known down. A lost answer shows it is up.
                ended = deadline is not None or n > 0
                lost = isinstance(error, BillingAnswerLostError)
                if ended and error.retryable and retry_after is None and not lost:
                    self.backoff.publish(KNOWN_DOWN_SECONDS)
                raise error
            shown = f"HTTP {error.status}" if isinstance(error, BillingAPIError) else error
            logger.warning("billing %s: %s; retry %d in %.2fs", operation, shown, n + 1, wait)
            self._sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(
        self,
        operation: str,
        deadline: Deadline | None,
        method: str,
        url: str,
        *,
        check: str = "",
        **kw: Any,
    ) -> requests.Response:
        """One request, a redirect not followed (it would carry the token or the secret on);
        a timeout or connection error raises ``_Sent`` (retryable), its text ending with
        ``check`` (the settings to check) when given. With the deadline passed (a token
        fetched or waited for took the time), nothing is sent."""
        _check_time_left(deadline, operation)
        pair = self.timeout or (CONNECT_TIMEOUT, READ_TIMEOUT)
        timeout: Any = pair if deadline is None else deadline.timeout(*pair)  # requests takes both
        hint = f": check {check}" if check else ""
        try:
            response = self.session.request(
                method, url, timeout=timeout, allow_redirects=False, **kw
            )
        except requests.Timeout:
            raise _Sent(BillingTransportError("timed out" + hint, operation=operation)) from None
        except requests.RequestException as exc:
            problem = f"connection failed ({type(exc).__name__}){hint}"
            raise _Sent(BillingTransportError(problem, operation=operation)) from None
        logger.debug("billing %s %s -> %s", operation, method, response.status_code)
        return response

    @_secret_frames
    def _request_token(self, deadline: Deadline | None = None) -> dict[str, Any]:
        """The form-encoded client-credentials call, retried like any call."""
        form = self._token_form()
        sent = (self.__secret,)  # an answer quoting it is not kept as it is

        def attempt() -> dict[str, Any]:
            response = self._send(
                "token",
                deadline,
                "POST",
                self.token_url,
                check=TOKEN_ADDRESS,
                data=form,
                headers=_FORM_HEADERS,
            )
            data, status = _body(response), response.status_code
            if status == 404:
                problem = f"no token endpoint at this URL (check {TOKEN_URL_SETTINGS})"
                raise BillingNotFoundError(
                    status=status, operation="token", body=data, message=problem, sent=sent
                )
            if status >= 300 and status not in (400, 401, 403):
                _answer(response, "token", sent)  # raises the error (retried when retryable)
            token = data.get("access_token") if isinstance(data, dict) else None
            if status >= 400 or not isinstance(token, str) or not _SENDABLE.fullmatch(token):
                problem = "token response without an access_token a header can carry"
                if status >= 400:
                    problem = f"credentials refused (check {CREDENTIAL_SETTINGS})"
                raise BillingAuthenticationError(
                    status=status, operation="token", body=data, message=problem, sent=sent
                )
            return cast(dict[str, Any], data)

        return self._retrying("token", deadline, attempt)

    def _token_form(self) -> str:
        """The client-credentials form, secret included (call it from ``_secret_frames`` only)."""
        fields = {"grant_type": "client_credentials", "client_id": self.client_id}
        return urlencode({**fields, "client_secret": self.__secret})


class _Sent(Exception):
    """A request was sent and failed with ``error``; only these may be retried."""

    def __init__(self, error: BillingError) -> None:
        self.error = error


# --- helpers --------------------------------------------------------------------------------
def _as_deadline(value: DeadlineArg) -> Deadline | None:
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
    session.mount("http://", adapter := HTTPAdapter(pool_maxsize=32))  # threads of a worker
    session.mount("https://", adapter)
    session.trust_env = False  # no proxies or netrc credentials slipping in
    return session


def _uuid(value: Any) -> str | None:
    """``value`` as a UUID in its one spelling, None when it is none."""
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        return None


def _quoted(value: str) -> str:
    return quote(str(value), safe="")


def _json(payload: Any) -> str | None:
    """A request body or None: JSON proper (NaN or infinity, not JSON, raise ValueError)."""
    return None if payload is None else json.dumps(payload, separators=(",", ":"), allow_nan=False)


def _fingerprint(item: Any) -> int:
    """A listed row as ``iter_pages`` compares it with its copy on an earlier page (one too
    deep to write out compares as changed)."""
    try:
        return hash(json.dumps(item, sort_keys=True, default=str))
    except (RecursionError, ValueError):
        return id(item)


def _json_headers(method: str, key: str | None, token: str | None = None) -> dict[str, str]:
    """The headers of a JSON call; a write carries its idempotency key (default a new one)."""
    headers = dict(_JSON_HEADERS)
    if token is not None:
        headers["x-kc-token"] = token
    if method in ("POST", "PATCH"):
        headers["x-idempotency-id"] = str(key or uuid.uuid4())
    return headers


def _body(response: requests.Response) -> Any:
    """The JSON of the answer, else its text (not JSON, or nested deeper than Python reads).
    JSON is read as UTF-8 (RFC 8259) whatever the header says (requests reads a ``text/*``
    answer without a charset as ISO-8859-1), else in the charset the header names."""
    try:
        return json.loads(response.content)
    except (ValueError, RecursionError):
        pass
    try:
        return response.json()
    except (ValueError, RecursionError):
        return response.text


def _raw(response: requests.Response, operation: str) -> RawAnswer:
    """A streamed answer, read up to ``RAW_MAX_BYTES`` within ``RAW_MAX_SECONDS``."""
    headers = {name.lower(): value for name, value in response.headers.items()}
    try:
        content = _read_capped(response, operation)
    finally:
        response.close()
    try:
        text = content.decode(response.encoding or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        text = content.decode("utf-8", errors="replace")
    body: Any = text
    for source in (content, text):  # JSON as UTF-8 first, as ``_body`` reads it
        try:
            body = json.loads(source)
            break
        except (ValueError, RecursionError):
            continue
    return RawAnswer(response.status_code, headers, body)


def _read_capped(response: requests.Response, operation: str) -> bytes:
    started, chunks, size = time.monotonic(), [], 0
    try:
        while chunk := response.raw.read1(65536, decode_content=True):
            size += len(chunk)
            if size > RAW_MAX_BYTES:
                problem = f"the answer is over {RAW_MAX_BYTES:,} bytes: not read"
                raise BillingTransportError(problem, operation=operation)
            if time.monotonic() - started > RAW_MAX_SECONDS:
                problem = f"the answer took over {RAW_MAX_SECONDS:g}s to read: not read"
                raise BillingTransportError(problem, operation=operation)
            chunks.append(chunk)
    except (OSError, urllib3.exceptions.HTTPError) as exc:
        problem = f"the answer was cut off ({type(exc).__name__})"
        raise BillingTransportError(problem, operation=operation) from None
    return b"".join(chunks)


def _answer(
    response: requests.Response,
    operation: str,
    sent: tuple[str, ...] = (),
    *,
    one: bool = False,
    created: bool = False,
    write: bool = False,
) -> Any:
    """The ``data`` of a 2xx answer (``one``: an object, or an array of one object; else a
    204 is an empty list), else ``_Sent`` with the error (``sent``, the secrets the request
    carried, removed from it). An unreadable 2xx, one whose ``data`` is not the
    one object asked for, or one to a create (``created``) without the new object's id, is in
    doubt (probably applied): a retryable ``BillingAnswerLostError``, resent with the key. A
    redirect (not followed) is an error, not retried; to a ``write`` (POST, PATCH) it is in
    doubt (a 303 See Other says "done, look there"): the caller keeps the key."""
    body, status = _body(response), response.status_code
    if status == 204 and not one:  # No Content: a list with nothing in it
        return []
    wrapped = isinstance(body, dict) and "data" in body
    item = None
    if status < 300 and wrapped:
        data = body["data"]
        if not one:
            return data
        item = data[0] if isinstance(data, list) and len(data) == 1 else data
        if isinstance(item, dict) and (item.get("id") or not created):
            return data
    cls, message = error_for_status(status), None
    if 300 <= status < 400:  # not followed: the call went nowhere (check the settings)
        location = without_secrets(response.headers.get("Location", "(no Location)"), sent)
        message = f"redirected to {location}"
    elif status < 400:
        cls = BillingAnswerLostError
        message = "the answer is " + (
            "not JSON"
            if isinstance(body, str)
            else "not wrapped in 'data'"
            if not wrapped
            else "without the new object's id"
            if isinstance(item, dict)
            else "not one object"
        )
    elif status in (409, 422) and "idempotency" in json.dumps(body).lower():
        cls = BillingIdempotencyConflict
    request_id = response.headers.get("x-request-id")
    error = cls(
        status=status,
        operation=operation,
        body=body,
        request_id=request_id,
        message=message,
        sent=sent,
    )
    if write and 300 <= status < 400:
        error.in_doubt = True
    if status == 429 or status >= 500:
        error.retry_after = parse_retry_after(response.headers.get("Retry-After"))
    raise _Sent(error)
