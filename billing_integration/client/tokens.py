"""Access tokens (client-credentials grant), shared by every process and thread through
``shared_cache()``, one fetch at a time (a cache ``add()`` lock); while that cache fails, each
process fetches and keeps its own. The token and the secret never appear in a log line, an
error or a repr."""

from __future__ import annotations

import hashlib
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ..conf import shared_cache
from ..exceptions import BillingError, BillingTransportError
from .retry import Deadline

logger = logging.getLogger("billing_integration.client")

REFRESH_RATIO = 0.8  # a new token is fetched once this share of its lifetime has passed
LOCK_TIMEOUT = 10.0  # seconds one process may hold the fetch lock
POLL = 0.05  # seconds between looks while another process fetches
DEFAULT_LIFETIME = 60.0  # seconds a token is kept when its expires_in is missing or unreadable
MAX_LIFETIME = 86400.0  # seconds a token is kept at most (a 401 before then fetches another)


def expires_in(answer: dict[str, Any]) -> float | None:
    """The token answer's ``expires_in`` in seconds (a number, or a string holding one), at
    most ``MAX_LIFETIME``; ``None`` when missing or not a finite positive number."""
    value = answer.get("expires_in")
    if isinstance(value, bool):
        return None
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return min(seconds, MAX_LIFETIME) if math.isfinite(seconds) and seconds > 0 else None


@dataclass(frozen=True)
class Token:
    access_token: str
    refresh_at: float  # epoch seconds: fetch a new one from here on
    expires_at: float  # epoch seconds: unusable from here on

    def __repr__(self) -> str:
        return f"Token(refresh_at={self.refresh_at:.0f}, expires_at={self.expires_at:.0f})"


class TokenProvider:
    """Hands out a valid token; ``fetch(deadline)`` makes the token call."""

    def __init__(self, fetch: Callable[[Deadline | None], dict[str, Any]], *, scope: str):
        self._fetch = fetch
        # A hash of the credentials: other credentials, another token; nothing readable stored.
        self._key = "billing_integration:token:" + hashlib.sha256(scope.encode()).hexdigest()[:20]
        self._local: Token | None = None

    def get(self, deadline: Deadline | None = None) -> str:
        """A valid token; ``deadline`` bounds the wait for it and its fetch."""
        local = self._local
        if local is None or time.time() >= local.refresh_at:
            try:
                local = self._shared(deadline)
            except BillingError:
                raise
            except Exception as exc:  # the cache is down: a token of this process's own
                logger.warning("billing token: shared cache unavailable (%s)", exc)
                local = self._local  # fetched before the cache failed to store it
                if local is None or time.time() >= local.refresh_at:
                    local = self._fetched(deadline)
            self._local = local
        return local.access_token

    def invalidate(self, access_token: str) -> None:
        """Forget ``access_token`` (the service refused it) if it is still the current one."""
        if self._local is not None and self._local.access_token == access_token:
            self._local = None
        try:
            current = self._read()
            if current is not None and current.access_token == access_token:
                shared_cache().delete(self._key)
        except Exception as exc:  # the cache is down: nothing shared to forget
            logger.warning("billing token: shared cache unavailable (%s)", exc)

    def _read(self) -> Token | None:
        try:
            return Token(**shared_cache().get(self._key))
        except TypeError:  # none, or not a token
            return None

    def _shared(self, deadline: Deadline | None) -> Token:
        patience = LOCK_TIMEOUT + 5 if deadline is None else deadline.remaining()
        give_up = time.monotonic() + patience
        lock_key = self._key + ":lock"
        while True:
            current = self._read()
            if current is not None and time.time() < current.refresh_at:
                return current
            cache, owner = shared_cache(), uuid.uuid4().hex
            if cache.add(lock_key, owner, timeout=LOCK_TIMEOUT):
                try:
                    current = self._read()  # another may have stored one since our read
                    if current is not None and time.time() < current.refresh_at:
                        return current
                    try:
                        return self._fetch_and_store(deadline)
                    except BillingError as exc:  # refreshing ahead: the current one still serves
                        if current is None or time.time() >= current.expires_at - 1.0:
                            raise
                        logger.warning("billing token: refresh failed (%s); current one kept", exc)
                        return current
                finally:
                    if cache.get(lock_key) == owner:
                        cache.delete(lock_key)
            # Another process is fetching: use the current token while it lasts, or wait.
            if current is not None and time.time() < current.expires_at - 1.0:
                return current
            if time.monotonic() > give_up:
                raise BillingTransportError(
                    "timed out waiting for another process to fetch a token", operation="token"
                )
            time.sleep(POLL)

    def _fetch_and_store(self, deadline: Deadline | None) -> Token:
        self._local = token = self._fetched(deadline)  # kept should the cache fail to store it
        timeout = max(1, int(token.expires_at - time.time()))
        shared_cache().set(self._key, asdict(token), timeout=timeout)
        return token

    def _fetched(self, deadline: Deadline | None) -> Token:
        """A new token from the service."""
        started = time.time()
        data = self._fetch(deadline)
        lifetime = expires_in(data)
        if lifetime is None:
            lifetime = DEFAULT_LIFETIME
            logger.warning(
                "billing token obtained; the answer has no usable expires_in: kept %ss",
                int(lifetime),
            )
        else:
            logger.info("billing token obtained (expires_in=%ss)", int(lifetime))
        return Token(
            str(data["access_token"]), started + lifetime * REFRESH_RATIO, started + lifetime
        )
