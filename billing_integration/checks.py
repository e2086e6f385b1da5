"""Django system checks for the billing configuration. They never query the database."""

from __future__ import annotations

import base64
import binascii
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

from .conf import DEFAULTS, REQUIRED, billing_settings
from .exceptions import BillingConfigurationError

URL_KEYS = ("BASE_URL", "AUTH_URL", "CHECKOUT_URL")


def _hint(key: str) -> str:
    env = REQUIRED.get(key)
    where = f" (the example project reads the environment variable {env})" if env else ""
    return f"Set BILLING['{key}'] in your settings{where}."


@register(Tags.security, "billing")
def check_billing_settings(app_configs: Any = None, **kwargs: Any) -> list:
    try:
        conf = billing_settings.as_dict()
    except BillingConfigurationError as exc:
        return [Error(str(exc), hint=f"Fix {exc.setting}.", id="billing_integration.E000")]

    errors: list = []
    for key in ("CLIENT_ID", "CLIENT_SECRET"):
        if not conf.get(key):
            errors.append(
                Error(
                    f"BILLING['{key}'] is not set.", hint=_hint(key), id="billing_integration.E001"
                )
            )
    for key in URL_KEYS:
        value = conf.get(key)
        if not value:
            errors.append(
                Error(
                    f"BILLING['{key}'] is not set.", hint=_hint(key), id="billing_integration.E002"
                )
            )
            continue
        parts = urlsplit(str(value))
        if (
            parts.scheme not in ("http", "https")
            or not parts.netloc
            or parts.query
            or parts.fragment
        ):
            errors.append(
                Error(
                    f"BILLING['{key}'] is not an absolute http(s) URL without query: {value!r}.",
                    hint=_hint(key),
                    id="billing_integration.E003",
                )
            )
        elif (
            parts.scheme == "http"
            and not settings.DEBUG
            and parts.hostname
            not in (
                "127.0.0.1",
                "localhost",
                "::1",
            )
        ):
            errors.append(
                Warning(
                    f"BILLING['{key}'] uses plain http outside DEBUG: {value!r}.",
                    hint="Use the service's https address in production.",
                    id="billing_integration.W003",
                )
            )

    secrets = conf.get("WEBHOOK_SECRET")
    secret_list = secrets if isinstance(secrets, (list, tuple)) else [secrets] if secrets else []
    for index, secret in enumerate(secret_list):
        if not _valid_whsec(secret):
            label = "BILLING['WEBHOOK_SECRET']" + (
                f"[{index}]" if isinstance(secrets, (list, tuple)) else ""
            )
            errors.append(
                Error(
                    f"{label} is not of the form 'whsec_<base64>'.",
                    hint="Copy the secret exactly as the service (or the sandbox) prints it "
                    "(environment variable BILLING_WEBHOOK_SECRET).",
                    id="billing_integration.E004",
                )
            )
    basic = conf.get("WEBHOOK_BASIC_AUTH")
    if basic and (not isinstance(basic, str) or ":" not in basic):
        errors.append(
            Error(
                "BILLING['WEBHOOK_BASIC_AUTH'] must be 'user:password'.",
                hint="Set it to the credentials you registered with the callback URL.",
                id="billing_integration.E005",
            )
        )
    verified = bool(secret_list) or bool(basic)
    if conf.get("WEBHOOK_ALLOW_UNVERIFIED"):
        errors.append(
            Warning(
                "BILLING['WEBHOOK_ALLOW_UNVERIFIED'] is True: unsigned event deliveries are "
                "accepted, so anyone who can reach the callback URL can forge billing events.",
                hint="Set BILLING['WEBHOOK_SECRET'] and drop WEBHOOK_ALLOW_UNVERIFIED.",
                id="billing_integration.W001",
            )
        )
    elif not verified and not settings.DEBUG:
        errors.append(
            Error(
                "Event callbacks cannot be verified: neither BILLING['WEBHOOK_SECRET'] nor "
                "BILLING['WEBHOOK_BASIC_AUTH'] is set, so every delivery will be refused.",
                hint="Set BILLING['WEBHOOK_SECRET'] (environment variable BILLING_WEBHOOK_SECRET).",
                id="billing_integration.E006",
            )
        )
    for key in ("PAGE_SIZE", "MAX_RETRIES", "CHECKOUT_EXPIRY", "WEBHOOK_TOLERANCE"):
        value = conf.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            errors.append(
                Error(
                    f"BILLING['{key}'] must be a non-negative integer, not {value!r}.",
                    hint=f"The default is {DEFAULTS[key]!r}.",
                    id="billing_integration.E007",
                )
            )
    active = conf.get("ACTIVE_STATUSES")
    if (
        not isinstance(active, (list, tuple))
        or not active
        or not all(isinstance(s, str) and s.strip() for s in active)
    ):
        errors.append(
            Error(
                "BILLING['ACTIVE_STATUSES'] must be a non-empty list or tuple of non-empty "
                f"strings, not {active!r}.",
                hint="The subscription statuses that grant access; the default is "
                f"{DEFAULTS['ACTIVE_STATUSES']!r}.",
                id="billing_integration.E008",
            )
        )
    return errors


def _valid_whsec(secret: Any) -> bool:
    if not isinstance(secret, str) or not secret.startswith("whsec_"):
        return False
    try:
        return len(base64.b64decode(secret[len("whsec_") :], validate=True)) >= 16
    except (binascii.Error, ValueError):
        return False
