"""Django system checks of the billing configuration and of the wiring a host must provide.

None touches the database, the broker or a cache, except ``check_service_binding``: it is
tagged ``database``, so it runs only when Django asks for database checks (``migrate``).
"""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.cache.backends.dummy import DummyCache
from django.core.cache.backends.locmem import LocMemCache
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.utils.module_loading import import_string

from .conf import DEFAULTS, REQUIRED, billing_settings
from .exceptions import BillingConfigurationError
from .webhooks.verification import whsec_key

URL_KEYS = ("BASE_URL", "AUTH_URL", "CHECKOUT_URL")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: Cache backends whose content each process keeps to itself.
PROCESS_LOCAL_BACKENDS = (LocMemCache, DummyCache)
#: SHA-256 of the public demo webhook secret of ``example_project/demo.env``.
DEMO_WEBHOOK_SECRET_SHA256 = "d571fb0081e214ea7f811973fbf285e38d0cef2822dafc2dfbc6be6b674fdaf8"
#: The sandbox's default client secret (``billing_integration.sandbox.config``).
SANDBOX_CLIENT_SECRET = "sandbox-secret"


def _hint(key: str) -> str:
    env = REQUIRED.get(key)
    where = f" (the example project reads the environment variable {env})" if env else ""
    return f"Set BILLING['{key}'] in your settings{where}."


def _secrets(conf: dict[str, Any]) -> list[Any]:
    value = conf.get("WEBHOOK_SECRET")
    return list(value) if isinstance(value, (list, tuple)) else [value] if value else []


def _conf() -> dict[str, Any] | None:
    try:
        return billing_settings.as_dict()
    except BillingConfigurationError:
        return None  # check_billing_settings reports it (E000)


