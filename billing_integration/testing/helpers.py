"""``SandboxHandle``: a small client of the sandbox's control endpoints, and ``sign_webhook``."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

import requests
from requests import Response

from billing_integration.sandbox.events import encode, sign_headers

if TYPE_CHECKING:
    from billing_integration.sandbox.server import SandboxServer

#: Fast delivery retries for tests (seconds).
TEST_RETRY_SCHEDULE = [0.05, 0.1, 0.2, 0.4]
#: The settings a test sandbox starts with unless told otherwise.
TEST_SETTINGS: dict[str, Any] = {
    "retry_schedule": TEST_RETRY_SCHEDULE,
    "max_attempts": 5,
    "delivery_timeout": 2.0,
}
Item = dict[str, Any]
Rows = list[Item]


def sign_webhook(
    body: bytes | str, secret: str, msg_id: str | None = None, timestamp: int | float | None = None
) -> dict[str, str]:
    """Standard Webhooks headers for ``body`` signed with ``secret`` as the sandbox does."""
    return sign_headers(body, secret, msg_id=msg_id or str(uuid.uuid4()), timestamp=timestamp)


def deliver_event(
    client: Any,
    event_type: str,
    data: dict[str, Any],
    *,
    secret: str | None = None,
    event_id: str | None = None,
    created_at: str | None = None,
    path: str | None = None,
) -> Any:
    """Sign a sample event as the sandbox does (Standard Webhooks, with ``secret``, default the
    first of ``BILLING['WEBHOOK_SECRET']``) and POST it to the app's callback through a Django
    test ``client``; returns the response. What a test of a handler of one's own sends."""
    from django.urls import reverse

    from billing_integration.conf import billing_settings
    from billing_integration.timestamps import format_timestamp

    if secret is None:
        configured = billing_settings.WEBHOOK_SECRET
        if isinstance(configured, list | tuple):
            configured = configured[0] if configured else None
        secret = configured
    if not secret:
        raise ValueError("No secret: pass secret= or set BILLING['WEBHOOK_SECRET'].")
    msg_id = event_id or str(uuid.uuid4())
    envelope = {
        "id": msg_id,
        "type": event_type,
        "created_at": created_at or format_timestamp(datetime.now(UTC)),
        "data": data,
    }
    body = encode(envelope)
    headers = sign_webhook(body, secret, msg_id=msg_id)
    headers.pop("content-type", None)
    url = path or reverse("billing_integration:webhook")
    return client.post(url, data=body, content_type="application/json", headers=headers)


def start_sandbox(**settings: Any) -> SandboxServer:
    """Start an in-memory sandbox on a free port in a background thread (call ``.stop()``)."""
    from billing_integration.sandbox.server import SandboxServer

    settings = {**TEST_SETTINGS, **settings}
    return SandboxServer("127.0.0.1", 0, None, quiet=True, **settings).start()


