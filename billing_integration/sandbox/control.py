"""Control endpoints under ``/_sandbox/`` (JSON, no auth): what tests and developers use to
drive the sandbox. Not subject to faults and not written to the request log.

A request that changes something (POST, DELETE) sent by a page of another site is refused 403
(its ``Origin`` or ``Sec-Fetch-Site`` says so): any page a developer visits could otherwise
post JSON as ``text/plain`` to ``http://127.0.0.1:8100/_sandbox/config`` and set the hosted
page's return URL to its own site, the callback URL or the webhook secret, or wipe the data.
Scripts and tests send neither header; the dashboard's forms are of the sandbox's own origin.

Every request (control, API, token, checkout page) whose ``Host`` is not a name the sandbox is
served as (``served_as``: a loopback name or address, the ``--host`` it was started on, an
``--allowed-host``) is refused 400 ``unknown_host`` before anything else: a page of another
site whose name was made to resolve to 127.0.0.1 (DNS rebinding) is of the same origin as the
sandbox for the browser, but sends its own name.

No answer carries the webhook secret (``SandboxConfig.public_dict``): whoever could read it
could sign events the app accepts. It can be set (``POST /_sandbox/config``); whoever starts the
sandbox knows it (``BILLING_SANDBOX_WEBHOOK_SECRET``, the start-up printout, or
``SandboxServer.config`` in-process).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from html import escape
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from werkzeug.routing import Rule
from werkzeug.wrappers import Request, Response

from .store import public
from .web import error_response, html_response, json_response

if TYPE_CHECKING:
    from .app import SandboxApp

KINDS = (
    "product",
    "blueprint",
    "customer",
    "subscription",
    "checkout_session",
    "payment",
    "invoice",
    "refund",
    "event",
)

RULES = [
    Rule("/", endpoint="index", methods=["GET"]),
    Rule("/_sandbox/", endpoint="dashboard", methods=["GET"]),
    Rule("/_sandbox/health", endpoint="health", methods=["GET"]),
    Rule("/_sandbox/config", endpoint="config", methods=["GET", "POST"]),
    Rule("/_sandbox/callback", endpoint="callback", methods=["GET", "POST", "DELETE"]),
    Rule("/_sandbox/reset", endpoint="reset", methods=["POST"]),
    Rule("/_sandbox/requests", endpoint="requests", methods=["GET", "DELETE"]),
    Rule("/_sandbox/faults", endpoint="faults", methods=["GET", "POST", "DELETE"]),
    Rule("/_sandbox/tokens/revoke", endpoint="revoke", methods=["POST"]),
    Rule("/_sandbox/clock", endpoint="clock", methods=["GET"]),
    Rule("/_sandbox/clock/advance", endpoint="advance", methods=["POST"]),
    Rule("/_sandbox/trigger", endpoint="trigger", methods=["POST"]),
    Rule("/_sandbox/deliveries", endpoint="deliveries", methods=["GET"]),
    Rule("/_sandbox/deliveries/flush", endpoint="flush", methods=["POST"]),
    Rule("/_sandbox/events", endpoint="events", methods=["GET"]),
    Rule("/_sandbox/seed", endpoint="seed", methods=["POST"]),
    Rule("/_sandbox/objects/<kind>", endpoint="objects", methods=["GET"]),
    Rule("/_sandbox/objects/<kind>/<obj_id>", endpoint="object", methods=["GET"]),
    Rule("/_sandbox/subscriptions/<obj_id>/apply", endpoint="apply", methods=["POST"]),
]


def _body(request: Request) -> dict[str, Any]:
    if request.mimetype in ("application/x-www-form-urlencoded", "multipart/form-data"):
        return {}  # a form of the dashboard: its handler reads request.form
    raw = request.get_data(cache=True)
    if not raw:
        return {}
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("the body must be a JSON object")
    return value


def cross_site(request: Request) -> bool:
    """A browser sent ``request`` from a page of another origin than the sandbox's."""
    if request.headers.get("Sec-Fetch-Site", "").lower() in ("cross-site", "same-site"):
        return True
    origin = request.headers.get("Origin")
    if origin is None:
        return False  # not sent by a browser's page (a script, a test, curl)
    parts = urlsplit(origin)
    return origin == "null" or (parts.scheme, parts.netloc) != (request.scheme, request.host)


