"""``from_remote()`` marks saves that come from the service, so they are never pushed back.
Imports nothing of the app (the models read it); public as ``outbox.from_remote``."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

_FROM_REMOTE = contextvars.ContextVar("billing_from_remote", default=False)


@contextmanager
def from_remote() -> Iterator[None]:
    """Within this block, saves of mirrored models write no outbox entry."""
    token = _FROM_REMOTE.set(True)
    try:
        yield
    finally:
        _FROM_REMOTE.reset(token)


def is_from_remote() -> bool:
    return _FROM_REMOTE.get()
