"""``from_remote()``: mark saves that come from the service so they are never pushed back.

Below the models (their ``save()`` reads it) and the outbox (its receivers skip such saves);
imports nothing of the app. The public name is ``billing_integration.outbox.from_remote``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

_FROM_REMOTE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "billing_from_remote", default=False
)


@contextmanager
def from_remote() -> Iterator[None]:
    """Within this block, saves of mirrored models write no outbox entry.

    Used by pulls, event handlers and the push itself::

        with from_remote():
            subscription.save()
    """
    token = _FROM_REMOTE.set(True)
    try:
        yield
    finally:
        _FROM_REMOTE.reset(token)


def is_from_remote() -> bool:
    return _FROM_REMOTE.get()