class SandboxHandle:
    """Drive a running sandbox at ``url`` through its ``/_sandbox/`` control endpoints."""

    def __init__(
        self,
        url: str,
        defaults: dict[str, Any] | None = None,
        *,
        server: Any = None,
        webhook_secret: str | None = None,
    ) -> None:
        self.url = self.base_url = self.checkout_url = url.rstrip("/")
        self.auth_url = f"{self.url}/auth"
        self.token_url = f"{self.auth_url}/realms/sandbox/protocol/openid-connect/token"
        self.api_url = f"{self.url}/v1/api/billing"
        self.http = requests.Session()
        self.defaults = dict(defaults or {})
        self.server = server
        self._webhook_secret = webhook_secret
        self._config: dict[str, Any] | None = None

    def config(self, **values: Any) -> dict[str, Any]:
        """Read (and with ``values``, change) the sandbox's configuration."""
        if values:
            self._config = self._post("/_sandbox/config", values)
            if values.get("webhook_secret"):
                self._webhook_secret = values["webhook_secret"]
        elif self._config is None:
            self._config = self._get("/_sandbox/config")
        return self._config

    @property
    def client_id(self) -> str:
        return str(self.config()["client_id"])

    @property
    def client_secret(self) -> str:
        return str(self.config()["client_secret"])

    @property
    def webhook_secret(self) -> str:
        if self.server is not None:
            return str(self.server.config.webhook_secret)
        if self._webhook_secret is None:
            raise RuntimeError(
                "The sandbox does not answer its webhook secret over HTTP: pass server= or "
                "webhook_secret= (BILLING_SANDBOX_WEBHOOK_SECRET, or what it printed)."
            )
        return self._webhook_secret

    def django_settings(self) -> dict[str, Any]:
        """The ``BILLING`` keys that point the app at this sandbox."""
        return {
            "BASE_URL": self.base_url,
            "AUTH_URL": self.auth_url,
            "CHECKOUT_URL": self.checkout_url,
            "CLIENT_ID": self.client_id,
            "CLIENT_SECRET": self.client_secret,
            "WEBHOOK_SECRET": self.webhook_secret,
        }

    def _call(self, method: str, path: str, timeout: float = 30, **kwargs: Any) -> Item:
        response = self.http.request(method, self.url + path, timeout=timeout, **kwargs)
        response.raise_for_status()
        return cast(Item, response.json())

    def _get(self, path: str, **params: Any) -> Item:
        return self._call("GET", path, params=params)

    def _post(self, path: str, body: Item | None = None, timeout: float = 30) -> Item:
        return self._call("POST", path, timeout, json=body or {})

    def _data(self, path: str, **params: Any) -> Rows:
        return cast(Rows, self._get(path, **{k: v for k, v in params.items() if v})["data"])

    def reset(self) -> None:
        """Wipe the state, faults, request log and clock; restore the default settings."""
        self._post("/_sandbox/reset")
        self._config = None
        if self.defaults:
            self.config(**self.defaults)

    def dialects(self, *names: str) -> dict[str, Any]:
        """Switch on these dialects (``DIALECTS`` in ``sandbox/config.py``), and off the others;
        none: the interface's guesses again."""
        return self.config(dialects=list(names))

    def token(self) -> str:
        """A fresh access token for the configured client."""
        form = {"grant_type": "client_credentials", "client_id": self.client_id}
        response = self.http.post(
            self.token_url, data={**form, "client_secret": self.client_secret}, timeout=30
        )
        response.raise_for_status()
        return str(response.json()["access_token"])

    def revoke_tokens(self) -> int:
        return int(self._post("/_sandbox/tokens/revoke")["revoked"])

    def requests(self, operation: str | None = None) -> Rows:
        """What the sandbox received (token, billing and checkout calls), oldest first."""
        return self._data("/_sandbox/requests", operation=operation)

    def clear_requests(self) -> None:
        self._call("DELETE", "/_sandbox/requests")

    def faults(self, **knobs: Any) -> dict[str, Any]:
        """Add a fault rule (see docs/sandbox.md); without arguments, return the current faults."""
        return self._post("/_sandbox/faults", knobs) if knobs else self._get("/_sandbox/faults")

    def clear_faults(self) -> None:
        self._call("DELETE", "/_sandbox/faults")

    def objects(self, kind: str) -> Rows:
        return self._data(f"/_sandbox/objects/{kind}")

    def object(self, kind: str, obj_id: str) -> dict[str, Any]:
        return cast(Item, self._get(f"/_sandbox/objects/{kind}/{obj_id}")["data"])

    def seed(self, customers: int = 0, subscriptions: int = 0, product: str | None = None) -> Item:
        body = {"customers": customers, "subscriptions": subscriptions, "product": product}
        return self._post("/_sandbox/seed", body, timeout=120)

    def trigger(self, event_type: str, obj: str, reason: str | None = None) -> dict[str, Any]:
        """Emit ``event_type`` for object id ``obj`` with its state change; returns the event."""
        body = {"type": event_type, "object": obj, **({"reason": reason} if reason else {})}
        return self._post("/_sandbox/trigger", body)

    def advance(self, seconds: float = 0, *, days: float = 0) -> dict[str, Any]:
        """Move the sandbox clock forward; returns what was billed and expired."""
        return self._post("/_sandbox/clock/advance", {"seconds": seconds, "days": days})

    def now(self) -> str:
        return str(self._get("/_sandbox/clock")["now"])

    def set_callback(self, url: str | None) -> None:
        if url is None:
            self._call("DELETE", "/_sandbox/callback")
        else:
            self._post("/_sandbox/callback", {"url": url})
        self._config = None

    def events(self, event_type: str | None = None) -> Rows:
        return self._data("/_sandbox/events", type=event_type)

    def deliveries(self, status: str | None = None) -> Rows:
        return self._data("/_sandbox/deliveries", status=status)

    def deliver(self, client: Any, event: dict[str, Any], path: str = "/billing/webhooks/") -> Any:
        """POST ``event`` to your webhook view through a Django test ``client``, signed."""
        body = encode(event)
        headers = sign_webhook(body, self.webhook_secret, msg_id=event["id"])
        headers.pop("content-type", None)
        return client.post(path, data=body, content_type="application/json", headers=headers)

    def wait_for_deliveries(self, timeout: float = 10.0) -> bool:
        """Block until no delivery is pending; False if ``timeout`` passed first."""
        url, body = self.url + "/_sandbox/deliveries/flush", {"timeout": timeout}
        return self.http.post(url, json=body, timeout=timeout + 10).status_code == 200

    def complete_checkout(
        self, session_id: str, phone: str = "0700000001", return_url: str | None = None
    ) -> Response:
        """Walk the hosted checkout page; the final response's ``data-outcome`` tells the result."""
        page = f"{self.url}/checkout/{session_id}"
        extra = {"return_url": return_url} if return_url else {}
        first = self.http.post(page, data={"step": "phone", "phone": phone, **extra}, timeout=30)
        if first.status_code != 200:
            return first
        # the PIN step's hidden token: the confirming POST is refused without it
        token = re.search(r'name="form_token" value="([0-9a-f]+)"', first.text)
        extra["form_token"] = token.group(1) if token else ""
        return self.http.post(page, data={"step": "confirm", "phone": phone, **extra}, timeout=30)
