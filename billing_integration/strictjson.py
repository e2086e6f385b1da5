"""Strict JSON for stored and received event bodies (``parse_json``, ``parse_body``).

Below the models (``WebhookEvent.payload``) and the webhooks package (ingest, processing);
imports nothing of the app and not Django.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["parse_body", "parse_json"]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def parse_json(text: str) -> Any:
    """``json.loads`` for a delivery body: strict JSON, so ``NaN``, ``Infinity`` and
    ``-Infinity`` (and a number too large for a float, which would read as infinity) raise
    ``ValueError``: an amount must never be read as a float NaN or infinity."""
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)


def parse_body(body: str | bytes) -> dict[str, Any]:
    """The envelope as a dict; ``ValueError`` if the body is not a JSON object."""
    if isinstance(body, bytes):
        body = body.decode("utf-8")  # UnicodeDecodeError is a ValueError
    value = parse_json(body)
    if not isinstance(value, dict):
        raise ValueError("The event body is not a JSON object.")
    return value
