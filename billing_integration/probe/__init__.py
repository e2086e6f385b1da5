"""``billing_probe``: checks each guess the app makes where the interface says "not shown"
against the configured service (docs/guesses.md). A guess is one small check function
registered with ``@check(name)`` (``write=True``: it creates objects, only with ``--write``);
it returns ``Finding``s, each ``confirmed``, ``contradicted`` (with what was seen) or
``unknown``. ``run_probe()`` runs them in order and keeps every raw answer, saved with the
secrets and tokens removed (``save_answers``)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.db import DatabaseError

from ..client import BillingClient, RawAnswer, RetryPolicy
from ..exceptions import BillingError, redact, without_secrets, without_user_info

CONFIRMED, CONTRADICTED, UNKNOWN = "confirmed", "contradicted", "unknown"
#: A finding's ``setting`` when no setting changes the guess.
NO_SETTING = "no setting"
#: Answer headers kept in the saved file (any other is left out).
KEPT_HEADERS = frozenset(
    {"content-type", "retry-after", "x-request-id", "x-idempotent-replay"}
    | {"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"}
)
#: An answer nested deeper than this is not kept (reading it would exhaust the stack).
MAX_DEPTH = 100


@dataclass
class Finding:
    """What the probe learned about one guess."""

    guess: str
    verdict: str  # CONFIRMED, CONTRADICTED or UNKNOWN
    assumed: str  # what the app assumes
    seen: str  # what the service answered
    setting: str = NO_SETTING  # the BILLING key that changes the guess, if one does
    #: The app depends on the guess: contradicted, the probe exits 1.
    relied_on: bool = True

    @property
    def breaks_the_app(self) -> bool:
        return self.verdict == CONTRADICTED and self.relied_on


def not_checked(guess: str, problem: Any) -> Finding:
    """The ``unknown`` finding of a check that could not run to its end."""
    return Finding(guess, UNKNOWN, "-", f"could not be checked: {problem}", relied_on=False)


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Probe], Iterable[Finding]]
    write: bool = False


#: Every check, in the order they run (registration order).
CHECKS: list[Check] = []


def check(name: str, *, write: bool = False) -> Callable[[Any], Any]:
    """Register a check function ``fn(probe) -> iterable of Finding`` under ``name``."""

    def register(fn: Callable[[Probe], Iterable[Finding]]) -> Callable[[Probe], Iterable[Finding]]:
        CHECKS[:] = [c for c in CHECKS if c.name != name]
        CHECKS.append(Check(name, fn, write))
        return fn

    return register


class Probe:
    """The state of one run: the client, the token, the raw answers, notes the checks share."""

    def __init__(self, client: BillingClient, *, write: bool = False) -> None:
        self.client = client
        self.write = write
        self.token: str | None = None
        self.answers: list[dict[str, Any]] = []
        self.findings: list[Finding] = []
        #: What one check leaves for a later one (the lists read, the objects created...).
        self.notes: dict[str, Any] = {}
        self._secrets: set[str] = set()

    def call(
        self,
        label: str,
        method: str,
        path: str,
        *,
        payload: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> RawAnswer:
        """One billing call with the probe's token, recorded."""
        answer = self.client.raw(
            method,
            path,
            token=self.token,
            payload=payload,
            params=params,
            idempotency_key=idempotency_key,
        )
        # The checks quote answers in their findings: an echoed token never reaches one.
        answer = replace(answer, body=self._without_secrets(_shallow(answer.body)))
        self._record(label, method, path, params, payload, answer)
        return answer

    def token_call(self) -> RawAnswer:
        """The token call, recorded; its tokens are kept out of the saved file."""
        answer = self.client.raw_token()
        answer = replace(answer, body=_shallow(answer.body))
        if isinstance(answer.body, dict):
            for key in ("access_token", "refresh_token", "id_token"):
                if isinstance(answer.body.get(key), str):
                    self._secrets.add(answer.body[key])
        form = {"grant_type": "client_credentials", "client_id": self.client.client_id}
        token_url = without_user_info(self.client.token_url)
        self._record("token", "POST", token_url, None, form, answer)
        return answer

    def _record(
        self,
        label: str,
        method: str,
        path: str,
        params: dict[str, Any] | None,
        payload: Any,
        answer: RawAnswer,
    ) -> None:
        headers = {k: v for k, v in answer.headers.items() if k in KEPT_HEADERS}
        entry: dict[str, Any] = {"label": label, "method": method, "path": path}
        entry.update(params=params, request=payload, status=answer.status)
        entry.update(headers=headers, body=answer.body)
        self.answers.append(entry)

    def scrubbed(self, value: Any) -> Any:
        """``value`` with secret-looking fields redacted and every secret string replaced."""
        return self._without_secrets(redact(value))

    def _without_secrets(self, value: Any) -> Any:
        """``value`` with every secret string (the tokens, the client secret) replaced."""
        return self.client.scrub(without_secrets(value, self._secrets))


