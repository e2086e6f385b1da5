"""Fault injection: per-operation error rates, latency, timeouts, lost responses, outages.

A rule (``POST /_sandbox/faults``)::

    {"operation": "create_product",   # or "*" for every billing/token operation
     "error_rate": 0.2, "status": 503, "retry_after": 1,   # error answers (401/429/5xx...)
     "latency": 0.05,                                       # seconds added to each request
     "timeout_rate": 0.05, "timeout_seconds": 10,           # hold, then close unanswered
     "reset_after_commit_rate": 0.05,                       # commit, then TCP RST
     "reset_rate": 0.0,                                     # TCP RST before any effect
     "ignore_paging": false,                                # list ops return everything
     "lose_first_answer": false,                            # apply, then answer garbage
     "count": 2,                                            # next N matches, then the rule ends
     "seed": 1}                                             # seeds this rule's randomness

With ``count`` the rule applies to the next ``count`` matching requests with certainty (the
first of timeout, reset, reset-after-commit, error that the rule sets a rate or status for),
then disappears. ``{"outage_seconds": 30}`` answers 503 to every billing and token request for
that many (real) seconds (``"outage_mode": "reset"`` drops connections instead).

``{"lose_first_answer": true}`` loses the answer of the first attempt of each idempotency key
of a matching POST/PATCH: the request is applied (object and key stored), then answered 200
with a body that is not JSON; a replay of the key answers normally. Like ``ignore_paging`` it
holds for every matching request while the rule stands (``count`` ends it as usual), and
combines with the rule's other knobs.

``{"rate_limit": 20}`` is a rate limit: a billing request beyond 20 accepted in the last second
(``"rate_limit_window"``, seconds) is answered 429 with ``Retry-After: 2``
(``"rate_limit_retry_after"``); token requests and the checkout page are not limited.
``{"rate_limit": null}`` lifts it; ``DELETE /_sandbox/faults`` too. The state shows the limit
and ``rate_limited``, the number of 429s it answered.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

OPERATIONS = (
    "token",
    "list_products",
    "create_product",
    "get_product",
    "update_product",
    "list_customers",
    "create_customer",
    "list_subscriptions",
    "create_subscription",
    "update_subscription",
    "create_checkout_session",
    "checkout_page",
)

ACTIONS = ("timeout", "reset", "reset_after_commit", "error")


@dataclass
class Decision:
    latency: float = 0.0
    action: str | None = None  # one of ACTIONS
    status: int = 503
    retry_after: float | None = None
    timeout_seconds: float = 10.0
    ignore_paging: bool = False
    lose_first_answer: bool = False


@dataclass
class FaultRule:
    operation: str = "*"
    error_rate: float | None = None
    status: int | None = None
    retry_after: float | None = None
    latency: float = 0.0
    timeout_rate: float = 0.0
    timeout_seconds: float = 10.0
    reset_after_commit_rate: float = 0.0
    reset_rate: float = 0.0
    ignore_paging: bool = False
    lose_first_answer: bool = False
    count: int | None = None
    seed: int | None = None
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        if self.error_rate is None:
            self.error_rate = 1.0 if self.status is not None else 0.0
        if self.status is None:
            self.status = 503

    def matches(self, operation: str) -> bool:
        return self.operation in ("*", operation)

    def pick(self) -> str | None:
        """The action this rule takes on one matching request."""
        rates = {
            "timeout": self.timeout_rate,
            "reset": self.reset_rate,
            "reset_after_commit": self.reset_after_commit_rate,
            "error": self.error_rate,
        }
        if self.count is not None:
            return next((a for a in ACTIONS if (rates[a] or 0) > 0), None)
        for action in ACTIONS:
            rate = rates[action] or 0.0
            if rate > 0 and self._rng.random() < rate:
                return action
        return None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


class FaultInjector:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Outage windows are read on ``clock``; latency and timeout holds wait with ``sleep``
        #: (both replaceable, so tests use a fake clock instead of measuring time).
        self.clock: Callable[[], float] = time.monotonic
        self.sleep: Callable[[float], None] = time.sleep
        self.rules: list[FaultRule] = []
        self.outage_until = 0.0
        self.outage_mode = "503"
        self.rate_limit: float | None = None  # accepted billing requests per window
        self.rate_limit_window = 1.0
        self.rate_limit_retry_after = 2.0
        self.rate_limited = 0  # 429s the rate limit answered
        self._accepted: deque[float] = deque()  # clock() of requests the limit let through

    def add(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Add a rule, or an outage window. Raises ``ValueError`` for bad specs."""
        spec = dict(spec)
        if "rate_limit" in spec:
            self._set_rate_limit(spec)
            if not spec:
                return self.state()
        if "outage_seconds" in spec:
            seconds = float(spec.pop("outage_seconds"))
            mode = str(spec.pop("outage_mode", "503"))
            if mode not in ("503", "reset"):
                raise ValueError("outage_mode must be '503' or 'reset'")
            with self._lock:
                self.outage_until = self.clock() + seconds
                self.outage_mode = mode
            if not spec:
                return self.state()
        operation = spec.get("operation", "*")
        if operation != "*" and operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}; one of {', '.join(OPERATIONS)}")
        allowed = {f for f in FaultRule.__dataclass_fields__ if not f.startswith("_")}
        unknown = sorted(set(spec) - allowed)
        if unknown:
            raise ValueError(f"unknown fault knob(s): {', '.join(unknown)}")
        try:
            rule = FaultRule(**spec)
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        if rule.count is not None and int(rule.count) < 1:
            raise ValueError("count must be >= 1")
        with self._lock:
            self.rules.append(rule)
        return self.state()

    def _set_rate_limit(self, spec: dict[str, Any]) -> None:
        """Take the rate-limit knobs out of ``spec`` and apply them."""
        limit = spec.pop("rate_limit")
        window = float(spec.pop("rate_limit_window", 1.0))
        retry_after = float(spec.pop("rate_limit_retry_after", 2.0))
        if limit is not None and float(limit) <= 0:
            raise ValueError("rate_limit must be > 0 (requests per window), or null to lift it")
        if window <= 0 or retry_after < 0:
            raise ValueError("rate_limit_window must be > 0 and rate_limit_retry_after >= 0")
        with self._lock:
            self.rate_limit = None if limit is None else float(limit)
            self.rate_limit_window = window
            self.rate_limit_retry_after = retry_after
            self.rate_limited = 0
            self._accepted.clear()

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()
            self.outage_until = 0.0
            self.rate_limit = None
            self.rate_limited = 0
            self._accepted.clear()

    def state(self) -> dict[str, Any]:
        remaining = max(0.0, self.outage_until - self.clock())
        return {
            "rules": [r.as_dict() for r in self.rules],
            "outage_remaining": round(remaining, 3),
            "outage_mode": self.outage_mode,
            "rate_limit": self.rate_limit,
            "rate_limit_window": self.rate_limit_window,
            "rate_limit_retry_after": self.rate_limit_retry_after,
            "rate_limited": self.rate_limited,
        }

    def decide(self, operation: str) -> Decision:
        decision = Decision()
        with self._lock:
            if self.clock() < self.outage_until:
                decision.action = "reset" if self.outage_mode == "reset" else "error"
                decision.status = 503
                decision.retry_after = max(1.0, round(self.outage_until - self.clock()))
                return decision
            if self.rate_limit is not None and operation not in ("token", "checkout_page"):
                now = self.clock()
                while self._accepted and self._accepted[0] <= now - self.rate_limit_window:
                    self._accepted.popleft()
                if len(self._accepted) >= self.rate_limit:
                    self.rate_limited += 1
                    decision.action = "error"
                    decision.status = 429
                    decision.retry_after = self.rate_limit_retry_after
                    return decision
                self._accepted.append(now)
            for rule in list(self.rules):
                if not rule.matches(operation):
                    continue
                decision.latency += rule.latency
                decision.ignore_paging = decision.ignore_paging or rule.ignore_paging
                decision.lose_first_answer = decision.lose_first_answer or rule.lose_first_answer
                if rule.ignore_paging and rule.count is None:
                    continue
                action = None if decision.action else rule.pick()
                if rule.count is not None:
                    rule.count -= 1
                    if rule.count <= 0:
                        self.rules.remove(rule)
                if action:
                    decision.action = action
                    decision.status = int(rule.status or 503)
                    decision.retry_after = rule.retry_after
                    decision.timeout_seconds = float(rule.timeout_seconds)
        return decision
