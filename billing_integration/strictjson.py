"""Strict JSON for event bodies: no NaN or infinity (``parse_json``, ``parse_body``)."""

from __future__ import annotations

import json
import math
from typing import Any


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def parse_json(text: str) -> Any:
    """``json.loads`` raising ``ValueError`` on NaN and infinities."""
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)


def parse_body(body: str | bytes) -> dict[str, Any]:
    """The envelope as a dict; ``ValueError`` if the body is not a JSON object."""
    if isinstance(body, bytes):
        body = body.decode("utf-8")  # UnicodeDecodeError is a ValueError
    value = parse_json(body)
    if not isinstance(value, dict):
        raise ValueError("The event body is not a JSON object.")
    return value
