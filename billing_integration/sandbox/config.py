"""The sandbox's own configuration, persisted in its store (credentials, secret, callback...)."""

from __future__ import annotations

import base64
import binascii
import secrets
import uuid
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .store import Store

DEFAULT_CLIENT_ID = "sandbox-client"
DEFAULT_CLIENT_SECRET = "sandbox-secret"
DEFAULT_CURRENCIES: dict[int, str] = {1: "XOF", 2: "USD", 3: "EUR", 4: "GHS", 5: "KES", 6: "NGN"}
#: The currency table of the ``currency_ids`` dialect: ISO 4217 numeric codes as the ids.
ISO_NUMERIC_CURRENCIES: dict[int, str] = {
    952: "XOF",
    840: "USD",
    978: "EUR",
    936: "GHS",
    404: "KES",
    566: "NGN",
}
#: Dialects: behaviours the interface allows that the app's guesses do not cover (docs/sandbox.md
#: "Dialects"; ``billing_probe`` reports each). Name -> what changes.
DIALECTS: dict[str, str] = {
    "no_paging": "list endpoints ignore limit and offset: everything in one answer",
    "currency_ids": "currency ids are ISO 4217 numbers (952 = XOF, 840 = USD, ...), not 1..6",
    "error_shape": 'error bodies are {"statusCode", "error", "message"}, not {"errors": [...]}',
    "events_upper": "event types are written SUBSCRIPTION_RENEWAL",
    "events_past": "event types are written subscription.renewed",
    "events_prefixed": "event types are written billing.subscription.renewal",
    "expires_in_ms": "the token's expires_in and refresh_expires_in are in milliseconds",
    "refuse_draft_archive": "a draft product cannot be archived (invalid_transition)",
}
#: The values of ``trial_end``: what the sandbox does when a trial ends.
TRIAL_END_BEHAVIOURS = ("renew", "lapse")
#: Namespace for the fixed account UUID of each client id.
ACCOUNT_NAMESPACE = uuid.UUID("5b0c3a52-6a55-4f43-9a43-2f6b8a1d7e01")


def account_for(client_id: str) -> str:
    """The fixed account UUID of a client (``user_created`` / ``user_updated``)."""
    return str(uuid.uuid5(ACCOUNT_NAMESPACE, client_id))


def new_webhook_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def valid_webhook_secret(value: Any) -> bool:
    """``whsec_`` and the base64 of at least 16 bytes (what the app's checks accept)."""
    if not isinstance(value, str) or not value.startswith("whsec_"):
        return False
    try:
        key = value[len("whsec_") :]
        # with or without its padding, as the Standard Webhooks libraries read it
        return len(base64.b64decode(key + "=" * (-len(key) % 4), validate=True)) >= 16
    except (binascii.Error, ValueError):
        return False


