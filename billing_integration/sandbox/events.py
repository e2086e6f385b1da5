"""Events: the envelope, Standard Webhooks signing, and the queue of deliveries.

Envelope::

    {"id": "<uuid>", "type": "subscription.canceled", "created_at": "<timestamp>", "data": {...}}

Headers of a delivery (https://www.standardwebhooks.com/): ``webhook-id`` (the envelope id,
stable across retries), ``webhook-timestamp`` (unix seconds of the attempt) and
``webhook-signature`` = ``v1,<base64 HMAC-SHA256 of "id.timestamp.body">`` with the secret
``whsec_<base64>``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from standardwebhooks import Webhook

from .clock import Clock
from .config import SandboxConfig
from .store import Store

EVENT_TYPES = (
    "subscription.renewal",
    "subscription.canceled",
    "subscription.paused",
    "payment.completed",
    "payment.failed",
    "payment.canceled",
    "refund.initiated",
    "refund.approved",
    "refund.rejected",
    "invoice.paid",
    "invoice.voided",
    "invoice.marked_uncollectable",
    "invoice.deleted",
)

#: The past tense of the actions that are not already written in it (``events_past``).
PAST = {"renewal": "renewed"}


def encode(envelope: dict[str, Any]) -> str:
    """The exact body bytes (as text) that are signed and sent."""
    return json.dumps(envelope, separators=(",", ":"), sort_keys=False)


def sign_headers(
    body: str | bytes,
    secret: str,
    msg_id: str | None = None,
    timestamp: int | float | None = None,
) -> dict[str, str]:
    """Standard Webhooks headers for ``body`` signed with ``secret`` (``whsec_...``)."""
    text = body.decode() if isinstance(body, bytes) else body
    msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
    ts = int(time.time() if timestamp is None else timestamp)
    signature = Webhook(secret).sign(msg_id, datetime.fromtimestamp(ts, UTC), text)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": signature,
        "content-type": "application/json",
    }


class EventBus:
    """Creates events, keeps them, and queues a delivery when a callback is registered."""

    def __init__(self, store: Store, clock: Clock, config: SandboxConfig) -> None:
        self.store = store
        self.clock = clock
        self.config = config
        self.listeners: list[Callable[[], None]] = []

    def spelled(self, event_type: str) -> str:
        """``event_type`` as the configured dialect writes it (``events_upper``: SUBSCRIPTION_
        RENEWAL; ``events_past``: subscription.renewed; ``events_prefixed``: billing.<type>)."""
        if self.config.speaks("events_upper"):
            return event_type.replace(".", "_").upper()
        if self.config.speaks("events_past"):
            group, action = event_type.split(".", 1)
            return f"{group}.{PAST.get(action, action)}"
        if self.config.speaks("events_prefixed"):
            return f"billing.{event_type}"
        return event_type

    def emit(self, event_type: str, data: dict[str, Any]) -> dict[str, Any]:
        event_type = self.spelled(event_type)
        envelope = {
            "id": str(uuid.uuid4()),
            "type": event_type,
            "created_at": self.clock.now_str(),
            "data": {k: v for k, v in data.items() if not k.startswith("_")},
        }
        url = self.config.callback_url
        with self.store.transaction() as conn:
            self.store.insert("event", envelope)
            if url:
                conn.execute(
                    "INSERT INTO deliveries (id, event_id, event_type, url, body, status, "
                    "attempts, next_attempt, created) VALUES (?, ?, ?, ?, ?, 'pending', 0, ?, ?)",
                    (
                        str(uuid.uuid4()),
                        envelope["id"],
                        event_type,
                        url,
                        encode(envelope),
                        time.time(),
                        time.time(),
                    ),
                )
        for listener in self.listeners:
            listener()
        return envelope
