"""Small HTTP helpers shared by the sandbox's handlers: JSON and HTML responses, error bodies.

Error body (the sandbox's decision, the interface shows none)::

    {"errors": [{"message": "...", "code": "...", "field": "name" | null}]}
"""

from __future__ import annotations

import json
from typing import Any

from werkzeug.wrappers import Response


class DropConnection(ConnectionError):
    """Raised by a handler to close the connection without answering (with a TCP RST)."""


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps(body), status=status, headers=headers or {}, mimetype="application/json"
    )


def html_response(html: str, status: int = 200) -> Response:
    """A page for people, which no other site may show in a frame: a page of its own could
    otherwise lay the dashboard's "Stop renewal" or the checkout's "Pay" under a decoy and
    have the developer click it (clickjacking)."""
    return Response(html, status=status, mimetype="text/html", headers={"X-Frame-Options": "DENY"})


def error_entry(message: str, code: str, field: str | None = None) -> dict[str, Any]:
    return {"message": message, "code": code, "field": field}


def errors_response(
    status: int, errors: list[dict[str, Any]], headers: dict[str, str] | None = None
) -> Response:
    return json_response({"errors": errors}, status=status, headers=headers)


def error_response(
    status: int,
    code: str,
    message: str,
    field: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    return errors_response(status, [error_entry(message, code, field)], headers)


class ValidationFailed(Exception):
    """A request body failed validation: one entry per offending field."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(e["message"] for e in errors))
        self.errors = errors


class NotFound(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
