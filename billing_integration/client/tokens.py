"""Access tokens: client-credentials grant, shared through Django's cache, single flight.

- A token is reused until ``TOKEN_REFRESH_RATIO`` of its ``expires_in`` (seconds) has passed.
- All processes share it through the cache alias ``TOKEN_CACHE``; each process also keeps it in
  memory so a hot path costs no cache round trip.
- One process at a time fetches (``cache.add`` as a lock). The others keep using the current
  token while it is still valid, or wait for the fetcher when there is none.
- ``invalidate(token)`` drops a token the service refused (401), only if it is still the current
  one, so a burst of 401s causes one fetch, not many.
- ``get(deadline)``: a call with a deadline (a person waits) waits for another process's fetch,
  and makes its own, only until then.

The token and the client secret never appear in a log line, exception text or repr.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core.cache import caches

from ..exceptions import BillingTransportError
from .retry import Deadline

logger = logging.getLogger("billing_integration.client")


@dataclass(frozen=True)
class Token:
    access_token: str
    refresh_at: float  # epoch seconds: fetch a new one from here on
    expires_at: float  # epoch seconds: unusable from here on

    def fresh(self, now: float) -> bool:
        return now < self.refresh_at

    def usable(self, now: float) -> bool:
        return now < self.expires_at - 1.0

    def __repr__(self) -> str:  # never show the token
        return f"Token(refresh_at={self.refresh_at:.0f}, expires_at={self.expires_at:.0f})"


class TokenProvider:
    """Hands out a valid access token; ``fetch(deadline)`` does the actual HTTP call."""

    poll_interval = 0.05

    def __init__(
        self,
        fetch: Callable[[Deadline | None], dict[str, Any]],
        *,
        cache_alias: str,
        scope: str,
        refresh_ratio: float,
        lock_timeout: float,
    ) -> None:
        self._fetch = fetch
        self._cache_alias = cache_alias
        digest = hashlib.sha256(scope.encode()).hexdigest()[:20]
        self._key = f"billing_integration:token:{digest}"
        self._lock_key = f"{self._key}:lock"
        self._refresh_ratio = refresh_ratio
        self._lock_timeout = lock_timeout
        self._local: Token | None = None
        self._thread_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TokenProvider(cache={self._cache_alias!r})"

    @property
    def _cache(self):
        return caches[self._cache_alias]

    def get(self, deadline: Deadline | None = None) -> str:
        """A valid token; ``deadline`` bounds the wait for it (and its fetch)."""
        now = time.time()
        local = self._local
        if local is not None and local.fresh(now):
            return local.access_token
        if deadline is None:
            self._thread_lock.acquire()
        elif not self._thread_lock.acquire(timeout=deadline.remaining()):
            raise BillingTransportError("timed out waiting for a token", operation="token")
        try:  # one thread per process goes on to the shared cache
            return self._get_shared(deadline).access_token
        finally:
            self._thread_lock.release()

    def invalidate(self, access_token: str) -> None:
        """Forget ``access_token`` (the service refused it) if it is still the current one."""
        with self._thread_lock:
            if self._local is not None and self._local.access_token == access_token:
                self._local = None
            shared = self._read_cache()
            if shared is not None and shared.access_token == access_token:
                self._cache.delete(self._key)

    # ------------------------------------------------------------------------------------
    def _read_cache(self) -> Token | None:
        raw = self._cache.get(self._key)
        if not raw:
            return None
        try:
            return Token(raw["access_token"], float(raw["refresh_at"]), float(raw["expires_at"]))
        except (KeyError, TypeError, ValueError):
            return None

    def _get_shared(self, bound: Deadline | None = None) -> Token:
        deadline = time.monotonic() + self._lock_timeout + 5.0
        if bound is not None:
            deadline = min(deadline, time.monotonic() + bound.remaining())
        while True:
            now = time.time()
            shared = self._read_cache()
            if shared is not None and shared.fresh(now):
                self._local = shared
                return shared
            owner = uuid.uuid4().hex
            if self._cache.add(self._lock_key, owner, timeout=self._lock_timeout):
                try:
                    # Someone may have stored a fresh token between our read and the lock.
                    shared = self._read_cache()
                    if shared is not None and shared.fresh(time.time()):
                        self._local = shared
                        return shared
                    token = self._fetch_and_store(bound)
                    self._local = token
                    return token
                finally:
                    if self._cache.get(self._lock_key) == owner:
                        self._cache.delete(self._lock_key)
            # Another process is fetching. Keep using a still-valid token meanwhile.
            if shared is not None and shared.usable(now):
                return shared
            if time.monotonic() > deadline:
                raise BillingTransportError(
                    "timed out waiting for another process to fetch a token", operation="token"
                )
            time.sleep(self.poll_interval)

    def _fetch_and_store(self, bound: Deadline | None = None) -> Token:
        started = time.time()
        data = self._fetch(bound)
        lifetime = float(data.get("expires_in") or 60)
        token = Token(
            access_token=str(data["access_token"]),
            refresh_at=started + lifetime * self._refresh_ratio,
            expires_at=started + lifetime,
        )
        self._cache.set(
            self._key,
            {
                "access_token": token.access_token,
                "refresh_at": token.refresh_at,
                "expires_at": token.expires_at,
            },
            timeout=max(1, int(lifetime)),
        )
        logger.info("billing token obtained (expires_in=%ss)", int(lifetime))
        return token
