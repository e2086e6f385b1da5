"""The one place the app reads its configuration.

Everything lives in a single ``BILLING`` dict in Django settings; every key has a default
(``DEFAULTS``) or is required. A missing required key raises ``BillingConfigurationError``
naming the exact key to set and, for the connection keys, the environment variable the
example project reads it from.

    from billing_integration.conf import billing_settings
    billing_settings.BASE_URL
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

from .exceptions import BillingConfigurationError

#: Keys that have no sensible default and must be set, with the environment name the
#: example project (and the sandbox's printout) uses for them.
REQUIRED: dict[str, str] = {
    "BASE_URL": "BILLING_BASE_URL",
    "AUTH_URL": "BILLING_AUTH_URL",
    "CHECKOUT_URL": "BILLING_CHECKOUT_URL",
    "CLIENT_ID": "BILLING_CLIENT_ID",
    "CLIENT_SECRET": "BILLING_CLIENT_SECRET",
}

#: The documented defaults. docs/settings.md lists each with its meaning (DOCS).
DEFAULTS: dict[str, Any] = {
    # --- connection -------------------------------------------------------------------
    "BASE_URL": None,  # billing paths are {BASE_URL}/v1/api/billing/...
    "AUTH_URL": None,  # token at {AUTH_URL}/realms/{REALM}/protocol/openid-connect/token
    "CHECKOUT_URL": None,  # customers are sent to {CHECKOUT_URL}/checkout/<session_id>
    "REALM": "sandbox",
    "CLIENT_ID": None,
    "CLIENT_SECRET": None,
    "CONNECT_TIMEOUT": 5.0,  # seconds
    "READ_TIMEOUT": 30.0,  # seconds
    # --- retries (5xx, 429, timeouts, connection errors; never other 4xx) -------------
    "MAX_RETRIES": 4,  # retries after the first attempt
    "BACKOFF_BASE": 0.5,  # seconds; attempt n waits up to BASE * 2**n (full jitter)
    "BACKOFF_MAX": 20.0,  # cap of one computed backoff wait
    "RETRY_AFTER_MAX": 60.0,  # cap of an honoured Retry-After
    # --- tokens -------------------------------------------------------------------------
    "TOKEN_REFRESH_RATIO": 0.8,  # refresh once 80% of expires_in has passed
    "TOKEN_CACHE": "default",  # Django cache alias shared by all processes
    "TOKEN_LOCK_TIMEOUT": 10.0,  # seconds one process may hold the fetch lock
    # --- lists --------------------------------------------------------------------------
    "PAGE_SIZE": 100,  # limit= of list calls
    "MAX_PAGES": 100_000,  # hard stop for a server that never ends a list
    # --- currencies: the service's integer ids <-> ISO codes --------------------------
    "CURRENCIES": {1: "XOF", 2: "USD", 3: "EUR", 4: "GHS", 5: "KES", 6: "NGN"},
    # POST /subscriptions' selected_currency: "code" ("XOF") or "id" (the id as a string, "1")
    "SUBSCRIPTION_CURRENCY_FORM": "code",
    # --- webhooks -------------------------------------------------------------------------
    "WEBHOOK_SECRET": None,  # "whsec_<base64>", or a list of them during rotation
    "WEBHOOK_BASIC_AUTH": None,  # "user:password" as an alternative to signatures
    "WEBHOOK_ALLOW_UNVERIFIED": False,  # accept unsigned deliveries (a check warns)
    "WEBHOOK_TOLERANCE": 300,  # seconds of clock skew accepted on webhook-timestamp
    "WEBHOOK_PROCESS_INLINE": False,  # process events in the request instead of Celery
    "EVENT_TYPE_ALIASES": {},  # extra spellings -> canonical event type
    "EVENT_HANDLERS": {},  # canonical type -> dotted path of an EventHandler subclass
    "WEBHOOK_MAX_ATTEMPTS": 5,  # processing attempts of an event (transient errors) before failed
    # --- customers and checkout -----------------------------------------------------------
    "SUBSCRIBER_MODEL": None,  # default: settings.AUTH_USER_MODEL
    "CUSTOMER_IDENTIFIER": "billing_integration.customers.default_identifier",
    "CUSTOMER_FIELDS": "billing_integration.customers.default_fields",
    "CHECKOUT_EXPIRY": 300,  # seconds; the service's own default is 5 minutes
    # where access checks send non-subscribers: a URL name ("pricing") or a path; "?next=" added
    "SUBSCRIPTION_REQUIRED_URL": "/",
    # dotted path of a callable(request) -> subscriber (a team, an organisation) or None;
    # None here means request.user (anonymous: no subscriber)
    "SUBSCRIBER_RESOLVER": None,
    # seconds a request a person waits on (checkout, the return page) may spend on the
    # service in all: attempts, retries and the waits between them; background work keeps
    # MAX_RETRIES / RETRY_AFTER_MAX
    "INTERACTIVE_DEADLINE": 8.0,
    # products a subscriber may buy again while holding an active subscription to them
    # (names or remote ids); any other product is refused a second purchase (409)
    "MULTIPLE_PURCHASE_PRODUCTS": [],
    # the subscriber's billing page (a URL name or a path), linked from the "you already
    # have this plan" page and the return page; default: the app's own billing page
    "ACCOUNT_URL": "billing_integration:account",
    # subscription statuses that grant access (an allow-list: any other status, unknown
    # ones included, grants none); compared stripped and lower-cased
    "ACTIVE_STATUSES": ("published",),
    # --- outbox -----------------------------------------------------------------------------
    "OUTBOX_MAX_ATTEMPTS": 8,
    "OUTBOX_RETRY_BASE": 2.0,  # seconds; task retry n waits BASE * 2**n (capped below)
    "OUTBOX_RETRY_MAX": 300.0,  # keep below the broker's visibility timeout
    "OUTBOX_STALE_AFTER": 60.0,  # the beat drain picks up entries older than this
    # seconds a worker's claim on an entry holds before another may take it over (a killed
    # worker); keep above the longest single push including the client's own retries
    "OUTBOX_LEASE": 300.0,
    # deprecated (one release): when set, the value of both OUTBOX_PUSH_MAX_ENTRIES and
    # OUTBOX_REQUEUE_BATCH that are not set themselves
    "OUTBOX_DRAIN_BATCH": None,
    "OUTBOX_DEFER_DELAY": 2.0,  # seconds before a push waiting behind another retries
    "OUTBOX_QUEUE": None,  # Celery queue of the push tasks; None = the default queue
    # --- wake-ups: a commit kicks a drain task once per burst (billing_integration.wakeup) ---
    "KICK_TTL": 30.0,  # seconds a pending wake-up suppresses further kicks (a lost message)
    "KICK_CACHE": None,  # Django cache alias shared by all processes; None = TOKEN_CACHE
    "OUTBOX_DRAIN_SECONDS": 20.0,  # one drain task run pushes this long, then kicks itself
    "OUTBOX_CLAIM_BATCH": 100,  # due entries a push run claims at a time, at least
    "OUTBOX_PUSH_CONCURRENCY": 4,  # calls in flight at once in one push run (threads)
    "OUTBOX_PUSH_RUNS": 4,  # push runs at once over the workers when a burst is due
    "WEBHOOK_DRAIN_SECONDS": 20.0,  # one event drain run processes this long, then kicks itself
    # seconds a web process that saw the event drain's wake-up pending skips the cache for
    # further kicks; the drain lingers this long (+ a margin) after clearing. 0 = off
    "WEBHOOK_KICK_WINDOW": 0.25,
    # event drain runs at a time, each on its share of the objects (the events of one object
    # stay in order); 1 = one run processes every event
    "WEBHOOK_PROCESS_RUNS": 4,
    "OUTBOX_PUSH_MAX_ENTRIES": 1000,  # entries one push run (a kick) attempts, then kicks itself
    "OUTBOX_REQUEUE_BATCH": 1000,  # stale entries one periodic sweep re-enqueues at most
    # --- pages (what people see) ------------------------------------------------------------
    # the template the app's pages (checkout return and errors, the billing page) extend; it
    # defines the blocks "title" and "content"
    "BASE_TEMPLATE": "billing_integration/base.html",
    # where a customer whose subscription lapsed is sent to choose a plan again (a URL name
    # or a path); None = SUBSCRIPTION_REQUIRED_URL
    "PRICING_URL": None,
    # --- notices: opt-in emails when money moves (billing_integration.notices) ----------------
    # each notice on (True) or off; keys left out stay off
    "NOTICES": {
        "payment_failed": False,
        "subscription_canceled": False,
        "subscription_paused": False,
        "refund_approved": False,
    },
    "NOTICE_FROM_EMAIL": None,  # None = settings.DEFAULT_FROM_EMAIL
    # dotted path of a callable(customer, subscriber) -> email or None; None = the customer's
    # email, else the subscriber's ``email`` attribute
    "NOTICE_RECIPIENT": None,
    # the site's absolute base ("https://app.example.com") for links in emails; required when
    # a notice is on
    "SITE_URL": "",
    "NOTICE_MAX_ATTEMPTS": 5,  # sending attempts of one notice (the task retries) before failed
    # --- backing off together (billing_integration.client.backoff) ----------------------
    "SHARED_BACKOFF": True,  # a 429/5xx/outage seen by one process pauses every process
    "BACKOFF_CACHE": None,  # Django cache alias of the shared window; None = KICK_CACHE
    "BACKOFF_REFRESH": 0.5,  # seconds a process trusts its copy: how late it learns of one
    "BACKOFF_FAILURE_RUN": 3,  # failures in a row (no Retry-After) that pause every process
    "PACE_DOUBLING": 5.0,  # seconds: after a 429 the shared pace doubles this often; 0 = none
    # --- event log retention (billing_integration.webhooks.prune) ------------------------------
    # finished deliveries (processed, ignored, failed, rejected) older than this are deleted by
    # the daily beat task: "90d", "12h", "30m" or seconds; None keeps every delivery
    "EVENT_RETENTION": "90d",
    # --- workers -----------------------------------------------------------------------
    "CACHE": "default",  # the Django cache alias of everything shared across processes
    "QUEUE": None,  # the Celery queue of the app's tasks; None = the default queue
}


class BillingSettings:
    """Attribute access to ``settings.BILLING`` merged over ``DEFAULTS``."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None

    @property
    def user_settings(self) -> dict[str, Any]:
        value = getattr(settings, "BILLING", None) or {}
        if not isinstance(value, dict):
            raise BillingConfigurationError("settings.BILLING must be a dict.", setting="BILLING")
        return value

    def as_dict(self) -> dict[str, Any]:
        if self._cache is None:
            unknown = sorted(set(self.user_settings) - set(DEFAULTS))
            if unknown:
                raise BillingConfigurationError(
                    f"Unknown key(s) in settings.BILLING: {', '.join(unknown)}. "
                    f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                    setting="BILLING",
                )
            merged = {**DEFAULTS, **self.user_settings}
            if merged["SUBSCRIBER_MODEL"] is None:
                merged["SUBSCRIBER_MODEL"] = settings.AUTH_USER_MODEL
            merged["CURRENCIES"] = {int(k): str(v) for k, v in merged["CURRENCIES"].items()}
            if merged["OUTBOX_DRAIN_BATCH"] is not None:  # the deprecated name of both
                for key in ("OUTBOX_PUSH_MAX_ENTRIES", "OUTBOX_REQUEUE_BATCH"):
                    if key not in self.user_settings:
                        merged[key] = merged["OUTBOX_DRAIN_BATCH"]
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

    # Currency mapping -------------------------------------------------------------------
    def currency_code(self, currency_id: int | str) -> str:
        """The ISO code for one of the service's integer currency ids."""
        try:
            return self.as_dict()["CURRENCIES"][int(currency_id)]
        except (KeyError, ValueError, TypeError):
            raise BillingConfigurationError(
                f"Currency id {currency_id!r} is not in BILLING['CURRENCIES'].",
                setting="BILLING['CURRENCIES']",
            ) from None

    def currency_id(self, code: str) -> int:
        """The service's integer id for an ISO currency code."""
        for cid, ccode in self.as_dict()["CURRENCIES"].items():
            if ccode.upper() == str(code).upper():
                return cid
        raise BillingConfigurationError(
            f"Currency code {code!r} is not in BILLING['CURRENCIES'].",
            setting="BILLING['CURRENCIES']",
        )