def _shallow(body: Any) -> Any:
    """``body``, or a note in its place when it is nested deeper than ``MAX_DEPTH``."""
    pending = [(body, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict | list) and depth > MAX_DEPTH:
            return f"(an answer nested deeper than {MAX_DEPTH} levels: not kept)"
        if isinstance(value, dict):
            pending.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            pending.extend((v, depth + 1) for v in value)
    return body


@dataclass
class ProbeReport:
    findings: list[Finding]
    write: bool
    base_url: str
    answers: list[dict[str, Any]] = field(default_factory=list)
    checked_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def exit_code(self) -> int:
        """1 when a guess the app relies on is contradicted, else 0."""
        return 1 if any(f.breaks_the_app for f in self.findings) else 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "checked_at": self.checked_at.isoformat(),
            "base_url": self.base_url,
            "write": self.write,
            "exit_code": self.exit_code,
            "findings": [asdict(f) for f in self.findings],
        }


def run_probe(client: BillingClient | None = None, *, write: bool = False) -> ProbeReport:
    """Run every check (the ``write`` ones only with ``write``) against ``client`` (default:
    one for ``settings.BILLING``, no retries). A check that raises (a ``BillingError``, a
    ``DatabaseError``, or an error on an answer it did not expect) gives an ``unknown``."""
    from . import checks  # noqa: F401  (registers the built-in checks)

    client = client or BillingClient(retry=RetryPolicy(max_retries=0))
    probe = Probe(client, write=write)
    for entry in list(CHECKS):
        if entry.write and not write:
            continue
        try:
            probe.findings.extend(entry.run(probe))
        except (BillingError, DatabaseError) as exc:  # the service, or this project's tables
            probe.findings.append(not_checked(entry.name, exc))
        except Exception as exc:  # an answer of a shape (or depth) the check did not expect
            text = probe.scrubbed(f"{type(exc).__name__}: {exc}")[:200]
            probe.findings.append(not_checked(entry.name, f"an answer it did not expect ({text})"))
    answers = probe.scrubbed(probe.answers)
    return ProbeReport(probe.findings, write, without_user_info(client.base_url), answers)


#: The mode of the answers file the probe creates: read and write for its owner only.
PRIVATE = 0o600


def save_answers(report: ProbeReport, path: Path) -> Path:
    """Write the report and its raw answers (secrets and tokens removed) to ``path``; a file
    it creates is readable by its owner only (``PRIVATE``): the answers hold a page of the
    service's customers."""
    document = {**report.as_dict(), "answers": report.answers}
    with open(
        os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE), "w", encoding="utf-8"
    ) as f:
        f.write(json.dumps(document, indent=2, default=str) + "\n")
    return path


def default_output() -> Path:
    """``billing-probe-<UTC time>.json`` in the current directory."""
    return Path.cwd() / f"billing-probe-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