def served_as(request: Request, names: Collection[str]) -> bool:
    """Whether ``request``'s ``Host`` (its name, the port aside) is a loopback name or address
    (``localhost``, ``*.localhost``, ``127.0.0.0/8``, ``::1``) or one of ``names`` (lower
    case). No one but this machine answers for those; any other name may be a DNS rebinding."""
    try:
        name = (urlsplit(f"//{request.host}").hostname or "").rstrip(".")
    except ValueError:
        return False  # not a host name at all
    if name == "localhost" or name.endswith(".localhost") or name in names:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class Control:
    def __init__(self, app: SandboxApp) -> None:
        self.app = app

    def dispatch(self, endpoint: str, request: Request, args: dict[str, Any]) -> Response:
        if request.method not in ("GET", "HEAD", "OPTIONS") and cross_site(request):
            return error_response(
                403, "cross_site", "The sandbox takes no change from a page of another site."
            )
        try:
            body = _body(request) if request.method in ("POST", "PUT") else {}
        except ValueError as exc:
            return error_response(400, "invalid_json", f"Invalid JSON body: {exc}")
        try:
            handler: Callable[..., Response] = getattr(self, f"do_{endpoint}")
            return handler(request, body, **args)
        except (ValueError, TypeError) as exc:
            return error_response(400, "invalid", str(exc))

    # -- state ---------------------------------------------------------------------------------
    def do_health(self, request: Request, body: dict[str, Any]) -> Response:
        return json_response({"status": "ok", "time": self.app.clock.now_str()})

    def do_config(self, request: Request, body: dict[str, Any]) -> Response:
        if request.method == "POST":
            unknown = self.app.config.update(body)
            if unknown:
                return error_response(400, "unknown_setting", f"Unknown: {', '.join(unknown)}")
            self.app.config.save(self.app.store)
        return json_response(self.app.config.public_dict())

    def do_callback(self, request: Request, body: dict[str, Any]) -> Response:
        if request.method == "POST":
            url = body.get("url")
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                return error_response(400, "invalid", "url must be an http(s) URL.", "url")
            self.app.config.callback_url = url
            self.app.config.save(self.app.store)
        elif request.method == "DELETE":
            self.app.config.callback_url = None
            self.app.config.save(self.app.store)
        return json_response({"url": self.app.config.callback_url})

    def do_reset(self, request: Request, body: dict[str, Any]) -> Response:
        self.app.reset(config=bool(body.get("config")))
        return json_response({"reset": True, "config": self.app.config.public_dict()})

    def do_requests(self, request: Request, body: dict[str, Any]) -> Response:
        if request.method == "DELETE":
            self.app.log.clear()
            return json_response({"cleared": True})
        return json_response({"data": self.app.log.entries(request.args.get("operation"))})

    def do_faults(self, request: Request, body: dict[str, Any]) -> Response:
        if request.method == "POST":
            return json_response(self.app.faults.add(body))
        if request.method == "DELETE":
            self.app.faults.clear()
        return json_response(self.app.faults.state())

    def do_revoke(self, request: Request, body: dict[str, Any]) -> Response:
        return json_response({"revoked": self.app.tokens.revoke_all()})

    # -- clock -------------------------------------------------------------------------------
    def do_clock(self, request: Request, body: dict[str, Any]) -> Response:
        return json_response({"now": self.app.clock.now_str(), "offset": self.app.clock.offset})

    def do_advance(self, request: Request, body: dict[str, Any]) -> Response:
        seconds = float(body.get("seconds", 0)) + float(body.get("minutes", 0)) * 60
        seconds += float(body.get("hours", 0)) * 3600 + float(body.get("days", 0)) * 86400
        if seconds < 0:
            raise ValueError("the clock only moves forward")
        summary = self.app.advance(seconds)
        return json_response(
            {"now": self.app.clock.now_str(), "offset": self.app.clock.offset, **summary}
        )

    # -- events ------------------------------------------------------------------------------
    def do_trigger(self, request: Request, body: dict[str, Any]) -> Response:
        status, payload = self.app.guard(
            lambda: (
                200,
                self.app.ledger.trigger(body.get("type"), body.get("object"), body.get("reason")),
            )
        )
        return json_response(payload, status=status)

    def do_deliveries(self, request: Request, body: dict[str, Any]) -> Response:
        return json_response(
            {
                "data": self.app.delivery.list(request.args.get("status")),
                "pending": self.app.delivery.pending(),
            }
        )

    def do_flush(self, request: Request, body: dict[str, Any]) -> Response:
        idle = self.app.delivery.wait_idle(float(body.get("timeout", 10)))
        return json_response(
            {"idle": idle, "pending": self.app.delivery.pending()}, status=200 if idle else 504
        )

    def do_events(self, request: Request, body: dict[str, Any]) -> Response:
        events = self.app.store.page("event", None)
        wanted = request.args.get("type")
        if wanted:
            events = [e for e in events if e["type"] in wanted.split(",")]
        return json_response({"data": events})

    def do_seed(self, request: Request, body: dict[str, Any]) -> Response:
        status, payload = self.app.guard(
            lambda: (
                200,
                self.app.ledger.seed(
                    self.app.config.account,
                    int(body.get("customers", 0)),
                    int(body.get("subscriptions", 0)),
                    body.get("product"),
                ),
            )
        )
        return json_response(payload, status=status)

    def do_objects(self, request: Request, body: dict[str, Any], kind: str) -> Response:
        if kind not in KINDS:
            return error_response(404, "not_found", f"Unknown kind {kind}; one of {KINDS}.")
        return json_response({"data": [public(d) for d in self.app.store.page(kind, None)]})

    def do_object(self, request: Request, body: dict[str, Any], kind: str, obj_id: str) -> Response:
        doc = self.app.store.get(kind, obj_id) if kind in KINDS else None
        if doc is None:
            return error_response(404, "not_found", f"No {kind} {obj_id}.")
        return json_response({"data": public(doc)})

    def do_apply(self, request: Request, body: dict[str, Any], obj_id: str) -> Response:
        """Apply a change or a stop of renewal by hand, as staff would on the service (JSON,
        or the dashboard's form, which is sent back to the dashboard)."""
        form = request.mimetype != "application/json"
        values = {k: v for k, v in request.form.items() if v} if form else body
        status, payload = self.app.guard(
            lambda: (200, {"data": public(self.app.ledger.apply_change(obj_id, values))})
        )
        if form and status == 200:
            return Response(status=303, headers={"Location": "/_sandbox/"})
        return json_response(payload, status=status)

    # -- pages for people ----------------------------------------------------------------------
    def do_index(self, request: Request, body: dict[str, Any]) -> Response:
        """``/``: what this server is, with links (not a 404)."""
        base = request.host_url.rstrip("/")
        html = _html_page(
            "Billing sandbox",
            "<p>An offline emulation of the subscription billing service, for development "
            "and tests. Nothing here is real money.</p><ul>"
            '<li><a id="dashboard" href="/_sandbox/">Dashboard</a>: objects, event '
            "deliveries, the sandbox clock</li>"
            f'<li>API base: <code id="api-base">{escape(base)}/v1/api/billing/</code> '
            "(a bearer token from <code>/auth/realms/sandbox/protocol/openid-connect/token"
            "</code>)</li>"
            "<li>Hosted checkout pages: <code>/checkout/&lt;session id&gt;</code></li>"
            '<li>Health: <a href="/_sandbox/health">/_sandbox/health</a></li></ul>'
            '<p class="muted">Docs: <code>docs/sandbox.md</code> in the billing_integration '
            "repository; test phone numbers 0700000001 (succeeds), 0700000002 (declined), "
            "0700000003 (insufficient funds).</p>",
        )
        return html_response(html)

    def do_dashboard(self, request: Request, body: dict[str, Any]) -> Response:
        app = self.app
        counts = "".join(f"<tr><td>{k}</td><td>{app.store.count(k)}</td></tr>" for k in KINDS)
        rows = "".join(
            f"<tr><td>{escape(d['event_type'])}</td><td>{escape(d['status'])}</td>"
            f"<td>{d['attempts']}</td><td>{escape(d['url'])}</td>"
            f"<td>{escape(_readable_time(d.get('created')))}</td>"
            f"<td>{escape(_last_attempt(d['log']))}</td></tr>"
            for d in reversed(app.delivery.list(limit=100_000)[-200:])
        )
        subs = "".join(_subscription_row(d, app) for d in app.store.page("subscription", 200))
        html = _html_page(
            "Billing sandbox",
            f"<p>Sandbox time: {escape(_readable_time(app.clock.now()))} "
            f"(offset {app.clock.offset:g} s)</p>"
            f"<p>Callback: {escape(str(app.config.callback_url))}</p>"
            f"<h2>Objects</h2><table>{counts}</table>"
            "<h2>Subscriptions</h2><p class='muted'>Apply a requested change or stop of "
            "renewal by hand, as staff would on the service.</p>"
            "<table id='subscriptions'><tr><th>id</th><th>customer</th><th>product</th>"
            "<th>cycle</th><th>currency</th><th>status</th><th>renews</th><th>change</th></tr>"
            f"{subs}</table>"
            "<h2>Deliveries (latest first)</h2><table><tr><th>type</th><th>status</th>"
            "<th>attempts</th><th>url</th><th>created</th><th>last attempt</th></tr>"
            f"{rows}</table>",
        )
        return html_response(html)