billing_settings = BillingSettings()


def shared_cache() -> Any:
    """The Django cache that every process shares (``BILLING['CACHE']``): the token, the
    backoff window, the "once" keys."""
    from django.core.cache import caches

    return caches[billing_settings.CACHE]


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting in ("BILLING", "AUTH_USER_MODEL"):
        billing_settings.reload()


setting_changed.connect(_reload)

#: One line per key of ``DEFAULTS``: what it means. The documentation's settings reference
#: (``docs/settings.md``) is generated from ``DEFAULTS``, ``REQUIRED`` and this dict, and a test
#: fails when a key has no description here. Markdown (inline code) is allowed.
DOCS: dict[str, str] = {
    "BASE_URL": "The service's address: billing paths are `{BASE_URL}/v1/api/billing/...`.",
    "AUTH_URL": "The token server: tokens come from "
    "`{AUTH_URL}/realms/{REALM}/protocol/openid-connect/token`.",
    "CHECKOUT_URL": "Customers are sent to `{CHECKOUT_URL}/checkout/<session_id>`.",
    "REALM": "The realm in the token path (`sandbox` is the service's test mode).",
    "CLIENT_ID": "The client id of the client-credentials pair.",
    "CLIENT_SECRET": "The client secret of the client-credentials pair (never logged).",
    "CONNECT_TIMEOUT": "Seconds to wait for a connection to the service, on every request.",
    "READ_TIMEOUT": "Seconds to wait for the service's answer, on every request.",
    "MAX_RETRIES": "Retries after the first attempt (5xx, 429, timeouts and connection errors; "
    "never another 4xx).",
    "BACKOFF_BASE": "Seconds: retry *n* waits a random time up to "
    "`min(BACKOFF_MAX, BACKOFF_BASE * 2**n)` (full jitter).",
    "BACKOFF_MAX": "Seconds: the cap of one computed backoff wait.",
    "RETRY_AFTER_MAX": "Seconds: an honoured `Retry-After` is capped at this.",
    "TOKEN_REFRESH_RATIO": "A new token is fetched once this share of `expires_in` has passed.",
    "TOKEN_CACHE": "The Django cache alias through which all processes share one token.",
    "TOKEN_LOCK_TIMEOUT": 'Seconds one process may hold the "I am fetching a token" lock.',
    "PAGE_SIZE": "The `limit` of list calls.",
    "MAX_PAGES": "Hard stop for a list that never ends.",
    "CURRENCIES": "The service's integer currency ids and their ISO codes (the interface does "
    "not publish the table: set yours). Checkout sessions and prices send the id, "
    "subscriptions the code (see `SUBSCRIPTION_CURRENCY_FORM`).",
    "SUBSCRIPTION_CURRENCY_FORM": "How `POST /subscriptions` sends `selected_currency` (a "
    'string, as the interface types it): `"code"` (`"XOF"`) or `"id"` (the id as a string, '
    '`"1"`); answers carry the code either way.',
    "WEBHOOK_SECRET": '`"whsec_<base64>"`, or a list of them while rotating (any one verifies).',
    "WEBHOOK_BASIC_AUTH": '`"user:password"`: HTTP basic auth on the callback URL, an '
    "alternative to signatures.",
    "WEBHOOK_ALLOW_UNVERIFIED": "With neither `WEBHOOK_SECRET` nor `WEBHOOK_BASIC_AUTH` set, "
    "accept deliveries unverified (check `W001` warns, each one is logged). Never in production.",
    "WEBHOOK_TOLERANCE": "Seconds of clock skew accepted on `webhook-timestamp`, both ways.",
    "WEBHOOK_PROCESS_INLINE": "Process each event in the request, right after it is stored, "
    "instead of a Celery task after commit (its signals still wait for the commit).",
    "EVENT_TYPE_ALIASES": "Extra spellings of event types, mapped to a canonical type.",
    "EVENT_HANDLERS": "Canonical type -> dotted path of your `EventHandler` subclass.",
    "WEBHOOK_MAX_ATTEMPTS": "Processing attempts of an event (transient errors) before it is "
    "`failed`.",
    "SUBSCRIBER_MODEL": "What a customer belongs to (a user, a team, an organisation); "
    "`None` means `AUTH_USER_MODEL`. Set it before the first `migrate`.",
    "CUSTOMER_IDENTIFIER": "Dotted path of a callable(subscriber) -> the customer's `identifier`.",
    "CUSTOMER_FIELDS": "Dotted path of a callable(subscriber) -> `first_name`, `last_name`, "
    "`email`.",
    "CHECKOUT_EXPIRY": "Seconds a checkout session stays open (sent as `expires_at`).",
    "SUBSCRIPTION_REQUIRED_URL": "Where access checks send non-subscribers (a URL name or a "
    "path; `?next=` is added).",
    "SUBSCRIBER_RESOLVER": "Dotted path of a callable(request) -> subscriber; `None` means "
    "`request.user`.",
    "INTERACTIVE_DEADLINE": "Seconds a request a person waits on (checkout, the return page, "
    "the API's checkout) may spend on the service in all: attempts, retries, the waits between "
    "them, each attempt's timeouts; a `Retry-After` beyond it gives up at once. `MAX_RETRIES` "
    "and `RETRY_AFTER_MAX` are for background work.",
    "MULTIPLE_PURCHASE_PRODUCTS": "Products (names or remote ids) a subscriber may buy again "
    "while holding an active subscription to them; any other is refused a second purchase "
    "(409).",
    "ACCOUNT_URL": "The subscriber's billing page (a URL name or a path), linked from the "
    'return page, the "you already have this plan" page and the API\'s 409; default: the '
    "app's own billing page.",
    "ACTIVE_STATUSES": "Subscription statuses that grant access (an allow-list, compared "
    "stripped and lower-cased); any other status, unknown ones included, grants none. The "
    "interface shows only `published`, and the sandbox uses it for every live subscription, "
    'trials included; add e.g. `"trialing"` if your service sends more.',
    "OUTBOX_MAX_ATTEMPTS": "Push attempts before an outbox entry is `failed` (visible, retryable).",
    "OUTBOX_RETRY_BASE": "Seconds: push retry *n* waits `OUTBOX_RETRY_BASE * 2**n`, capped by "
    "`OUTBOX_RETRY_MAX`.",
    "OUTBOX_RETRY_MAX": "Seconds: the cap of a push retry's wait; keep it below the broker's "
    "visibility timeout.",
    "OUTBOX_STALE_AFTER": "Seconds: the periodic drain re-enqueues entries pending longer "
    "than this.",
    "OUTBOX_LEASE": "Seconds a worker's claim on an entry holds before another may take over "
    "(a killed worker); keep it above the longest push.",
    "OUTBOX_DRAIN_BATCH": "Deprecated (removed in the next release): when set, the value of "
    "`OUTBOX_PUSH_MAX_ENTRIES` and `OUTBOX_REQUEUE_BATCH` where those are not set.",
    "OUTBOX_PUSH_MAX_ENTRIES": "Entries one push run (the task a commit kicks) attempts, then it "
    "kicks itself again.",
    "OUTBOX_REQUEUE_BATCH": "Stale entries one periodic sweep (`billing_integration.drain_outbox`) "
    "re-enqueues at most.",
    "OUTBOX_DEFER_DELAY": "Seconds before a push queued behind another push of the same "
    "object retries.",
    "OUTBOX_QUEUE": "The Celery queue of the push tasks (`None`: the default queue).",
    "KICK_TTL": "Seconds a pending wake-up suppresses further kicks (bounds the delay after a "
    "lost message).",
    "KICK_CACHE": "The cache alias holding the wake-up flags, shared by all processes "
    "(`None`: `TOKEN_CACHE`).",
    "OUTBOX_DRAIN_SECONDS": "Seconds one push drain run pushes, then it kicks itself again.",
    "OUTBOX_CLAIM_BATCH": "Due entries a push run claims at a time, at least: more (up to "
    "1,000) when half a second of calls at its last batch's pace is more.",
    "OUTBOX_PUSH_CONCURRENCY": "Calls to the service one push run has in flight at once "
    "(threads; the entries of one object stay in order). `1`: one call at a time.",
    "OUTBOX_PUSH_RUNS": "Push runs that may work at once when a burst is due: a run that finds "
    "a full batch wakes one more, up to this many, so a burst spreads over the workers. `1`: "
    "one run at a time.",
    "WEBHOOK_DRAIN_SECONDS": "Seconds one event drain run processes, then it kicks itself again.",
    "WEBHOOK_KICK_WINDOW": "Seconds a web process that saw the event drain's wake-up pending "
    "skips the cache for further kicks; the drain lingers as long after its clear before "
    "returning on nothing, so no wake-up is lost (`0`: off).",
    "WEBHOOK_PROCESS_RUNS": "Event drain runs that may process at once, each on the events of "
    "its share of the objects (by a hash of the object id): the events of one object are "
    "processed in order of reception, different objects by up to this many workers (`1`: one "
    "run processes every event).",
    "BASE_TEMPLATE": "The template the app's pages (checkout return and errors, the billing page) "
    "extend; it must define the blocks `title` and `content` (the example project sets "
    '`"base.html"`).',
    "PRICING_URL": "Where the billing page sends a customer whose subscription lapsed, to "
    "choose a plan again "
    "(a URL name or a path); `None`: `SUBSCRIPTION_REQUIRED_URL`.",
    "NOTICES": "Each notice email on (`True`) or off: `payment_failed`, `subscription_canceled`, "
    "`subscription_paused`, `refund_approved`; opt-in (all off).",
    "NOTICE_FROM_EMAIL": "The notices' sender (`None`: `DEFAULT_FROM_EMAIL`).",
    "NOTICE_RECIPIENT": "Dotted path of a callable(customer, subscriber) returning the email "
    "address or `None` (`None`: the customer's email, else the subscriber's).",
    "SITE_URL": "The site's absolute base (`https://app.example.com`) for links in the notices; "
    "required (a system check) when a notice is on.",
    "NOTICE_MAX_ATTEMPTS": "Sending attempts of one notice (the task retries with backoff) before "
    "it stays `failed`.",
    "SHARED_BACKOFF": "A `Retry-After` (429, or a 5xx that sends one, capped at "
    "`RETRY_AFTER_MAX`) or `BACKOFF_FAILURE_RUN` failures in a row seen by one process pause "
    "every process until then; a call a person waits on whose deadline ends first fails at "
    "once (the checkout's 503 page).",
    "BACKOFF_CACHE": "The cache alias of the shared back-off window (`None`: `KICK_CACHE`, then "
    "`TOKEN_CACHE`).",
    "BACKOFF_REFRESH": "Seconds a process trusts its copy of the window: it learns of another's "
    "at most this late, and reads the cache at most once per interval.",
    "BACKOFF_FAILURE_RUN": "Retryable failures in a row (no `Retry-After`) after which a process "
    "pauses all, for `BACKOFF_BASE * 2**(run - 3)` seconds (at most `BACKOFF_MAX`).",
    "PACE_DOUBLING": "After a 429, every process together keeps to a shared pace of calls a "
    "second: half the calls answered in the second before (halved again by a later 429), "
    "doubling every this many seconds until it is over 1,000. `0`: no pace, only the window.",
    "EVENT_RETENTION": "Finished event deliveries (processed, ignored, failed, rejected) older "
    "than this are deleted by the daily task `billing_integration.prune_events`: `90d`, `12h`, "
    "`30m` or seconds; `None` keeps every delivery. `received` ones are never deleted.",
    "CACHE": "The Django cache alias of everything the processes share: the token, the "
    'backoff window and the "once" keys. Use a cache every process reaches (Redis, the '
    "database cache), not the per-process default `LocMemCache`, in production.",
    "QUEUE": "The Celery queue of the app's tasks (`None`: Celery's default queue).",
}