@register(Tags.security, "billing")
def check_billing_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The settings can be read, the service and webhook keys are usable, each value valid."""
    try:
        conf = billing_settings.as_dict()
    except BillingConfigurationError as exc:
        return [Error(str(exc), hint=f"Fix {exc.setting}.", id="billing_integration.E000")]
    return [
        *_service_errors(conf),
        *_webhook_errors(conf),
        *_value_errors(conf),
        *_notice_errors(conf),
    ]


def _service_errors(conf: dict[str, Any]) -> list[CheckMessage]:
    errors: list[CheckMessage] = [
        Error(f"BILLING['{key}'] is not set.", hint=_hint(key), id="billing_integration.E001")
        for key in ("CLIENT_ID", "CLIENT_SECRET")
        if not conf.get(key)
    ]
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
        elif parts.scheme == "http" and not settings.DEBUG and parts.hostname not in LOOPBACK:
            errors.append(
                Warning(
                    f"BILLING['{key}'] uses plain http outside DEBUG: {value!r}.",
                    hint="Use the service's https address in production.",
                    id="billing_integration.W003",
                )
            )
    return errors


def _webhook_errors(conf: dict[str, Any]) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    secrets = _secrets(conf)
    listed = isinstance(conf.get("WEBHOOK_SECRET"), (list, tuple))
    for index, secret in enumerate(secrets):
        key = whsec_key(secret)
        if key is None or len(key) < 16:
            label = "BILLING['WEBHOOK_SECRET']" + (f"[{index}]" if listed else "")
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
    if conf.get("WEBHOOK_ALLOW_UNVERIFIED"):
        errors.append(
            Warning(
                "BILLING['WEBHOOK_ALLOW_UNVERIFIED'] is True: unsigned event deliveries are "
                "accepted, so anyone who can reach the callback URL can forge billing events.",
                hint="Set BILLING['WEBHOOK_SECRET'] and drop WEBHOOK_ALLOW_UNVERIFIED.",
                id="billing_integration.W001",
            )
        )
    elif not secrets and not basic and not settings.DEBUG:
        errors.append(
            Error(
                "Event callbacks cannot be verified: neither BILLING['WEBHOOK_SECRET'] nor "
                "BILLING['WEBHOOK_BASIC_AUTH'] is set, so every delivery will be refused.",
                hint="Set BILLING['WEBHOOK_SECRET'] (environment variable BILLING_WEBHOOK_SECRET).",
                id="billing_integration.E006",
            )
        )
    return errors


def _value_errors(conf: dict[str, Any]) -> list[CheckMessage]:
    from .webhooks.prune import parse_duration

    def bad(key: str, text: str, code: str, hint: str = "") -> Error:
        default = f"The default is {DEFAULTS[key]!r}."
        return Error(
            f"BILLING['{key}'] must be {text}, not {conf.get(key)!r}.",
            hint=f"{hint} {default}".strip(),
            id=code,
        )

    errors: list[CheckMessage] = []
    expiry = conf.get("CHECKOUT_EXPIRY")
    if not isinstance(expiry, int) or isinstance(expiry, bool) or expiry < 0:
        errors.append(bad("CHECKOUT_EXPIRY", "a non-negative integer", "billing_integration.E007"))
    active = conf.get("ACTIVE_STATUSES")
    statuses = active if isinstance(active, (list, tuple)) else ()
    if not statuses or not all(isinstance(s, str) and s.strip() for s in statuses):
        errors.append(
            bad(
                "ACTIVE_STATUSES",
                "a non-empty list or tuple of strings",
                "billing_integration.E008",
            )
        )
    if conf.get("SUBSCRIPTION_CURRENCY_FORM") not in ("code", "id"):
        hint = "'code' sends selected_currency as 'XOF', 'id' as '1'."
        errors.append(
            bad("SUBSCRIPTION_CURRENCY_FORM", "'code' or 'id'", "billing_integration.E013", hint)
        )
    deadline = conf.get("INTERACTIVE_DEADLINE")
    if not isinstance(deadline, (int, float)) or isinstance(deadline, bool) or deadline <= 0:
        errors.append(
            bad("INTERACTIVE_DEADLINE", "a positive number of seconds", "billing_integration.E014")
        )
    retention = conf.get("EVENT_RETENTION")
    if retention is not None:
        try:
            parse_duration(retention)
        except ValueError:
            text = "None or a positive duration such as '90d', '12h', '30m' or seconds"
            errors.append(
                bad(
                    "EVENT_RETENTION",
                    text,
                    "billing_integration.E024",
                    "None keeps every delivery.",
                )
            )
    return errors


def _notice_errors(conf: dict[str, Any]) -> list[CheckMessage]:
    """Known notice kinds (E040), and ``SITE_URL`` set when one is on (E041)."""
    notices, known = conf.get("NOTICES"), set(DEFAULTS["NOTICES"])
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


@register(Tags.database, "billing")
def check_service_binding(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """The mirror belongs to another service than the configured one (E010)."""
    if not databases:
        return []
    from .service import check_messages

    return list(check_messages(databases))


@register(Tags.security, "billing", deploy=True)
def check_billing_deploy(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``check --deploy``: public demo or sandbox credentials, plain-http service URLs."""
    conf = _conf()
    if conf is None:
        return []
    errors: list[CheckMessage] = []
    if any(
        isinstance(s, str) and hashlib.sha256(s.encode()).hexdigest() == DEMO_WEBHOOK_SECRET_SHA256
        for s in _secrets(conf)
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
        if parts.scheme == "http" and (settings.DEBUG or parts.hostname in LOOPBACK):
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


@register("billing")
def check_wiring(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Celery, the shared cache, DRF and beat as the app needs them (settings only)."""
    return [*_check_celery(), *_check_cache(), *_check_drf()]


def _project_package() -> str:
    """The host's package (``acme.settings`` -> ``acme``), where its ``celery.py`` belongs."""
    module = getattr(settings, "SETTINGS_MODULE", None) or ""
    if "." in module:
        return module.rsplit(".", 1)[0]
    urlconf = getattr(settings, "ROOT_URLCONF", None)
    if isinstance(urlconf, str) and urlconf:
        return urlconf.split(".", 1)[0]
    return module or "proj"


def _check_celery() -> list[CheckMessage]:
    from .health import celery_app
    from .schedule import BEAT_SCHEDULE

    app = celery_app()
    if app is None:
        package = _project_package()
        path = package.replace(".", "/")
        return [
            Error(
                "No Celery app is loaded: local changes would be sent to Celery's default "
                "broker (amqp://guest@localhost//) and never pushed to the billing service.",
                hint=f"Create {path}/celery.py (app = Celery('{package}'); "
                "app.config_from_object('django.conf:settings', namespace='CELERY'); "
                f"app.autodiscover_tasks()) and import it in {path}/__init__.py "
                "(from .celery import app as celery_app).",
                id="billing_integration.E020",
            )
        ]
    errors: list[CheckMessage] = []
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
    if str(conf.beat_scheduler or "").startswith("celery.beat"):  # others keep theirs elsewhere
        scheduled = {
            e.get("task") for e in (conf.beat_schedule or {}).values() if isinstance(e, dict)
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


def _check_cache() -> list[CheckMessage]:
    """BILLING['CACHE'] names a cache (E023), shared between processes when workers run
    apart from the web processes (W020)."""
    from .health import celery_app

    conf = _conf()
    if conf is None:
        return []
    alias = conf["CACHE"]
    if alias not in settings.CACHES:
        return [
            Error(
                f"BILLING['CACHE'] names the cache {alias!r}, which is not in settings.CACHES.",
                hint=f"Add {alias!r} to CACHES or name an existing alias.",
                id="billing_integration.E023",
            )
        ]
    app = celery_app()
    if app is not None and app.conf.task_always_eager:
        return []  # no worker processes: one process shares with itself
    backend = str(settings.CACHES[alias].get("BACKEND", ""))
    try:
        local = issubclass(import_string(backend), PROCESS_LOCAL_BACKENDS)
    except ImportError:
        return []  # Django's own cache checks report it
    if not local:
        return []
    return [
        Warning(
            f"The cache {alias!r} of BILLING['CACHE'] ({backend.rsplit('.', 1)[-1]}) is not "
            "shared between processes: every web and worker process fetches its own API token, "
            "a process told to slow down pauses alone, and duplicate work is not suppressed.",
            hint="Use a cache every process reaches (Redis, Memcached, the database cache).",
            id="billing_integration.W020",
        )
    ]


def _check_drf() -> list[CheckMessage]:
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
