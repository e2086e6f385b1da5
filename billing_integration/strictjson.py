"""Strict JSON for event bodies: no NaN or infinity."""

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


def parse_body(body: str | bytes) -> dict[str, Any]:
    """The envelope as a dict; ``ValueError`` (NaN, infinity, not an object) otherwise."""
    if isinstance(body, bytes):
        body = body.decode("utf-8")  # UnicodeDecodeError is a ValueError
    value = json.loads(body, parse_constant=_no_constant, parse_float=_finite_float)
    if not isinstance(value, dict):
        raise ValueError("The event body is not a JSON object.")
    return value
