"""The one place the app reads its configuration: ``settings.BILLING`` over ``DEFAULTS``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.cache import BaseCache, caches
from django.core.signals import setting_changed

from .exceptions import BillingConfigurationError

#: Keys without a default, with the environment variable the example project reads each from.
_REQUIRED_KEYS = ("BASE_URL", "AUTH_URL", "CHECKOUT_URL", "CLIENT_ID", "CLIENT_SECRET")
REQUIRED: dict[str, str] = {key: f"BILLING_{key}" for key in _REQUIRED_KEYS}

#: Every key and its default, grouped by the ``# --- group ---`` comments (docs/settings.md).
DEFAULTS: dict[str, Any] = {
    # --- service ---
    "BASE_URL": None,
    "AUTH_URL": None,
    "CHECKOUT_URL": None,
    "REALM": "sandbox",
    "CLIENT_ID": None,
    "CLIENT_SECRET": None,
    "CURRENCIES": {1: "XOF", 2: "USD", 3: "EUR", 4: "GHS", 5: "KES", 6: "NGN"},
    "GUESSES": {},
    # --- webhooks ---
    "WEBHOOK_SECRET": None,
    "WEBHOOK_BASIC_AUTH": None,
    "WEBHOOK_ALLOW_UNVERIFIED": False,
    "EVENT_TYPE_ALIASES": {},
    # --- access ---
    "SUBSCRIBER_MODEL": None,
    "SUBSCRIBER_RESOLVER": None,
    "ACTIVE_STATUSES": ("published",),
    "PRICING_URL": "/",
    "ACCESS_AFTER_CANCEL": "period_end",
    # --- checkout and pages ---
    "CUSTOMER_FIELDS": "billing_integration.customers.default_fields",
    "CHECKOUT_EXPIRY": 300,
    "INTERACTIVE_DEADLINE": 8.0,
    "BASE_TEMPLATE": "billing_integration/base.html",
    "TRIALS": {"repeat": False, "notice_days": 3},
    # --- notices ---
    "NOTICES": dict.fromkeys(
        (
            *("payment_failed", "subscription_canceled", "subscription_paused"),
            *("refund_approved", "trial_ending"),
        ),
        False,
    ),
    "SITE_URL": "",
    # --- workers ---
    "CACHE": "default",
}


def _constant(module: str, *keys: str) -> dict[str, str]:
    return dict.fromkeys(keys, f"it is a constant now ({module})")


_PUSH_TASKS = "remove it: pushes are one Celery task per change, swept by beat"
_CONCURRENCY = "run more Celery worker processes or threads"
_ROUTE = (
    "route the app's tasks with Celery: "
    "CELERY_TASK_ROUTES = {'billing_integration.*': {'queue': 'billing'}}"
)
#: Keys that were removed, and what to do instead. The README's "Upgrading" section lists them.
REMOVED: dict[str, str] = {
    **_constant(
        "billing_integration.client",
        *("CONNECT_TIMEOUT", "READ_TIMEOUT", "MAX_RETRIES", "BACKOFF_BASE", "BACKOFF_MAX"),
        *("RETRY_AFTER_MAX", "TOKEN_REFRESH_RATIO", "TOKEN_LOCK_TIMEOUT", "PAGE_SIZE"),
        *("MAX_PAGES", "BACKOFF_REFRESH"),
    ),
    **_constant(
        "billing_integration.outbox",
        *("OUTBOX_MAX_ATTEMPTS", "OUTBOX_RETRY_BASE", "OUTBOX_RETRY_MAX", "OUTBOX_STALE_AFTER"),
        *("OUTBOX_LEASE", "OUTBOX_REQUEUE_BATCH"),
    ),
    "OUTBOX_DEFER_DELAY": "remove it: a push waiting behind an older one of its object is "
    "enqueued when that one is settled",
    **_constant("300 s, the Standard Webhooks default", "WEBHOOK_TOLERANCE"),
    **_constant("billing_integration.webhooks", "WEBHOOK_MAX_ATTEMPTS"),
    **_constant("billing_integration.notices", "NOTICE_MAX_ATTEMPTS"),
    **dict.fromkeys(("TOKEN_CACHE", "BACKOFF_CACHE", "KICK_CACHE"), "use BILLING['CACHE']"),
    **dict.fromkeys(("OUTBOX_DRAIN_BATCH", "OUTBOX_PUSH_MAX_ENTRIES"), _PUSH_TASKS),
    **dict.fromkeys(("OUTBOX_DRAIN_SECONDS", "OUTBOX_CLAIM_BATCH"), _PUSH_TASKS),
    **dict.fromkeys(("WEBHOOK_PROCESS_RUNS", "OUTBOX_PUSH_RUNS"), _CONCURRENCY),
    "SHARED_BACKOFF": "every process always backs off together, through BILLING['CACHE']",
    "BACKOFF_FAILURE_RUN": "the shared back-off no longer counts failures in a row",
    "PACE_DOUBLING": "the shared 429 pace is gone; a Retry-After pauses every process",
    "WEBHOOK_PROCESS_INLINE": "set Celery's task_always_eager (CELERY_TASK_ALWAYS_EAGER) "
    "to process events in the request",
    "EVENT_HANDLERS": "register your EventHandler subclass with the @handler(...) decorator "
    "(see docs/events.md)",
    "WEBHOOK_DRAIN_SECONDS": "event drain runs are gone: one Celery task processes an event",
    "WEBHOOK_KICK_WINDOW": "wake-ups are gone: every event enqueues its Celery task",
    "CUSTOMER_IDENTIFIER": "use BILLING['CUSTOMER_FIELDS']: its callable returns identifier, "
    "first_name, last_name and email",
    "SUBSCRIPTION_REQUIRED_URL": "use BILLING['PRICING_URL']",
    "ACCOUNT_URL": "the app's billing page (billing_integration:account) is linked; "
    "route it where you want it",
    "MULTIPLE_PURCHASE_PRODUCTS": "tick the product's 'multiple purchases' (may be bought "
    "again while held: Product.multiple_purchases) in the admin",
    "OUTBOX_QUEUE": _ROUTE,
    "QUEUE": _ROUTE,
    "EVENT_RETENTION": "set the age in the kwargs of the 'billing-prune-events' entry of "
    "CELERY_BEAT_SCHEDULE ({'older_than': '90d'}; remove the entry to keep every delivery); "
    "the billing_prune_events command takes --older-than",
    "OUTBOX_PUSH_CONCURRENCY": f"{_CONCURRENCY} (celery -A proj worker --concurrency N)",
    "KICK_TTL": "wake-ups are gone: every change enqueues its Celery task",
    "NOTICE_FROM_EMAIL": "notices are sent from settings.DEFAULT_FROM_EMAIL",
    "NOTICE_RECIPIENT": "notices go to the customer's email, else the subscriber's email",
    "SUBSCRIPTION_CURRENCY_FORM": "use BILLING['GUESSES']['subscription_currency_form']",
    "INACTIVE_STATUSES": "only the statuses in BILLING['ACTIVE_STATUSES'] grant access "
    "(default ('published',))",
    **dict.fromkeys(
        ("CHECKOUT_MAX_RETRIES", "CHECKOUT_RETRY_AFTER_MAX"), "use BILLING['INTERACTIVE_DEADLINE']"
    ),
}

#: The guesses about the service beyond its interface (``BILLING['GUESSES']``), their
#: defaults and the values each accepts (``None`` in a tuple: switched off).
GUESS_DEFAULTS: dict[str, Any] = {
    "subscription_currency_form": "code",
    "change_plan_action": None,
    "change_plan_target": "subscription",
    "patch_auto_renew": False,
}
GUESS_CHOICES: dict[str, tuple[Any, ...]] = {
    "subscription_currency_form": ("code", "id"),
    "change_plan_target": ("subscription", "product"),
    "patch_auto_renew": (True, False),
}

#: One line per key of ``DEFAULTS``: what it means (the settings reference shows it).
DOCS: dict[str, str] = {
    "BASE_URL": "The service's address: billing paths are `{BASE_URL}/v1/api/billing/...`.",
    "AUTH_URL": "The token server: tokens come from "
    "`{AUTH_URL}/realms/{REALM}/protocol/openid-connect/token`.",
    "CHECKOUT_URL": "Customers are sent to `{CHECKOUT_URL}/checkout/<session_id>`.",
    "REALM": "The realm in the token path (`sandbox` is the service's test mode).",
    "CLIENT_ID": "The client id of the client-credentials pair.",
    "CLIENT_SECRET": "The client secret of the client-credentials pair (never logged).",
    "CURRENCIES": "The service's integer currency ids and their ISO codes (the interface does "
    "not publish the table: set yours).",
    "GUESSES": "What the app guesses about the service beyond its interface (see "
    '[](changes.md)): `subscription_currency_form` (`"code"` sends `selected_currency` as '
    '`"XOF"`, `"id"` as `"1"`), `change_plan_action` (`None`: off, or the checkout `action` of '
    'a plan change, e.g. `"upgrade"`), `change_plan_target` (`"subscription"` or `"product"`: '
    "what `upgrade_to`/`downgrade_to` hold), `patch_auto_renew` (`True`: stop and resume "
    "renewal with `PATCH /subscriptions/{id}`).",
    "WEBHOOK_SECRET": '`"whsec_<base64>"`, or a list of them while rotating (any one verifies).',
    "WEBHOOK_BASIC_AUTH": '`"user:password"`: HTTP basic auth on the callback URL (no signature).',
    "WEBHOOK_ALLOW_UNVERIFIED": "With neither `WEBHOOK_SECRET` nor `WEBHOOK_BASIC_AUTH` set, "
    "accept deliveries unverified (check `W001` warns, each one is logged). Never in production. "
    "`True` or `False` only (`E000` otherwise).",
    "EVENT_TYPE_ALIASES": "Extra spellings of event types, mapped to a canonical type.",
    "SUBSCRIBER_MODEL": "What a customer belongs to; `None` means `AUTH_USER_MODEL`. Set it "
    "before the first `migrate`.",
    "SUBSCRIBER_RESOLVER": "Dotted path of a callable(request) -> subscriber or `None`; `None` "
    "means `request.user`.",
    "ACTIVE_STATUSES": "Subscription statuses that grant access (compared stripped and "
    "lower-cased); any other grants none. The interface shows only `published`; add e.g. "
    '`"trialing"` if your service sends more.',
    "PRICING_URL": "Where a person without the needed plan is sent to choose one (a URL name "
    "or a path; `?next=` and `&feature=` are added).",
    "ACCESS_AFTER_CANCEL": '`"period_end"`: a canceled subscription grants access until its '
    '`cycle_end_date` (when known and in the future); `"immediately"`: a cancel ends access at '
    "once. A paused subscription or an unknown status grants nothing either way.",
    "CUSTOMER_FIELDS": "Dotted path of a callable(subscriber) -> the customer's `identifier`, "
    "`first_name`, `last_name` and `email`.",
    "CHECKOUT_EXPIRY": "Seconds a checkout session stays open (sent as `expires_at`).",
    "INTERACTIVE_DEADLINE": "Seconds a request a person waits on (checkout, a trial, the return "
    "page) may spend on the service in all, retries and waits included.",
    "BASE_TEMPLATE": "The template the app's pages extend; it must define the blocks `title` "
    'and `content` (the example project sets `"base.html"`).',
    "TRIALS": '`"repeat"`: whether a subscriber may start a second trial of a product they '
    'already had one of (`False`); `"notice_days"`: days before a trial ends that the '
    "`trial_ending` notice is sent (`3`). A key left out keeps its default.",
    "NOTICES": "Each notice email on (`True`) or off: `payment_failed`, `subscription_canceled`, "
    "`subscription_paused`, `refund_approved`, `trial_ending`; opt-in (all off).",
    "SITE_URL": "The site's absolute base (`https://app.example.com`) for links in the notices; "
    "required (a system check) when a notice is on.",
    "CACHE": "The Django cache alias of everything the processes share (the token, the "
    "back-off window, dedup keys): in production one every process reaches, not `LocMemCache`.",
}


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _text_or_none(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _aliases(value: Any) -> bool:
    return value is None or (
        isinstance(value, dict) and all(_text(k) and _text(v) for k, v in value.items())
    )


def _code(value: Any) -> str:
    """A currency code of ``CURRENCIES``: a non-empty string (``str(None)`` is no code)."""
    if not _text(value):
        raise ValueError(value)
    return str(value)


EXPIRY = "a non-negative integer"
DEADLINE = "a positive number of seconds"


def expiry_ok(value: Any) -> bool:
    """``CHECKOUT_EXPIRY``: a non-negative integer (check E007; -1 opens expired sessions)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def deadline_ok(value: Any) -> bool:
    """``INTERACTIVE_DEADLINE``: a positive number (check E014; 0 fails every checkout)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def refuse(key: str, value: Any, what: str) -> BillingConfigurationError:
    """The error for ``BILLING[key]`` holding ``value`` where ``what`` is needed (the client
    secret's value is never shown)."""
    shown = type(value).__name__ if key == "CLIENT_SECRET" else repr(value)
    text = f"BILLING[{key!r}] must be {what}, not {shown}."
    return BillingConfigurationError(text, setting=f"BILLING['{key}']")


def checked(key: str, ok: Callable[[Any], bool], what: str) -> Any:
    """``BILLING[key]``, refused (``BillingConfigurationError`` naming it) unless ``ok``: for the
    keys whose system check (not E000) reports a bad value, where checks do not run."""
    value = getattr(billing_settings, key)
    if not ok(value):
        raise refuse(key, value, what)
    return value


#: Keys whose value must have a shape: a test of the value, and what it must be (E000 else).
#: The other keys are checked by their own system checks (checks.py).
_SHAPES: dict[str, tuple[Any, str]] = {
    # "" or "a/b" would request tokens from another path than the realm's.
    "REALM": (
        lambda v: _text(v) and v == v.strip() and "/" not in v,
        "the realm's name, such as 'sandbox' (no '/' nor spaces)",
    ),
    "CLIENT_ID": (_text_or_none, "a string"),
    "CLIENT_SECRET": (_text_or_none, "a string"),
    "SUBSCRIBER_MODEL": (
        lambda v: v is None or (isinstance(v, str) and v.count(".") == 1 and v.strip() == v),
        "None or a model's 'app_label.ModelName'",
    ),
    "EVENT_TYPE_ALIASES": (_aliases, "a dict of event type spellings to event types (strings)"),
    "PRICING_URL": (_text_or_none, "a URL name or a path (a string)"),
    "BASE_TEMPLATE": (_text_or_none, "a template name (a string)"),
    "SITE_URL": (_text_or_none, "the site's absolute base URL (a string)"),
    "CACHE": (_text, "the alias of a cache in settings.CACHES, such as 'default'"),
    # the text "False" (read from the environment without cast=bool) is true
    "WEBHOOK_ALLOW_UNVERIFIED": (lambda v: isinstance(v, bool), "True or False"),
}


class BillingSettings:
    """Attribute access to ``settings.BILLING`` merged over ``DEFAULTS``."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        if self._cache is None:
            user = getattr(settings, "BILLING", None)
            if user is None:
                user = {}
            if not isinstance(user, dict):
                raise BillingConfigurationError(
                    f"settings.BILLING must be a dict, not {type(user).__name__}.",
                    setting="BILLING",
                )
            for key in sorted(user):
                setting = f"BILLING['{key}']"
                if key in REMOVED:
                    text = f"BILLING[{key!r}] was removed: {REMOVED[key]}."
                    raise BillingConfigurationError(text, setting=setting)
                if key not in DEFAULTS:
                    text = f"Unknown key BILLING[{key!r}]. Known keys: {', '.join(DEFAULTS)}."
                    raise BillingConfigurationError(text, setting=setting)
            merged = {**DEFAULTS, **user}
            for key, (ok, what) in _SHAPES.items():
                if not ok(merged[key]):
                    raise refuse(key, merged[key], what)
            if merged["SUBSCRIBER_MODEL"] is None:
                merged["SUBSCRIBER_MODEL"] = settings.AUTH_USER_MODEL
            table = merged["CURRENCIES"]
            try:
                merged["CURRENCIES"] = {int(k): _code(v) for k, v in table.items()}
                if not merged["CURRENCIES"]:  # every checkout and price would be refused
                    raise ValueError(table)
            except (AttributeError, TypeError, ValueError):
                raise BillingConfigurationError(
                    "BILLING['CURRENCIES'] must be a dict of the service's integer currency ids "
                    f"to ISO codes, such as {{1: 'XOF'}}, not {table!r}.",
                    setting="BILLING['CURRENCIES']",
                ) from None
            self._cache = merged
        return self._cache

    def get(self, key: str) -> Any:
        return self.as_dict()[key]

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_") or key not in DEFAULTS:
            raise AttributeError(f"No billing setting {key!r}")
        value = self.as_dict()[key]
        if key in REQUIRED and not value:
            raise BillingConfigurationError(
                f"Set BILLING[{key!r}] in your Django settings "
                f"(the example project reads it from the environment variable {REQUIRED[key]}).",
                setting=f"BILLING['{key}']",
            )
        return value

    def reload(self) -> None:
        self._cache = None


billing_settings = BillingSettings()


def guesses() -> dict[str, Any]:
    """``BILLING['GUESSES']`` over ``GUESS_DEFAULTS``; a bad key or value raises, naming it."""
    given = billing_settings.GUESSES
    if not isinstance(given, dict):
        raise BillingConfigurationError(
            f"BILLING['GUESSES'] must be a dict, not {type(given).__name__}.",
            setting="BILLING['GUESSES']",
        )
    for key, value in given.items():
        name = f"BILLING['GUESSES'][{key!r}]"
        if key not in GUESS_DEFAULTS:
            known = ", ".join(GUESS_DEFAULTS)
            raise BillingConfigurationError(f"Unknown key {name}. Known: {known}.", setting=name)
        choices = GUESS_CHOICES.get(key)
        if choices is not None and (value not in choices or type(value) is int):
            allowed = " or ".join(repr(c) for c in choices)
            text = f"{name} must be {allowed}, not {value!r}."
            raise BillingConfigurationError(text, setting=name)
        if key == "change_plan_action" and not (
            value is None or (isinstance(value, str) and value.strip())
        ):
            raise BillingConfigurationError(
                f"{name} must be None or a non-empty string, not {value!r}.", setting=name
            )
    return {**GUESS_DEFAULTS, **given}


def shared_cache() -> BaseCache:
    """The Django cache every process shares (``BILLING['CACHE']``); an alias not in
    ``CACHES`` raises naming the key (check E023), not Django's "connection doesn't exist"."""
    alias = billing_settings.CACHE
    if alias not in settings.CACHES:
        raise BillingConfigurationError(
            f"BILLING['CACHE'] names the cache {alias!r}, which is not in settings.CACHES.",
            setting="BILLING['CACHE']",
        )
    return caches[alias]


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting in ("BILLING", "AUTH_USER_MODEL"):
        billing_settings.reload()


setting_changed.connect(_reload)
