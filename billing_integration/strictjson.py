"""Strict JSON for event bodies (and the sandbox's request bodies): no NaN or infinity."""

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


def loads(text: str | bytes) -> Any:
    """JSON proper: ``ValueError`` for NaN, Infinity and a number beyond a float's range,
    which Python's reader takes."""
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)


def parse_body(body: str | bytes) -> dict[str, Any]:
    """The envelope as a dict; ``ValueError`` (NaN, infinity, not an object) otherwise."""
    if isinstance(body, bytes):
        body = body.decode("utf-8")  # UnicodeDecodeError is a ValueError
    value = loads(body)
    if not isinstance(value, dict):
        raise ValueError("The event body is not a JSON object.")
    return value
