"""The sandbox's WSGI application: routing, the request log, faults, auth and idempotency.
A request whose ``Host`` is not a name the sandbox is served as is refused first (400
``unknown_host``, ``control.served_as``).

Every token, billing and checkout-page request goes through ``_operation``:

1. it is written to the request log;
2. faults are applied (outage, latency, error answers, timeouts, resets before the effect);
3. billing calls need a valid ``x-kc-token`` (401 otherwise);
4. POST and PATCH need ``x-idempotency-id`` (400 otherwise); a key seen before on the same
   account, method and path replays the first answer (same status and body, plus
   ``x-idempotent-replay: true``) when the body is the same, and answers 422
   ``idempotency_key_reused`` when it differs. The effect and the key commit together;
5. a reset-after-commit fault then drops the connection (the answer is lost, the effect kept);
   a lose-first-answer fault answers the first attempt of a key 200 with a body that is not
   JSON (the effect kept; the replay of the key answers normally).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from .. import strictjson
from .api import BillingAPI
from .auth import TokenService
from .checkout import CheckoutPages
from .clock import Clock
from .config import SandboxConfig
from .control import RULES as CONTROL_RULES
from .control import Control, served_as
from .delivery import DeliveryWorker
from .events import EventBus
from .faults import Decision, FaultInjector
from .ledger import Ledger
from .reqlog import RequestLog, forget_credentials
from .store import Store
from .web import (
    DropConnection,
    ValidationFailed,
    error_response,
    json_response,
)
from .web import NotFound as ResourceNotFound

BILLING = "/v1/api/billing"
TOKEN_PATH = "/auth/realms/<realm>/protocol/openid-connect/token"

URLS = Map(
    [
        Rule(TOKEN_PATH, endpoint="token", methods=["POST"]),
        Rule(f"{BILLING}/products", endpoint="list_products", methods=["GET"]),
        Rule(f"{BILLING}/products", endpoint="create_product", methods=["POST"]),
        Rule(f"{BILLING}/products/<product_id>", endpoint="get_product", methods=["GET"]),
        Rule(f"{BILLING}/products/<product_id>", endpoint="update_product", methods=["PATCH"]),
        Rule(f"{BILLING}/customers", endpoint="list_customers", methods=["GET"]),
        Rule(f"{BILLING}/customers", endpoint="create_customer", methods=["POST"]),
        Rule(f"{BILLING}/subscriptions", endpoint="list_subscriptions", methods=["GET"]),
        Rule(f"{BILLING}/subscriptions", endpoint="create_subscription", methods=["POST"]),
        Rule(
            f"{BILLING}/subscriptions/<subscription_id>",
            endpoint="update_subscription",
            methods=["PATCH"],
        ),
        Rule(f"{BILLING}/checkout_sessions", endpoint="create_checkout_session", methods=["POST"]),
        Rule("/checkout/<session_id>", endpoint="checkout_page", methods=["GET", "POST"]),
        *[Rule(r.rule, endpoint=f"control:{r.endpoint}", methods=r.methods) for r in CONTROL_RULES],
    ],
    strict_slashes=False,
)

LIST_OPERATIONS = {"list_products", "list_customers", "list_subscriptions"}
UNSAFE = {"POST", "PATCH"}
#: The body of an answer lost by the ``lose_first_answer`` fault: a 200 that is not JSON, as
#: a proxy that mangled the answer would send.
LOST_ANSWER = "<html><body><h1>OK</h1><p>The answer was lost on its way back.</p></body></html>"


def fingerprint(request: Request) -> str:
    raw = request.get_data(cache=True)
    try:
        canonical = json.dumps(json.loads(raw or b"null"), sort_keys=True).encode()
    except ValueError:
        canonical = raw
    return hashlib.sha256(canonical).hexdigest()


class SandboxApp:
    """The whole sandbox behind one WSGI callable."""

    def __init__(self, store: Store, config: SandboxConfig) -> None:
        self.store = store
        self.config = config
        self.clock = Clock(store.get_config("clock_offset", 0.0))
        self.tokens = TokenService(store, self.clock, config)
        self.api = BillingAPI(store, self.clock, config)
        self.events = EventBus(store, self.clock, config)
        self.delivery = DeliveryWorker(store, config)
        self.events.listeners.append(self.delivery.notify)
        self.ledger = Ledger(store, self.clock, config, self.api, self.events)
        self.checkout = CheckoutPages(store, config, self.ledger)
        self.faults = FaultInjector()
        self.log = RequestLog()
        self.control = Control(self)
        self.quiet = False
        #: Host names the sandbox answers as beside loopback ones (``served_as``; lower case):
        #: the ``--host`` it was started on and each ``--allowed-host``.
        self.hosts: set[str] = set()

    # -- state -----------------------------------------------------------------------------
    def reset(self, config: bool = False) -> None:
        """Wipe objects, tokens, keys, deliveries, faults, the request log and the clock."""
        self.store.wipe(config=config)
        if config:
            fresh = SandboxConfig.load(self.store)
            self.config.__dict__.update(fresh.__dict__)
        self.clock.set_offset(0.0)
        self.store.set_config("clock_offset", 0.0)
        self.faults.clear()
        self.log.clear()

    def advance(self, seconds: float) -> dict[str, Any]:
        with self.store.transaction():
            self.clock.set_offset(self.clock.offset + seconds)
            self.store.set_config("clock_offset", self.clock.offset)
            return self.ledger.run_due()

    def guard(self, fn: Callable[[], tuple[int, Any]]) -> tuple[int, Any]:
        """Run a handler, mapping validation and not-found errors to 400 / 404 bodies."""
        try:
            return fn()
        except ValidationFailed as exc:
            return 400, {"errors": exc.errors}
        except ResourceNotFound as exc:
            return 404, {"errors": [{"message": exc.message, "code": "not_found", "field": None}]}

    # -- WSGI ------------------------------------------------------------------------------
    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        request = Request(environ)
        response = self.dispatch(request)
        return response(environ, start_response)

    def dispatch(self, request: Request) -> Response:
        if not served_as(request, self.hosts):
            return error_response(
                400,
                "unknown_host",
                f"The sandbox is not served as {request.host!r}: it answers a loopback name or "
                "address, the --host it was started on, or an --allowed-host (a page of "
                "another site whose name points here is refused).",
            )
        adapter = URLS.bind_to_environ(request.environ)
        try:
            endpoint, args = adapter.match()
        except MethodNotAllowed as exc:
            return error_response(
                405,
                "method_not_allowed",
                f"{request.method} is not allowed on {request.path}.",
                headers={"Allow": ", ".join(exc.valid_methods or [])},
            )
        except NotFound:
            return error_response(404, "not_found", f"No route {request.path}.")
        except HTTPException as exc:  # redirects of strict slashes and the like
            return exc.get_response(request.environ)
        if endpoint.startswith("control:"):
            return self.control.dispatch(endpoint.split(":", 1)[1], request, dict(args))
        return self._operation(request, endpoint, dict(args))

    def _operation(self, request: Request, op: str, args: dict[str, Any]) -> Response:
        entry = self.log.record(request, op)
        decision = self.faults.decide(op)
        if decision.latency:
            self.faults.sleep(decision.latency)
        if decision.action in ("timeout", "reset"):
            entry["outcome"] = decision.action
            if decision.action == "timeout":
                self.faults.sleep(decision.timeout_seconds)
            raise DropConnection(decision.action)
        if decision.action == "error":
            response = self._fault_response(decision)
            entry["outcome"] = "fault"
        else:
            response = self._handle(request, op, args, decision, entry)
            if decision.action == "reset_after_commit":
                entry["outcome"] = "reset_after_commit"
                entry["status"] = response.status_code
                raise DropConnection("reset after commit")
            entry["outcome"] = "answered"
            if (
                decision.lose_first_answer
                and response.status_code < 300
                and request.method in UNSAFE
                and op not in ("token", "checkout_page")
                and not entry.get("idempotent_replay")
            ):
                entry["outcome"] = "answer_lost"
                response = Response(LOST_ANSWER, status=200, mimetype="text/html")
        entry["status"] = response.status_code
        if response.status_code >= 400 and self.config.speaks("error_shape"):
            response = self._other_error_shape(response)
        return response

    def _other_error_shape(self, response: Response) -> Response:
        """The ``error_shape`` dialect: ``{"statusCode", "error", "message"}`` (the first
        error's code and message) instead of ``{"errors": [...]}``."""
        try:
            body = json.loads(response.get_data())
            first = body["errors"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            return response
        other = {
            "statusCode": response.status_code,
            "error": first.get("code"),
            "message": first.get("message"),
        }
        headers = {k: v for k, v in response.headers.items() if k.lower() == "retry-after"}
        return json_response(other, status=response.status_code, headers=headers)

    def _fault_response(self, decision: Decision) -> Response:
        headers = {}
        if decision.retry_after is not None:
            headers["Retry-After"] = str(int(decision.retry_after))
        elif decision.status == 429:
            headers["Retry-After"] = "1"
        if decision.status == 401:
            return error_response(
                401, "unauthorized", "Injected fault: unauthorized.", headers=headers
            )
        return error_response(
            decision.status,
            "injected_fault",
            f"Injected fault: HTTP {decision.status}.",
            headers=headers,
        )

    def _handle(
        self,
        request: Request,
        op: str,
        args: dict[str, Any],
        decision: Decision,
        entry: dict[str, Any],
    ) -> Response:
        if op == "token":
            if args["realm"] != "sandbox":
                return error_response(404, "realm_not_found", f"Realm {args['realm']!r} not found.")
            response = self.tokens.issue(request)
            if response.status_code != 200:  # refused: maybe real credentials sent by mistake
                forget_credentials(entry)
            return response
        if op == "checkout_page":
            return self.checkout.handle(request, args["session_id"])
        account, reason = self.tokens.account_for_token(request.headers.get("x-kc-token"))
        if account is None:
            return error_response(401, "unauthorized", reason)
        if request.method not in UNSAFE:
            handler = getattr(self.api, op)
            if op in LIST_OPERATIONS:
                return self._json(lambda: handler(account, request.args, decision.ignore_paging))
            return self._json(lambda: handler(account, **args))
        key = request.headers.get("x-idempotency-id")
        if not key:
            return error_response(
                400,
                "idempotency_key_required",
                "The x-idempotency-id header is required on POST and PATCH.",
            )
        if request.mimetype != "application/json":
            return error_response(
                415,
                "unsupported_media_type",
                "Send the body as JSON (Content-Type: application/json).",
            )
        try:
            body = strictjson.loads(request.get_data(cache=True) or b"null")
        except ValueError as exc:
            return error_response(400, "invalid_json", f"The body is not valid JSON: {exc}")
        scope = f"{account} {request.method} {request.path}"
        digest = fingerprint(request)
        handler = getattr(self.api, op)
        with self.store.transaction() as conn:
            row = conn.execute(
                "SELECT fingerprint, status, body FROM idempotency WHERE scope = ? AND key = ?",
                (scope, key),
            ).fetchone()
            if row is not None:
                if row[0] != digest:
                    return error_response(
                        422,
                        "idempotency_key_reused",
                        "This x-idempotency-id was already used with a different body.",
                    )
                entry["idempotent_replay"] = True
                return Response(
                    row[2],
                    status=row[1],
                    mimetype="application/json",
                    headers={"x-idempotent-replay": "true"},
                )
            status, payload = self.guard(lambda: handler(account, body=body, **args))
            text = json.dumps(payload)
            conn.execute(
                "INSERT INTO idempotency (scope, key, fingerprint, status, body, created) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (scope, key, digest, status, text, time.time()),
            )
        return Response(text, status=status, mimetype="application/json")

    def _json(self, fn: Callable[[], tuple[int, Any]]) -> Response:
        status, payload = self.guard(fn)
        return json_response(payload, status=status)
