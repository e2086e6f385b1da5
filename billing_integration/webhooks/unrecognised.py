"""Events the app did not understand (``unrecognised``: no handler for the type, or data a
handler cannot use): what the admin's "Unrecognised events" page lists, by type, and their
replay once a type is mapped (``BILLING['EVENT_TYPE_ALIASES']``) or handled (``@handler``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Max, Min

from ..exceptions import redact
from ..models import EventState, WebhookEvent
from .handlers import HANDLERS
from .types import CANONICAL_TYPES, normalize_type


@dataclass
class UnrecognisedType:
    """The stored unrecognised events of one type as received."""

    raw_type: str
    count: int
    first_seen: datetime
    last_seen: datetime
    #: The newest one's envelope, secret-looking fields redacted.
    sample: Any
    #: Why the newest one was not applied.
    error: str
    #: What would make the app apply them (an alias, or a handler to write).
    needs: str


def unrecognised_types() -> list[UnrecognisedType]:
    """Each type of the stored unrecognised events, the most frequent first."""
    rows = (
        WebhookEvent.objects.filter(state=EventState.UNRECOGNISED)
        .values("raw_type")
        .annotate(n=Count("pk"), first=Min("received_at"), last=Max("received_at"))
        .order_by("-n", "raw_type")
    )
    found = []
    for row in rows:
        newest = (
            WebhookEvent.objects.filter(state=EventState.UNRECOGNISED, raw_type=row["raw_type"])
            .order_by("-received_at", "-pk")
            .only("body", "error", "type", "raw_type")
            .first()
        )
        if newest is None:  # replayed meanwhile
            continue
        found.append(
            UnrecognisedType(
                raw_type=row["raw_type"],
                count=row["n"],
                first_seen=row["first"],
                last_seen=row["last"],
                sample=redact(newest.payload),
                error=newest.error,
                needs=needed_handler(newest.raw_type, newest.type),
            )
        )
    return found


def closest_type(raw_type: str) -> str:
    """The canonical type a spelling with extra leading words reads as (``billing.invoice.paid``
    -> ``invoice.paid``), or ""."""
    words = [w for w in raw_type.replace("-", ".").replace("_", ".").split(".") if w]
    for start in range(1, len(words)):
        if found := normalize_type(".".join(words[start:])):
            return found
    return ""


def needed_handler(raw_type: str, canonical: str = "") -> str:
    """What would make the app apply events of ``raw_type``, for a person."""
    current = normalize_type(raw_type) or canonical
    if current and current in HANDLERS:
        handler = HANDLERS[current].__name__
        if current != canonical:
            return f"mapped to {current} now ({handler}): replay them"
        return f"{handler} ({current}) needs more data than they carry: a handler of your own"
    guess = closest_type(raw_type)
    if guess:
        return f'an alias: BILLING["EVENT_TYPE_ALIASES"] = {{"{raw_type}": "{guess}"}}'
    known = ", ".join(CANONICAL_TYPES[:3])
    return (
        f'a handler: @handler("{raw_type}") on an EventHandler subclass, or an alias to a '
        f"known type ({known}, ...)"
    )


def replay_unrecognised(*, inline: bool = True) -> dict[str, int]:
    """Process every stored unrecognised event again, oldest first, with the usual version
    guards (after an alias or a handler was added). Returns counts by resulting state."""
    from .processing import replay_events

    return replay_events(WebhookEvent.objects.filter(state=EventState.UNRECOGNISED), inline=inline)