def _subscription_row(sub: dict[str, Any], app: SandboxApp) -> str:
    """One subscription with the forms staff use: stop or resume renewal, change the plan."""
    action = f"/_sandbox/subscriptions/{escape(sub['id'])}/apply"
    flip = "false" if sub.get("auto_renew", True) else "true"
    label = "Stop renewal" if flip == "false" else "Resume renewal"
    products = "".join(
        f"<option value='{escape(p['id'])}'{' selected' if p['id'] == sub['product'] else ''}>"
        f"{escape(p['name'])}</option>"
        for p in app.store.page("product", 200)
        if p.get("subscription_blueprint")
    )
    product = app.store.get("product", sub["product"]) or {"name": sub["product"]}
    return (
        f"<tr data-subscription='{escape(sub['id'])}'><td>{escape(sub['id'][:8])}</td>"
        f"<td>{escape(sub['customer'][:8])}</td><td>{escape(product['name'])}</td>"
        f"<td>{escape(sub['selected_billing_cycle'])}</td>"
        f"<td>{escape(sub['selected_currency'])}</td><td>{escape(sub['status'])}</td>"
        f"<td>{'yes' if sub.get('auto_renew', True) else 'no'}</td><td>"
        f"<form method='post' action='{action}' class='renewal'>"
        f"<input type='hidden' name='auto_renew' value='{flip}'>"
        f"<button type='submit'>{label}</button></form>"
        f"<form method='post' action='{action}' class='change'><select name='product'>"
        f"{products}</select><input name='selected_billing_cycle' size='9' "
        f"value='{escape(sub['selected_billing_cycle'])}'><input name='selected_currency' "
        f"size='4' value='{escape(sub['selected_currency'])}'>"
        "<button type='submit'>Apply change</button></form></td></tr>"
    )


