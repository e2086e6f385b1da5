"""System checks of the notice settings: known kinds, and ``SITE_URL`` when one is on."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, register

from ..conf import DEFAULTS, billing_settings
from ..exceptions import BillingConfigurationError

__all__ = ["check_notices"]


@register("billing")
def check_notices(app_configs: Any = None, **kwargs: Any) -> list:
    try:
        conf = billing_settings.as_dict()
    except BillingConfigurationError:
        return []  # reported by check_billing_settings
    notices = conf.get("NOTICES")
    known = set(DEFAULTS["NOTICES"])
    if not isinstance(notices, dict) or set(notices) - known:
        return [
            Error(
                f"BILLING['NOTICES'] must be a dict of notice kinds to True/False, not "
                f"{notices!r}.",
                hint=f"Known kinds: {', '.join(sorted(known))}.",
                id="billing_integration.E040",
            )
        ]
    site = conf.get("SITE_URL")
    on = sorted(kind for kind, value in notices.items() if value)
    if on and not (isinstance(site, str) and site.startswith(("https://", "http://"))):
        return [
            Error(
                f"BILLING['SITE_URL'] must be set when notices are on ({', '.join(on)}): "
                f"the emails link to the account page with an absolute URL.",
                hint='For example "https://app.example.com".',
                id="billing_integration.E041",
            )
        ]
    return []
