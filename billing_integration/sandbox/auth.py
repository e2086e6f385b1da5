"""The token endpoint (OAuth 2.0 client credentials, form-encoded) and token checks.

The client authenticates as an OpenID Connect server lets it: with ``client_id`` and
``client_secret`` in the form (``client_secret_post``, what the app sends) or in an
``Authorization: Basic`` header (``client_secret_basic``, RFC 6749 section 2.3.1: each
form-urlencoded, then base64), which is looked at first.

Tokens are opaque random strings stored with their expiry on the sandbox clock, so advancing
the clock expires them like real time does.
"""

from __future__ import annotations

import secrets
import uuid
from typing import Any
from urllib.parse import unquote_plus

from werkzeug.wrappers import Request, Response

from .clock import Clock
from .config import SandboxConfig
from .store import Store
from .web import json_response


def _oauth_error(status: int, error: str, description: str) -> Response:
    # OAuth 2.0 error fields, plus the sandbox's usual ``errors`` list.
    body = {
        "error": error,
        "error_description": description,
        "errors": [{"message": description, "code": error, "field": None}],
    }
    return json_response(body, status=status)


def _client_credentials(request: Request) -> tuple[str | None, str | None]:
    """``(client_id, client_secret)`` from HTTP Basic if sent, else from the form."""
    basic = request.authorization
    if basic is not None and basic.type == "basic":
        user, password = basic.username, basic.password
        return (unquote_plus(user) if user else None, unquote_plus(password) if password else None)
    return request.form.get("client_id"), request.form.get("client_secret")


class TokenService:
    def __init__(self, store: Store, clock: Clock, config: SandboxConfig) -> None:
        self.store = store
        self.clock = clock
        self.config = config

    def issue(self, request: Request) -> Response:
        mimetype = request.mimetype
        if mimetype != "application/x-www-form-urlencoded":
            return _oauth_error(
                400,
                "invalid_request",
                "The token request must be form-encoded "
                "(Content-Type: application/x-www-form-urlencoded).",
            )
        form = request.form
        grant = form.get("grant_type")
        if not grant:
            return _oauth_error(400, "invalid_request", "Missing form parameter: grant_type.")
        if grant != "client_credentials":
            return _oauth_error(400, "unsupported_grant_type", f"Unsupported grant type {grant!r}.")
        client_id, client_secret = _client_credentials(request)
        if not client_id or not client_secret:
            return _oauth_error(401, "invalid_client", "Missing client_id or client_secret.")
        if not (
            secrets.compare_digest(client_id, self.config.client_id)
            and secrets.compare_digest(client_secret, self.config.client_secret)
        ):
            return _oauth_error(401, "invalid_client", "Invalid client credentials.")
        return json_response(self.create_token(client_id))

    def create_token(self, client_id: str) -> dict[str, Any]:
        token = secrets.token_urlsafe(32)
        lifetime = int(self.config.token_lifetime)
        unit = 1000 if self.config.speaks("expires_in_ms") else 1  # what expires_in says
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO tokens (token, client_id, account, expires_at) VALUES (?, ?, ?, ?)",
                (token, client_id, self.config.account, self.clock.timestamp() + lifetime),
            )
        return {
            "access_token": token,
            "expires_in": lifetime * unit,
            "refresh_expires_in": int(self.config.refresh_lifetime) * unit,
            "refresh_token": secrets.token_urlsafe(32),
            "token_type": "Bearer",
            "not-before-policy": 0,
            "session_state": str(uuid.uuid4()),
            "scope": "profile email",
        }

    def account_for_token(self, token: str | None) -> tuple[str | None, str]:
        """``(account, "")`` for a valid token, else ``(None, reason)``."""
        if not token:
            return None, "Missing x-kc-token header."
        rows = self.store.execute(
            "SELECT account, expires_at FROM tokens WHERE token = ?", (token,)
        )
        if not rows:
            return None, "Invalid access token."
        account, expires_at = rows[0]
        if expires_at <= self.clock.timestamp():
            return None, "Access token expired."
        return account, ""

    def revoke_all(self) -> int:
        with self.store.transaction() as conn:
            return conn.execute("DELETE FROM tokens").rowcount