def _html_page(title: str, body: str) -> str:
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:2rem}td,th{border:1px solid "
        "#ddd;padding:.3rem .6rem;font-size:.9rem}table{border-collapse:collapse}"
        ".muted{color:#666}</style>"
        f"</head><body><h1>{escape(title)}</h1>{body}</body></html>"
    )


def _readable_time(value: Any) -> str:
    """An epoch number, ISO string or datetime as ``2026-11-23 12:00:05 UTC``; ``-`` for none."""
    if value is None or value == "":
        return "-"
    try:
        if isinstance(value, datetime):
            moment = value
        elif isinstance(value, (int, float)):
            moment = datetime.fromtimestamp(float(value), UTC)
        else:
            moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except (ValueError, OverflowError, OSError):
        return str(value)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _last_attempt(log: list[dict[str, Any]]) -> str:
    """The last delivery attempt for a person: when, the answer, how long it took."""
    if not log:
        return "not attempted yet"
    last = log[-1]
    answer = f"HTTP {last['status_code']}" if last.get("status_code") else "no answer"
    if last.get("error") and not last.get("status_code"):
        answer = str(last["error"])
    took = last.get("duration")
    took_text = f", {float(took) * 1000:.0f} ms" if isinstance(took, (int, float)) else ""
    when = _readable_time(last.get("at"))
    return f"#{last.get('attempt', len(log))} at {when}: {answer}{took_text}"
