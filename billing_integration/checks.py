"""Django system checks of the billing settings and of the wiring a host must provide. Only
``check_service_binding`` (tagged ``database``, so run by ``migrate``) reads the database."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any
from urllib.parse import SplitResult, urlsplit

import django
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError, connections, router
from django.utils.module_loading import import_string
from django.utils.translation import gettext as _

from .checkout.trials import TRIALS_SHAPE, trials_ok
from .conf import (
    DEADLINE,
    DEFAULTS,
    EXPIRY,
    REMOVED,
    REQUIRED,
    billing_settings,
    deadline_ok,
    expiry_ok,
    guesses,
)
from .exceptions import BillingConfigurationError, without_user_info
from .health import PROCESS_LOCAL_BACKENDS
from .schedule import PRUNE_OLDER_THAN
from .webhooks.verification import MIN_KEY_BYTES, whsec_key

URL_KEYS = ("BASE_URL", "AUTH_URL", "CHECKOUT_URL")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: SHA-256 of the public demo webhook secret of ``example_project/demo.env``.
DEMO_WEBHOOK_SECRET_SHA256 = "d571fb0081e214ea7f811973fbf285e38d0cef2822dafc2dfbc6be6b674fdaf8"
#: The sandbox's default client secret (``billing_integration.sandbox.config``).
SANDBOX_CLIENT_SECRET = "sandbox-secret"
#: The daily beat task that deletes old, finished event deliveries.
PRUNE_TASK = "billing_integration.prune_events"
REFRESH_TASK = "billing_integration.refresh_report_rollups"


def _error(code: str, msg: str, hint: str, warning: bool = False) -> CheckMessage:
    return (Warning if warning else Error)(msg, hint=hint, id=code)


def _hint(key: str) -> str:
    """How to set ``key``, one of ``REQUIRED``."""
    where = f"the example project reads the environment variable {REQUIRED[key]}"
    return f"Set BILLING['{key}'] in your settings ({where})."


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
        hint = _unreadable_hint(exc.setting or "BILLING")
        return [Error(str(exc), hint=hint, id="billing_integration.E000")]
    parts = (_service_errors, _webhook_errors, _value_errors, _notice_errors)
    return [error for part in parts for error in part(conf)]


def _unreadable_hint(setting: str) -> str:
    """What to do about ``setting`` (``BILLING`` or one of its keys) that ``as_dict`` refused."""
    if setting == "BILLING":
        return 'Set BILLING = {"BASE_URL": ..., ...} (docs/settings.md).'
    key = setting[len("BILLING['") : -len("']")]
    if key in REMOVED:
        return f"Remove {setting} from settings.BILLING."
    if key in DEFAULTS:
        return f"Fix the value of {setting} (docs/settings.md)."
    return f"Correct the name of {setting}, or remove it."


def _service_errors(conf: dict[str, Any]) -> list[CheckMessage]:
    errors = [
        _error("billing_integration.E001", f"BILLING['{key}'] is not set.", _hint(key))
        for key in ("CLIENT_ID", "CLIENT_SECRET")
        if not conf.get(key)
    ]
    for key in URL_KEYS:
        value = conf.get(key)
        if not value:
            unset = f"BILLING['{key}'] is not set."
            errors.append(_error("billing_integration.E002", unset, _hint(key)))
        elif (problem := _url_problem(value, query=False)) is not None:
            text = f"BILLING['{key}'] is not an absolute http(s) URL without query: {problem}."
            errors.append(_error("billing_integration.E003", text, _hint(key)))
        elif _remote_http(value) and not settings.DEBUG:
            shown = without_user_info(value)  # a password in the URL is not printed
            text = f"BILLING['{key}'] uses plain http outside DEBUG: {shown!r}."
            hint = "Use the service's https address in production."
            errors.append(_error("billing_integration.W003", text, hint, warning=True))
    return errors


def _split(value: Any) -> SplitResult | None:
    """``value`` split as a URL, None when it cannot be (an unclosed ``[`` of an IPv6 host)."""
    try:
        return urlsplit(str(value))
    except ValueError:
        return None


def _remote_http(value: str) -> bool:
    """A plain http URL to another host than this one."""
    parts = urlsplit(value)
    return parts.scheme == "http" and parts.hostname not in LOOPBACK


def _url_problem(value: Any, *, query: bool = True) -> str | None:
    """None for an absolute http(s) URL that can be reached (without query nor fragment unless
    ``query``); else the value quoted without its user info (a password is not printed), with
    what makes it unreachable: whitespace after its start (requests drops leading whitespace
    only), or a port that is not a number from 1 to 65535."""
    if not isinstance(value, str):
        return repr(value)
    parts, shown = _split(value), repr(without_user_info(value))
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        return shown
    if not query and (parts.query or parts.fragment):
        return shown
    if any(char.isspace() for char in value.lstrip()):
        return f"{shown} (it contains whitespace)"
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range
        port = 0
    return f"{shown} (its port is not a number from 1 to 65535)" if port == 0 else None


def _secret_form(secret: object) -> str:
    """What keeps ``secret`` from the form ``whsec_<base64>`` (never any of its characters)."""
    if not isinstance(secret, str):
        return f": it is a {type(secret).__name__}, not a string"
    if secret != secret.strip():
        return ": it has whitespace at its start or end (a newline read from the environment?)"
    if not secret.startswith("whsec_"):
        return ": it does not start with 'whsec_'"
    if set(secret.removeprefix("whsec_")) & {"-", "_"}:
        return ": its key is base64url ('-' or '_'), not base64 ('+' and '/')"
    return ": its key is not base64"


def _webhook_errors(conf: dict[str, Any]) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    secrets = _secrets(conf)
    listed = isinstance(conf.get("WEBHOOK_SECRET"), (list, tuple))
    for index, secret in enumerate(secrets):
        key = whsec_key(secret)
        if key is None or len(key) < MIN_KEY_BYTES:
            label = "BILLING['WEBHOOK_SECRET']" + (f"[{index}]" if listed else "")
            text = f"{label} is not of the form 'whsec_<base64>'{_secret_form(secret)}."
            if key is not None:  # verifies nothing (401): a short key can be guessed
                text = f"{label} decodes to {len(key)} bytes: at least {MIN_KEY_BYTES} are needed."
            hint = (
                "Copy the secret exactly as the service (or the sandbox) prints it "
                "(environment variable BILLING_WEBHOOK_SECRET)."
            )
            errors.append(_error("billing_integration.E004", text, hint))
    basic = conf.get("WEBHOOK_BASIC_AUTH")
    if basic and (not isinstance(basic, str) or ":" not in basic):
        text = "BILLING['WEBHOOK_BASIC_AUTH'] must be 'user:password'."
        hint = "Set it to the credentials you registered with the callback URL."
        errors.append(_error("billing_integration.E005", text, hint))
    elif basic and not basic.partition(":")[2]:  # anyone could send them: all refused (401)
        text = (
            "BILLING['WEBHOOK_BASIC_AUTH'] has no password: every delivery is refused, as "
            "anyone could send such credentials."
        )
        hint = "Set it to the credentials you registered with the callback URL."
        errors.append(_error("billing_integration.E005", text, hint))
    elif basic and basic != basic.strip():  # every delivery would be refused (401)
        text = (
            "BILLING['WEBHOOK_BASIC_AUTH'] has whitespace at its start or end (a newline read "
            "from the environment?): the service's credentials would never match it."
        )
        hint = "Set it to the credentials you registered with the callback URL, nothing around."
        errors.append(_error("billing_integration.E005", text, hint))
    if conf.get("WEBHOOK_ALLOW_UNVERIFIED"):
        text = (
            "BILLING['WEBHOOK_ALLOW_UNVERIFIED'] is True: unsigned event deliveries are "
            "accepted, so anyone who can reach the callback URL can forge billing events."
        )
        hint = "Set BILLING['WEBHOOK_SECRET'] and drop WEBHOOK_ALLOW_UNVERIFIED."
        errors.append(_error("billing_integration.W001", text, hint, warning=True))
    elif not secrets and not basic and not settings.DEBUG:
        text = (
            "Event callbacks cannot be verified: neither BILLING['WEBHOOK_SECRET'] nor "
            "BILLING['WEBHOOK_BASIC_AUTH'] is set, so every delivery will be refused."
        )
        hint = "Set BILLING['WEBHOOK_SECRET'] (environment variable BILLING_WEBHOOK_SECRET)."
        errors.append(_error("billing_integration.E006", text, hint))
    return errors


def _value_errors(conf: dict[str, Any]) -> list[CheckMessage]:
    def bad(code: str, key: str, text: str, hint: str = "") -> CheckMessage:
        message = f"BILLING['{key}'] must be {text}, not {conf.get(key)!r}."
        return _error(code, message, f"{hint} The default is {DEFAULTS[key]!r}.".strip())

    errors: list[CheckMessage] = []
    if not expiry_ok(conf.get("CHECKOUT_EXPIRY")):
        errors.append(bad("billing_integration.E007", "CHECKOUT_EXPIRY", EXPIRY))
    active = conf.get("ACTIVE_STATUSES")
    statuses = active if isinstance(active, (list, tuple)) else ()
    if not statuses or not all(isinstance(s, str) and s.strip() for s in statuses):
        text = "a non-empty list or tuple of strings"
        errors.append(bad("billing_integration.E008", "ACTIVE_STATUSES", text))
    try:
        guesses()
    except BillingConfigurationError as exc:
        hint = "See docs/changes.md for each guess and its values."
        errors.append(_error("billing_integration.E013", str(exc), hint))
    if not deadline_ok(conf.get("INTERACTIVE_DEADLINE")):
        errors.append(bad("billing_integration.E014", "INTERACTIVE_DEADLINE", DEADLINE))
    if conf.get("ACCESS_AFTER_CANCEL") not in ("period_end", "immediately"):
        hint = "'period_end' keeps a canceled subscription's access until its cycle_end_date."
        text = "'period_end' or 'immediately'"
        errors.append(bad("billing_integration.E050", "ACCESS_AFTER_CANCEL", text, hint))
    if not trials_ok(conf.get("TRIALS")):
        errors.append(bad("billing_integration.E051", "TRIALS", TRIALS_SHAPE))
    errors += _names_nothing(conf)
    for key in ("SUBSCRIBER_RESOLVER", "CUSTOMER_FIELDS"):
        if (problem := _not_callable(conf.get(key))) is not None:
            text = f"BILLING['{key}'] is not the dotted path of a callable: {problem}."
            hint = "Set it to 'package.module.function', or leave it out."
            errors.append(_error("billing_integration.E015", text, hint))
    return errors


def _names_nothing(conf: dict[str, Any]) -> list[CheckMessage]:
    """E000: ``SUBSCRIBER_MODEL`` names an installed model, ``BASE_TEMPLATE`` (when set) a
    template the loaders find (else every billing page would fail, ``TemplateDoesNotExist``),
    ``PRICING_URL`` a path or a URL name that reverses (else a person is sent to ``/``)."""
    from django.apps import apps
    from django.template import TemplateDoesNotExist, TemplateSyntaxError
    from django.template.loader import get_template

    def named(key: str, text: str) -> CheckMessage:
        setting = f"BILLING['{key}']"
        return _error("billing_integration.E000", f"{setting} {text}", _unreadable_hint(setting))

    errors: list[CheckMessage] = []
    label = conf["SUBSCRIBER_MODEL"]
    try:
        apps.get_model(label)
    except LookupError:
        errors.append(named("SUBSCRIBER_MODEL", f"names the model {label!r}, not installed."))
    base = conf["BASE_TEMPLATE"]
    try:
        if base:
            get_template(base)
    except TemplateDoesNotExist:
        errors.append(named("BASE_TEMPLATE", f"names the template {base!r}, which is not found."))
    except TemplateSyntaxError as exc:
        errors.append(named("BASE_TEMPLATE", f"names the template {base!r}, invalid: {exc}."))
    pricing = conf["PRICING_URL"]
    if pricing and "/" not in pricing and not _reverses(pricing):
        text = f"is neither a path nor the name of a URL pattern: {pricing!r}."
        errors.append(named("PRICING_URL", text))
    return errors


def _reverses(name: str | Callable[..., Any]) -> bool:
    """Whether the URL name (or view) reverses (True when the URLconf does not load: Django
    reports it)."""
    from django.urls import NoReverseMatch, reverse

    try:
        reverse(name)
    except NoReverseMatch:
        return False
    except Exception:  # a URLconf that does not load
        return True
    return True


def _not_callable(value: Any) -> str | None:
    """None for None, a callable or the dotted path of one; else what is wrong with it."""
    if value is None or callable(value):
        return None
    if not isinstance(value, str):
        return repr(value)
    try:
        target = import_string(value)
    except ImportError as exc:
        return str(exc)
    return None if callable(target) else f"{value!r} names {type(target).__name__}"


def _notice_errors(conf: dict[str, Any]) -> list[CheckMessage]:
    """Known notice kinds, each True or False (E040), and ``SITE_URL`` an absolute http(s)
    URL when one is on (E041): set, with a host, and reachable (``_url_problem``)."""
    notices, known = conf.get("NOTICES"), set(DEFAULTS["NOTICES"])
    if (
        not isinstance(notices, dict)
        or set(notices) - known
        or not all(isinstance(on, bool) for on in notices.values())  # "True" sends nothing
    ):
        text = f"BILLING['NOTICES'] must be a dict of notice kinds to True/False, not {notices!r}."
        hint = f"Known kinds: {', '.join(sorted(known))}; each True or False."
        return [_error("billing_integration.E040", text, hint)]
    site = conf.get("SITE_URL")
    on = ", ".join(sorted(kind for kind, value in notices.items() if value))
    hint = 'For example "https://app.example.com".'
    if not on:
        return []
    if not site:
        text = (
            f"BILLING['SITE_URL'] must be set when notices are on ({on}): "
            "the emails link to the account page with an absolute URL."
        )
        return [_error("billing_integration.E041", text, hint)]
    if (problem := _url_problem(site)) is not None:
        text = (
            f"BILLING['SITE_URL'] is not an absolute http(s) URL: {problem}; notices are on "
            f"({on}) and the emails link to the account page with an absolute URL."
        )
        return [_error("billing_integration.E041", text, hint)]
    return []


@register(Tags.database, "billing")
def check_service_binding(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """E010: a database Django checks holds a mirror of another service than the configured one
    (one that holds nothing yet follows the settings: ``service.holds_nothing``)."""
    from .models.service import ServiceBinding
    from .service import RELINK_COMMAND, RESET_COMMAND, configured_service, recorded_service

    if not databases:
        return []
    try:
        configured = configured_service()
    except BillingConfigurationError:
        return []  # reported by check_billing_settings
    hint = _(
        "Run `%(relink)s` if it is the same service (a new address, new credentials of the same "
        "account), or `%(reset)s` to start afresh with the configured service."
    ) % {"relink": RELINK_COMMAND, "reset": RESET_COMMAND}
    errors: list[CheckMessage] = []
    for alias in databases:
        if not router.allow_migrate_model(alias, ServiceBinding):
            continue
        try:
            if ServiceBinding._meta.db_table not in connections[alias].introspection.table_names():
                continue  # not migrated yet: nothing recorded
            recorded = recorded_service(alias)
        except DatabaseError:
            continue
        if recorded is None or recorded == configured or _holds_nothing(alias):
            continue
        text = _(
            "The billing mirror in database %(alias)r belongs to the service at "
            "%(recorded)s, but settings.BILLING points at %(configured)s: "
            "pushes, pulls and checkouts are refused."
        ) % {"alias": alias, "recorded": recorded, "configured": configured}
        errors.append(_error("billing_integration.E010", text, hint))
    return errors


def _holds_nothing(alias: str) -> bool:
    """``service.holds_nothing``; False when the database cannot tell (not fully migrated)."""
    from .service import holds_nothing

    try:
        return holds_nothing(alias)
    except DatabaseError:
        return False


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
        text = (
            "BILLING['WEBHOOK_SECRET'] is the public demo secret of example_project/demo.env: "
            "anyone can sign events your site accepts."
        )
        hint = (
            "Use the webhook secret the billing service gives you for this callback "
            "(environment variable BILLING_WEBHOOK_SECRET)."
        )
        errors.append(_error("billing_integration.E011", text, hint))
    if conf.get("CLIENT_SECRET") == SANDBOX_CLIENT_SECRET:
        text = "BILLING['CLIENT_SECRET'] is the offline sandbox's default client secret."
        hint = (
            "Use the client secret the billing service issued for BILLING['CLIENT_ID'] "
            "(environment variable BILLING_CLIENT_SECRET)."
        )
        errors.append(_error("billing_integration.E012", text, hint))
    for key in URL_KEYS:
        parts = _split(conf.get(key) or "")
        # W003 already reports a remote http URL outside DEBUG.
        if parts and parts.scheme == "http" and (settings.DEBUG or parts.hostname in LOOPBACK):
            text = (
                f"BILLING['{key}'] uses plain http: tokens, client credentials and billing "
                "data would travel unencrypted."
            )
            hint = f"Set BILLING['{key}'] to the service's https address "
            hint += f"(environment variable {REQUIRED[key]})."
            errors.append(_error("billing_integration.W010", text, hint, warning=True))
    return errors


@register("billing")
def check_wiring(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Celery, the shared cache, DRF, CSRF, staff email and beat as the app needs them, aware
    datetimes, and the event callback routed (settings and the URLconf only)."""
    checks = [_check_celery, _check_cache, _check_drf, _check_csrf, _check_managers]
    checks += [_check_use_tz, _check_webhook_routed]
    return [message for check in checks for message in check()]


def _check_webhook_routed() -> list[CheckMessage]:
    """W024: no URL serves the event callback (``billing_integration:webhook``, or the view
    routed by the host under a name of its own)."""
    from .webhooks.views import webhook

    if _reverses("billing_integration:webhook") or _reverses(webhook):
        return []
    text = (
        "No URL serves the event callback (billing_integration:webhook): every delivery of the "
        "billing service gets a 404, and no payment, renewal or cancellation reaches the site "
        "by event (nothing is refused or counted, so the Health page cannot see it)."
    )
    hint = (
        "Include billing_integration.urls (path('billing/', include('billing_integration.urls'))"
        ") and register https://<your host>/billing/webhooks/ with the service."
    )
    return [_error("billing_integration.W024", text, hint, warning=True)]


def _forms_routed() -> bool:
    """Whether ``billing_integration.urls`` routes the billing forms."""
    from django.urls import reverse

    try:
        reverse("billing_integration:checkout")
    except Exception:  # not routed (NoReverseMatch), or a URLconf Django's checks report
        return False
    return True


def _check_csrf() -> list[CheckMessage]:
    """W022: the billing forms are routed but ``CsrfViewMiddleware`` (or a subclass) is not in
    ``MIDDLEWARE``: their POSTs rely on it against cross-site requests."""
    from django.middleware.csrf import CsrfViewMiddleware

    if not _forms_routed():
        return []
    for name in settings.MIDDLEWARE:
        try:
            middleware = import_string(name)
        except ImportError:  # Django's own start-up reports it
            continue
        if isinstance(middleware, type) and issubclass(middleware, CsrfViewMiddleware):
            return []
    text = (
        "billing_integration.urls routes the billing forms (checkout, trial, change of plan, "
        "stop renewal, resume), but django.middleware.csrf.CsrfViewMiddleware is not in "
        "MIDDLEWARE: another site can post them for a signed-in customer."
    )
    hint = "Add 'django.middleware.csrf.CsrfViewMiddleware' to MIDDLEWARE."
    return [_error("billing_integration.W022", text, hint, warning=True)]


def _managers_ok(managers: Any) -> bool:
    """``MANAGERS`` as ``mail_managers`` takes it: (name, email) pairs; from Django 6.0 email
    strings too."""
    if not isinstance(managers, (list, tuple)):
        return False
    strings = django.VERSION >= (6, 0)
    return all(
        (isinstance(m, (list, tuple)) and len(m) == 2) or (strings and isinstance(m, str))
        for m in managers
    )


def _check_managers() -> list[CheckMessage]:
    """W023: the billing forms are routed but ``MANAGERS`` is empty, or not what
    ``mail_managers`` takes (it raises): a change the service is not asked for itself (stop
    renewal, resume, change of plan) is emailed to no one."""
    managers = settings.MANAGERS
    if (managers and _managers_ok(managers)) or not _forms_routed():
        return []
    what = "is empty" if not managers else f"is not a list of (name, email) pairs: {managers!r}"
    text = (
        f"settings.MANAGERS {what}: a customer's request to stop renewal, resume or change "
        "plan that staff must do on the billing service is emailed to no one (it is only "
        "listed in the admin's Change requests), and the customer is billed as before."
    )
    hint = 'Set MANAGERS = [("Billing staff", "billing@example.com")] (and Django\'s email).'
    return [_error("billing_integration.W023", text, hint, warning=True)]


def _check_use_tz() -> list[CheckMessage]:
    """E025: ``USE_TZ`` is on. The service's dates are aware (UTC) and the mirror stores and
    compares them so; with it off, saving a subscription fails (a ``ValueError``)."""
    if settings.USE_TZ:
        return []
    text = (
        "USE_TZ is False: billing_integration stores the billing service's dates as aware "
        "datetimes (UTC), so every subscription it saves would fail and no access is granted."
    )
    return [_error("billing_integration.E025", text, "Set USE_TZ = True (Django's default).")]


def _project_package() -> str:
    """The host's package (``acme.settings`` -> ``acme``), where its ``celery.py`` belongs."""
    module = getattr(settings, "SETTINGS_MODULE", None) or ""
    urlconf = getattr(settings, "ROOT_URLCONF", None)
    if "." not in module and isinstance(urlconf, str) and urlconf:
        return urlconf.split(".", 1)[0]
    return module.rsplit(".", 1)[0] if "." in module else module or "proj"


def _check_celery() -> list[CheckMessage]:
    from .health import celery_app
    from .schedule import BEAT_SCHEDULE

    app = celery_app()
    if app is None:
        package = _project_package()
        path = package.replace(".", "/")
        text = (
            "No Celery app is loaded: local changes would be sent to Celery's default "
            "broker (amqp://guest@localhost//) and never pushed to the billing service."
        )
        hint = (
            f"Create {path}/celery.py (app = Celery('{package}'); "
            "app.config_from_object('django.conf:settings', namespace='CELERY'); "
            f"app.autodiscover_tasks()) and import it in {path}/__init__.py "
            "(from .celery import app as celery_app)."
        )
        return [_error("billing_integration.E020", text, hint)]
    errors: list[CheckMessage] = []
    conf = app.conf
    if not conf.task_always_eager and not conf.broker_write_url:
        text = (
            "The Celery broker is not set, so Celery uses its default, "
            "amqp://guest@localhost//: pushes and event processing wait on a broker that "
            "is probably not there."
        )
        hint = "Set CELERY_BROKER_URL (e.g. redis://host:6379/0), even to "
        hint += "amqp://guest@localhost// if that is really your broker."
        errors.append(_error("billing_integration.E021", text, hint))
    beat = conf.beat_schedule if isinstance(conf.beat_schedule, dict) else {}
    errors += _prune_age_errors(beat)
    if str(conf.beat_scheduler or "").startswith("celery.beat"):  # others keep theirs elsewhere
        scheduled = {_job(e) for e in beat.values() if isinstance(e, dict)}
        # Without the prune entry every delivery is kept: a choice, not a gap.
        wanted = [_job(e) for e in BEAT_SCHEDULE.values() if e["task"] != PRUNE_TASK]
        missing = list(dict.fromkeys(job for job in wanted if job not in scheduled))
        if missing:
            text = (
                "Celery beat's schedule lacks billing_integration's periodic tasks "
                f"({', '.join(missing)}): a lost push or event message would never be "
                "retried, and nothing would reconcile the mirror."
            )
            hint = "from billing_integration.schedule import BEAT_SCHEDULE; "
            hint += "CELERY_BEAT_SCHEDULE = {**BEAT_SCHEDULE, ...}"
            errors.append(_error("billing_integration.W021", text, hint, warning=True))
    return errors


def _job(entry: dict[str, Any]) -> str:
    """A beat entry's task; the rollups' refresh names its reconciliation apart (the same task
    with ``recent_months``)."""
    task, kwargs = str(entry.get("task")), entry.get("kwargs")
    if task == REFRESH_TASK and (
        entry.get("args") or (isinstance(kwargs, dict) and kwargs.get("recent_months"))
    ):
        return f"{task} (with recent_months: the reconciliation)"
    return task


def _prune_age_errors(schedule: dict[str, Any]) -> list[CheckMessage]:
    """E024: the ``older_than`` of each beat entry running the prune is a positive duration
    (its ``args`` a list or tuple, its ``kwargs`` a dict: Celery could not call it else)."""
    from .webhooks.prune import parse_duration

    errors: list[CheckMessage] = []
    for name, entry in schedule.items():
        if not isinstance(entry, dict) or entry.get("task") != PRUNE_TASK:
            continue
        args, kwargs = entry.get("args") or (), entry.get("kwargs") or {}
        if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
            text = (
                f"The args of Celery beat's {name!r} entry ({PRUNE_TASK}) must be a list or "
                f"tuple and its kwargs a dict, not args={args!r}, kwargs={kwargs!r}."
            )
            hint = f"For example 'kwargs': {{'older_than': {PRUNE_OLDER_THAN!r}}}."
            errors.append(_error("billing_integration.E024", text, hint))
            continue
        age = args[0] if args else kwargs.get("older_than", PRUNE_OLDER_THAN)
        try:
            parse_duration(age)
        except ValueError:
            text = (
                f"The older_than of Celery beat's {name!r} entry ({PRUNE_TASK}) must be a "
                f"positive duration such as '90d', '12h', '30m' or seconds, not {age!r}."
            )
            hint = f"Its default is {PRUNE_OLDER_THAN!r}; remove the entry to keep every delivery."
            errors.append(_error("billing_integration.E024", text, hint))
    return errors


def _check_cache() -> list[CheckMessage]:
    """BILLING['CACHE'] names a cache (E023), shared between processes when workers run apart
    (W020)."""
    from .health import celery_app

    conf = _conf()
    if conf is None:
        return []
    alias = conf["CACHE"]
    if alias not in settings.CACHES:
        text = f"BILLING['CACHE'] names the cache {alias!r}, which is not in settings.CACHES."
        hint = f"Add {alias!r} to CACHES or name an existing alias."
        return [_error("billing_integration.E023", text, hint)]
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
    text = (
        f"The cache {alias!r} of BILLING['CACHE'] ({backend.rsplit('.', 1)[-1]}) is not "
        "shared between processes: every web and worker process fetches its own API token, "
        "a process told to slow down pauses alone, and duplicate work is not suppressed."
    )
    hint = "Use a cache every process reaches (Redis, Memcached, the database cache)."
    return [_error("billing_integration.W020", text, hint, warning=True)]


def _check_drf() -> list[CheckMessage]:
    from django.apps import apps
    from django.urls import reverse

    if apps.is_installed("rest_framework"):
        return []
    try:
        reverse("billing_integration:api_subscriptions")
    except Exception:  # not routed (NoReverseMatch), or a URLconf Django's checks report
        return []
    text = (
        "billing_integration.urls routes its REST API, but 'rest_framework' is not in "
        "INSTALLED_APPS: its pages fail (the browsable API's templates are missing)."
    )
    return [_error("billing_integration.E022", text, "Add 'rest_framework' to INSTALLED_APPS.")]
