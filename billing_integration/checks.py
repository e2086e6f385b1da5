"""Django system checks for the billing configuration.

``check_billing_settings`` runs on every ``check``; ``check_billing_deploy`` only under
``check --deploy``. They never query the database, except ``check_service_binding``: it is
registered with ``Tags.database``, so it runs only when Django asks for database checks
(``migrate``, ``check --database default``).
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

from .conf import DEFAULTS, REQUIRED, billing_settings
from .exceptions import BillingConfigurationError
from .webhooks.verification import whsec_key

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
    errors.extend(
        _whole_number_errors(
            conf,
            (
                "PAGE_SIZE",
                "MAX_RETRIES",
                "CHECKOUT_EXPIRY",
                "WEBHOOK_TOLERANCE",
                "OUTBOX_PUSH_MAX_ENTRIES",
                "OUTBOX_REQUEUE_BATCH",
            ),
            minimum=0,
            error_id="billing_integration.E007",
        )
    )
    form = conf.get("SUBSCRIPTION_CURRENCY_FORM")
    if form not in ("code", "id"):
        errors.append(
            Error(
                f"BILLING['SUBSCRIPTION_CURRENCY_FORM'] must be 'code' or 'id', not {form!r}.",
                hint="'code' (the default) sends selected_currency as 'XOF', 'id' as '1'.",
                id="billing_integration.E013",
            )
        )
    errors.extend(_checkout_and_access_errors(conf))
    return errors


def _checkout_and_access_errors(conf: dict[str, Any]) -> list:
    """INTERACTIVE_DEADLINE a positive number; MULTIPLE_PURCHASE_PRODUCTS a list of strings;
    ACTIVE_STATUSES a non-empty list of non-empty strings."""
    errors: list = []
    deadline = conf.get("INTERACTIVE_DEADLINE")
    if not isinstance(deadline, (int, float)) or isinstance(deadline, bool) or deadline <= 0:
        errors.append(
            Error(
                f"BILLING['INTERACTIVE_DEADLINE'] must be a positive number of seconds, "
                f"not {deadline!r}.",
                hint=f"The default is {DEFAULTS['INTERACTIVE_DEADLINE']!r}.",
                id="billing_integration.E014",
            )
        )
    products = conf.get("MULTIPLE_PURCHASE_PRODUCTS")
    if not isinstance(products, (list, tuple)) or not all(
        isinstance(p, (str, uuid.UUID)) for p in products
    ):
        errors.append(
            Error(
                "BILLING['MULTIPLE_PURCHASE_PRODUCTS'] must be a list of product names or "
                f"remote ids, not {products!r}.",
                hint='For example ["Ebook", "Support hours"].',
                id="billing_integration.E015",
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
    errors.extend(_retention_errors(conf))
    errors.extend(
        _whole_number_errors(conf, WORKER_COUNTS, minimum=1, error_id="billing_integration.E016")
    )
    return errors


#: Settings that size the work of the workers: each a positive whole number.
WORKER_COUNTS = (
    "OUTBOX_PUSH_CONCURRENCY",
    "OUTBOX_PUSH_RUNS",
    "OUTBOX_CLAIM_BATCH",
    "WEBHOOK_PROCESS_RUNS",
)


def _whole_number_errors(
    conf: dict[str, Any], keys: tuple[str, ...], *, minimum: int, error_id: str
) -> list:
    """One ``error_id`` per key of ``keys`` that is not a whole number of at least
    ``minimum`` (0: non-negative, 1: positive)."""
    kind = "a positive whole number" if minimum == 1 else "a non-negative integer"
    return [
        Error(
            f"BILLING['{key}'] must be {kind}, not {value!r}.",
            hint=f"The default is {DEFAULTS[key]!r}.",
            id=error_id,
        )
        for key in keys
        if not isinstance(value := conf.get(key), int) or isinstance(value, bool) or value < minimum
    ]


def _retention_errors(conf: dict[str, Any]) -> list:
    """EVENT_RETENTION None or a positive duration ("90d", "12h", "30m", seconds)."""
    from .webhooks.prune import parse_duration

    value = conf.get("EVENT_RETENTION")
    if value is None:
        return []
    try:
        parse_duration(value)
    except ValueError:
        return [
            Error(
                "BILLING['EVENT_RETENTION'] must be None or a positive duration such as "
                f"'90d', '12h', '30m' or a number of seconds, not {value!r}.",
                hint="None keeps every event delivery; the default is "
                f"{DEFAULTS['EVENT_RETENTION']!r}.",
                id="billing_integration.E024",
            )
        ]
    return []


def _valid_whsec(secret: Any) -> bool:
    key = whsec_key(secret)
    return key is not None and len(key) >= 16


@register(Tags.database, "billing")
def check_service_binding(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list:
    """The mirror belongs to another service than the configured one (E010). Reads the
    database, so only when Django passes ``databases``."""
    if not databases:
        return []
    from .service import check_messages

    return check_messages(databases)


#: SHA-256 of the webhook secret committed in ``example_project/demo.env`` (public on purpose,
#: for the demo; compared by digest so that no copy of it sits in the package).
DEMO_WEBHOOK_SECRET_SHA256 = "d571fb0081e214ea7f811973fbf285e38d0cef2822dafc2dfbc6be6b674fdaf8"
#: The sandbox's default client secret (``billing_integration.sandbox.config``).
SANDBOX_CLIENT_SECRET = "sandbox-secret"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@register(Tags.security, "billing", deploy=True)
def check_billing_deploy(app_configs: Any = None, **kwargs: Any) -> list:
    """``check --deploy``: public sandbox or demo credentials, plain-http service URLs. Run
    whatever ``DEBUG`` says (like Django's own deploy checks); never prints a secret."""
    try:
        conf = billing_settings.as_dict()
    except BillingConfigurationError:
        return []  # check_billing_settings reports it (E000)
    errors: list = []
    secrets = conf.get("WEBHOOK_SECRET")
    secret_list = secrets if isinstance(secrets, (list, tuple)) else [secrets] if secrets else []
    if any(
        isinstance(secret, str)
        and hashlib.sha256(secret.encode()).hexdigest() == DEMO_WEBHOOK_SECRET_SHA256
        for secret in secret_list
    ):
        errors.append(
            Error(
                "BILLING['WEBHOOK_SECRET'] is the public demo secret of example_project/demo.env: "
                "anyone can sign events your site accepts.",
                hint="Use the webhook secret the billing service gives you for this callback "
                "(environment variable BILLING_WEBHOOK_SECRET).",
                id="billing_integration.E011",
            )
        )
    if conf.get("CLIENT_SECRET") == SANDBOX_CLIENT_SECRET:
        errors.append(
            Error(
                "BILLING['CLIENT_SECRET'] is the offline sandbox's default client secret.",
                hint="Use the client secret the billing service issued for BILLING['CLIENT_ID'] "
                "(environment variable BILLING_CLIENT_SECRET).",
                id="billing_integration.E012",
            )
        )
    for key in URL_KEYS:
        parts = urlsplit(str(conf.get(key) or ""))
        # W003 already reports a remote http URL outside DEBUG.
        if parts.scheme == "http" and (settings.DEBUG or parts.hostname in _LOOPBACK):
            errors.append(
                Warning(
                    f"BILLING['{key}'] uses plain http: tokens, client credentials and billing "
                    "data would travel unencrypted.",
                    hint=f"Set BILLING['{key}'] to the service's https address "
                    f"(environment variable {REQUIRED[key]}).",
                    id="billing_integration.W010",
                )
            )
    return errors


# --- the wiring a host project must provide (E020-E023, W020-W021) -----------------------------
@register("billing")
def check_wiring(app_configs: Any = None, **kwargs: Any) -> list:
    """Celery, caches, DRF and beat as the app needs them. Reads settings and the Celery app's
    configuration only: no database, broker or cache connection."""
    return [*_check_celery(), *_check_caches(), *_check_drf()]


def _project_package() -> str:
    """The host project's package, where its ``celery.py`` belongs: that of the settings
    module (``acme.settings`` -> ``acme``), else the first part of ``ROOT_URLCONF``."""
    module = getattr(settings, "SETTINGS_MODULE", None) or ""
    if "." in module:
        return module.rsplit(".", 1)[0]
    urlconf = getattr(settings, "ROOT_URLCONF", None)
    if isinstance(urlconf, str) and urlconf:
        return urlconf.split(".", 1)[0]
    return module or "proj"


def _check_celery() -> list:
    from .health import celery_app

    app = celery_app()
    if app is None:
        package = _project_package()
        return [
            Error(
                "No Celery app is loaded: local changes would be sent to Celery's default "
                "broker (amqp://guest@localhost//) and never pushed to the billing service.",
                hint=f"Create {package.replace('.', '/')}/celery.py (app = Celery('{package}'); "
                "app.config_from_object('django.conf:settings', namespace='CELERY'); "
                f"app.autodiscover_tasks()) and import it in {package.replace('.', '/')}/"
                "__init__.py (from .celery import app as celery_app).",
                id="billing_integration.E020",
            )
        ]
    errors: list = []
    conf = app.conf
    if not conf.task_always_eager and not conf.broker_write_url:
        errors.append(
            Error(
                "The Celery broker is not set, so Celery uses its default, "
                "amqp://guest@localhost//: pushes and event processing wait on a broker that "
                "is probably not there.",
                hint="Set CELERY_BROKER_URL (e.g. redis://host:6379/0), even to "
                "amqp://guest@localhost// if that is really your broker.",
                id="billing_integration.E021",
            )
        )
    from .schedule import BEAT_SCHEDULE

    scheduler = str(conf.beat_scheduler or "")
    if scheduler.startswith("celery.beat"):  # other schedulers keep their entries elsewhere
        scheduled = {
            entry.get("task")
            for entry in (conf.beat_schedule or {}).values()
            if isinstance(entry, dict)
        }
        missing = [e["task"] for e in BEAT_SCHEDULE.values() if e["task"] not in scheduled]
        if missing:
            errors.append(
                Warning(
                    "Celery beat's schedule lacks billing_integration's periodic tasks "
                    f"({', '.join(missing)}): a lost push or event message would never be "
                    "retried, and nothing would reconcile the mirror.",
                    hint="from billing_integration.schedule import BEAT_SCHEDULE; "
                    "CELERY_BEAT_SCHEDULE = {**BEAT_SCHEDULE, ...}",
                    id="billing_integration.W021",
                )
            )
    return errors


def _check_caches() -> list:
    from django.utils.module_loading import import_string

    from .wakeup import PROCESS_LOCAL_BACKENDS

    try:
        conf = billing_settings.as_dict()
    except BillingConfigurationError:
        return []  # E000 reports it
    roles: dict[str, list[str]] = {}
    roles.setdefault(conf["TOKEN_CACHE"], []).append("TOKEN_CACHE")
    roles.setdefault(conf["KICK_CACHE"] or conf["TOKEN_CACHE"], []).append("KICK_CACHE")
    if conf["SHARED_BACKOFF"] and isinstance(conf["BACKOFF_CACHE"], str) and conf["BACKOFF_CACHE"]:
        roles.setdefault(conf["BACKOFF_CACHE"], []).append("BACKOFF_CACHE")
    errors: list = []
    for alias, keys in roles.items():
        names = " and ".join(f"BILLING['{k}']" for k in keys)
        if alias not in settings.CACHES:
            errors.append(
                Error(
                    f"{names} names the cache {alias!r}, which is not in settings.CACHES.",
                    hint=f"Add {alias!r} to CACHES or name an existing alias.",
                    id="billing_integration.E023",
                )
            )
            continue
        backend = str(settings.CACHES[alias].get("BACKEND", ""))
        try:
            local = issubclass(import_string(backend), PROCESS_LOCAL_BACKENDS)
        except ImportError:
            continue  # Django's own cache checks report it
        if local:
            effects = {
                "TOKEN_CACHE": "every web and worker process fetches its own API token",
                "KICK_CACHE": "wake-ups cannot be coalesced (each change sends its own "
                "Celery message)",
                "BACKOFF_CACHE": "a process that is told to slow down pauses alone",
            }
            errors.append(
                Warning(
                    f"The cache {alias!r} ({backend.rsplit('.', 1)[-1]}) of {names} is not "
                    f"shared between processes: {'; '.join(effects[k] for k in keys)}.",
                    hint="Use a shared cache (Redis, Memcached, the database cache) for "
                    "these aliases.",
                    id="billing_integration.W020",
                )
            )
    return errors


def _check_drf() -> list:
    from django.apps import apps
    from django.urls import NoReverseMatch, reverse

    if apps.is_installed("rest_framework"):
        return []
    try:
        reverse("billing_integration:api_subscriptions")
    except NoReverseMatch:
        return []  # the API is not routed
    except Exception:
        return []  # a broken URLconf: Django's own URL checks report it
    return [
        Error(
            "billing_integration.urls routes its REST API, but 'rest_framework' is not in "
            "INSTALLED_APPS: its pages fail (the browsable API's templates are missing).",
            hint="Add 'rest_framework' to INSTALLED_APPS.",
            id="billing_integration.E022",
        )
    ]


# --- backing off together (E030-E032) ---------------------------------------------------------
@register("billing")
def check_shared_backoff(app_configs: Any = None, **kwargs: Any) -> list:
    """``SHARED_BACKOFF`` and its keys have usable values (settings only, no cache access)."""
    try:
        conf = billing_settings.as_dict()
    except BillingConfigurationError:
        return []  # E000 reports it
    errors: list = []
    if not isinstance(conf["SHARED_BACKOFF"], bool):
        errors.append(
            Error(
                f"BILLING['SHARED_BACKOFF'] must be True or False, not {conf['SHARED_BACKOFF']!r}.",
                hint="Set it to True (every process backs off together) or False.",
                id="billing_integration.E030",
            )
        )
    alias = conf["BACKOFF_CACHE"]
    if alias is not None and (not isinstance(alias, str) or not alias):
        errors.append(
            Error(
                f"BILLING['BACKOFF_CACHE'] must be a cache alias or None, not {alias!r}.",
                hint="Name an alias of CACHES (E023 reports one that is missing), or None "
                "to use KICK_CACHE / TOKEN_CACHE.",
                id="billing_integration.E031",
            )
        )
    for key in ("BACKOFF_REFRESH", "BACKOFF_FAILURE_RUN", "PACE_DOUBLING"):
        value = conf[key]
        bad = isinstance(value, bool) or not isinstance(value, (int, float))
        if key == "BACKOFF_FAILURE_RUN":
            bad = bad or not isinstance(value, int) or value < 1
        elif key == "PACE_DOUBLING":
            bad = bad or not 0 <= value <= 3600
        else:
            bad = bad or not 0 <= value <= 60
        if bad:
            errors.append(
                Error(
                    f"BILLING['{key}'] is {value!r}.",
                    hint="BACKOFF_REFRESH: seconds between 0 and 60 (default 0.5); "
                    "BACKOFF_FAILURE_RUN: an integer >= 1 (default 3); PACE_DOUBLING: "
                    "seconds between 0 (no pace after a 429) and 3600 (default 5).",
                    id="billing_integration.E032",
                )
            )
    return errors