@dataclass
class SandboxConfig:
    client_id: str = DEFAULT_CLIENT_ID
    client_secret: str = DEFAULT_CLIENT_SECRET
    token_lifetime: int = 300  # seconds (expires_in)
    refresh_lifetime: int = 1800  # seconds (refresh_expires_in)
    webhook_secret: str = ""
    callback_url: str | None = None
    retry_schedule: list[float] = field(default_factory=lambda: [1.0, 5.0, 30.0, 120.0, 600.0])
    max_attempts: int = 6
    delivery_timeout: float = 5.0
    return_url: str | None = None
    checkout_expiry: int = 300  # seconds; default expires_at of a checkout session
    currencies: dict[int, str] = field(default_factory=lambda: dict(DEFAULT_CURRENCIES))
    dialects: list[str] = field(default_factory=list)  # names of DIALECTS

    def speaks(self, dialect: str) -> bool:
        """Whether the dialect ``dialect`` is switched on."""
        return dialect in self.dialects

    #: What a trial's end does (a guess: the interface does not say): ``"renew"`` bills the
    #: first period (``subscription.renewal``), or cancels when ``auto_renew`` is false
    #: (``subscription.canceled``); ``"lapse"`` ends it quietly (status ``expired``, no event).
    trial_end: str = "renew"
    #: Checkout ``action`` values accepted beside ``new_subscription`` (a plan change; none by
    #: default, as the interface documents none).
    change_actions: list[str] = field(default_factory=list)
    #: Whether ``PATCH /subscriptions/{id}`` exists (``auto_renew`` only); off by default.
    patch_subscriptions: bool = False

    @property
    def account(self) -> str:
        return account_for(self.client_id)

    def currency_code(self, currency_id: int) -> str | None:
        return self.currencies.get(currency_id)

    def currency_id(self, code: str) -> int | None:
        for cid, ccode in self.currencies.items():
            if ccode == code:
                return cid
        return None

    def as_dict(self) -> dict[str, Any]:
        """Every setting, the webhook secret included: what the store keeps."""
        data = asdict(self)
        data["currencies"] = {str(k): v for k, v in self.currencies.items()}
        data["account"] = self.account
        return data

    def public_dict(self) -> dict[str, Any]:
        """The settings the control endpoints answer: all but the webhook secret, which
        signs the deliveries the app trusts and is never answered over HTTP (it can be set)."""
        data = self.as_dict()
        del data["webhook_secret"]
        return data

    def update(self, values: dict[str, Any]) -> list[str]:
        """Apply known keys (``None`` values are ignored); returns unknown keys. A malformed
        ``webhook_secret`` raises ``ValueError`` (naming no value) and changes nothing."""
        known = {f.name for f in fields(self)}
        unknown = [k for k in values if k not in known]
        if "webhook_secret" in values and not valid_webhook_secret(values["webhook_secret"]):
            raise ValueError(
                "webhook_secret must be 'whsec_' followed by the base64 of at least 16 bytes."
            )
        if values.get("dialects") is not None:
            values = {**values, "dialects": self._dialects(values["dialects"])}
        for key, value in values.items():
            if key not in known:
                continue
            if key == "currencies" and value is not None:
                value = {int(k): str(v) for k, v in value.items()}
            if key == "trial_end" and value not in TRIAL_END_BEHAVIOURS:
                raise ValueError(f"trial_end must be one of {', '.join(TRIAL_END_BEHAVIOURS)}.")
            if key == "change_actions" and value is not None:
                if isinstance(value, str):
                    value = [a.strip() for a in value.split(",") if a.strip()]
                value = [str(a) for a in value]
            if key == "retry_schedule" and value is not None:
                if isinstance(value, str):
                    value = [float(x) for x in value.split(",") if x.strip()]
                value = [float(x) for x in value]
            setattr(self, key, value)
        return unknown

    def _dialects(self, value: Any) -> list[str]:
        """The dialect names of ``value`` (a list or a comma-separated string), checked; the
        currency table follows ``currency_ids`` unless ``currencies`` is set with it."""
        names = value.split(",") if isinstance(value, str) else list(value)
        names = [str(n).strip() for n in names if str(n).strip()]
        unknown = [n for n in names if n not in DIALECTS]
        if unknown:
            raise ValueError(
                f"unknown dialect(s) {', '.join(unknown)}; one of {', '.join(DIALECTS)}"
            )
        if "currency_ids" in names and "currency_ids" not in self.dialects:
            self.currencies = dict(ISO_NUMERIC_CURRENCIES)
        elif "currency_ids" not in names and self.currencies == ISO_NUMERIC_CURRENCIES:
            self.currencies = dict(DEFAULT_CURRENCIES)
        return names

    # -- persistence -----------------------------------------------------------------------
    @classmethod
    def load(cls, store: Store, overrides: dict[str, Any] | None = None) -> SandboxConfig:
        config = cls()
        stored = store.get_config("settings")
        if stored:
            stored.pop("account", None)
            config.update(stored)
        config.update({k: v for k, v in (overrides or {}).items() if v is not None})
        if not config.webhook_secret:
            config.webhook_secret = new_webhook_secret()
        config.save(store)
        return config

    def save(self, store: Store) -> None:
        store.set_config("settings", self.as_dict())
