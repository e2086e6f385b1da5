"""The settings reader names the exact key to set; the system checks name the setting to fix."""

import uuid
from pathlib import Path

import pytest
from django.core.checks import ERROR, WARNING, run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from billing_integration import currencies
from billing_integration.checks import check_billing_settings
from billing_integration.conf import DEFAULTS, REMOVED, billing_settings
from billing_integration.exceptions import BillingConfigurationError
from billing_integration.models.customers import subscriber_model_label

GOOD = {
    "BASE_URL": "http://127.0.0.1:8100",
    "AUTH_URL": "http://127.0.0.1:8100/auth",
    "CHECKOUT_URL": "http://127.0.0.1:8100",
    "CLIENT_ID": "id",
    "CLIENT_SECRET": "secret",
    "WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
}


def ids(errors):
    return sorted(e.id for e in errors)


def test_defaults_and_overrides(settings):
    settings.BILLING = {**GOOD, "CHECKOUT_EXPIRY": 7}
    assert billing_settings.CHECKOUT_EXPIRY == 7
    assert billing_settings.REALM == "sandbox"
    assert billing_settings.SUBSCRIBER_MODEL == settings.AUTH_USER_MODEL


def test_missing_required_key_names_it(settings):
    settings.BILLING = {k: v for k, v in GOOD.items() if k != "CLIENT_ID"}
    with pytest.raises(BillingConfigurationError) as info:
        billing_settings.CLIENT_ID
    assert "BILLING['CLIENT_ID']" in str(info.value)
    assert "BILLING_CLIENT_ID" in str(info.value)


def test_unknown_key_is_refused(settings):
    settings.BILLING = {**GOOD, "CLIENT_SECERT": "typo"}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E000"]
    assert "BILLING['CLIENT_SECERT']" in errors[0].msg
    assert errors[0].hint == "Correct the name of BILLING['CLIENT_SECERT'], or remove it."
    with pytest.raises(BillingConfigurationError) as info:
        billing_settings.REALM
    assert info.value.setting == "BILLING['CLIENT_SECERT']"


def test_the_public_keys_are_the_documented_25():
    assert len(DEFAULTS) == 25
    assert set(DEFAULTS).isdisjoint(REMOVED)


@pytest.mark.parametrize("key", sorted(REMOVED))
def test_a_removed_key_says_what_replaced_it(settings, key):
    settings.BILLING = {**GOOD, key: 1}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E000"]
    assert errors[0].msg == f"BILLING[{key!r}] was removed: {REMOVED[key]}."
    assert errors[0].hint == f"Remove BILLING['{key}'] from settings.BILLING."


def test_a_removed_key_said_to_be_a_constant_has_one_where_it_says():
    """``it is a constant now (billing_integration.X)``: a module of that package holds a
    constant of the same meaning (its name ends as the key does: ``..._BATCH``, ``..._MAX``)."""
    import importlib
    import pkgutil
    import re

    wrong = []
    for key, message in REMOVED.items():
        named = re.fullmatch(r"it is a constant now \((billing_integration[\w.]*)\)", message)
        if named is None:
            continue
        package = importlib.import_module(named[1])
        modules = [package]
        for info in pkgutil.iter_modules(getattr(package, "__path__", [])):
            modules.append(importlib.import_module(f"{named[1]}.{info.name}"))
        suffix = key.rsplit("_", 1)[-1]
        names = {name for module in modules for name in vars(module) if name.isupper()}
        if not any(name == suffix or name.endswith(f"_{suffix}") for name in names):
            wrong.append(key)
    assert wrong == []


def test_the_old_cache_aliases_point_to_cache(settings):
    settings.BILLING = {**GOOD, "TOKEN_CACHE": "tokens"}
    with pytest.raises(BillingConfigurationError) as info:
        billing_settings.CACHE
    assert str(info.value) == "BILLING['TOKEN_CACHE'] was removed: use BILLING['CACHE']."


def test_currency_mapping(settings):
    settings.BILLING = {**GOOD, "CURRENCIES": {"7": "xaf", 8: "USD"}}
    assert currencies.currency_code(7) == "xaf"
    assert currencies.currency_id("XAF") == 7
    with pytest.raises(BillingConfigurationError, match="CURRENCIES"):
        currencies.currency_code(99)


def test_good_settings_pass(settings):
    settings.BILLING = GOOD
    assert check_billing_settings() == []


def test_missing_credentials_and_urls(settings):
    settings.BILLING = {"BASE_URL": "http://x"}
    errors = check_billing_settings()
    assert "billing_integration.E001" in ids(errors)
    messages = " ".join(e.msg + " " + e.hint for e in errors)
    for key in ("CLIENT_ID", "CLIENT_SECRET", "AUTH_URL", "CHECKOUT_URL"):
        assert f"BILLING['{key}']" in messages


def test_malformed_url(settings):
    settings.BILLING = {**GOOD, "BASE_URL": "127.0.0.1:8100"}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E003"]
    assert "BASE_URL" in errors[0].msg


@pytest.mark.parametrize("key", ["BASE_URL", "AUTH_URL", "CHECKOUT_URL"])
@pytest.mark.parametrize(
    "url, reason",
    [
        ("http://127.0.0.1:81OO/auth", "its port is not a number from 1 to 65535"),
        ("http://127.0.0.1:99999/auth", "its port is not a number from 1 to 65535"),
        ("http://127.0.0.1:0/auth", "its port is not a number from 1 to 65535"),
        ("http://127.0.0.1:8100 /auth", "it contains whitespace"),
        ("http://127.0.0.1:8100/auth\n", "it contains whitespace"),
    ],
)
def test_a_url_that_cannot_be_reached_is_malformed(settings, key, url, reason):
    settings.BILLING = {**GOOD, key: url}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E003"]
    assert errors[0].msg == (
        f"BILLING['{key}'] is not an absolute http(s) URL without query: {url!r} ({reason})."
    )


@pytest.mark.parametrize("url", ["http://:8100/auth", "http://[::1/auth"])
def test_a_url_without_a_host_is_malformed(settings, url):
    settings.BILLING = {**GOOD, "AUTH_URL": url}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E003"]
    assert errors[0].msg == (
        f"BILLING['AUTH_URL'] is not an absolute http(s) URL without query: {url!r}."
    )
    assert "billing_integration.E003" in ids(deploy_messages())  # check --deploy runs too


def test_a_url_with_an_explicit_port_passes(settings):
    urls = {"BASE_URL": "https://billing.example.com:443/", "AUTH_URL": "http://[::1]:65535/a"}
    settings.BILLING = {**GOOD, **urls, "CHECKOUT_URL": " http://127.0.0.1:1"}
    assert check_billing_settings() == []


MALFORMED = "BILLING['AUTH_URL'] is not an absolute http(s) URL without query:"
PORT = "(its port is not a number from 1 to 65535)"


@pytest.mark.parametrize(
    "url, code, msg",
    [
        (
            "http://user:pw@127.0.0.1:8100/auth?x=1",
            "E003",
            f"{MALFORMED} 'http://127.0.0.1:8100/auth?x=1'.",
        ),
        (
            "http://user:pw@127.0.0.1:81OO/auth",
            "E003",
            f"{MALFORMED} 'http://127.0.0.1:81OO/auth' {PORT}.",
        ),
        ("user:pw@127.0.0.1:8100/auth", "E003", f"{MALFORMED} '127.0.0.1:8100/auth'."),
        (
            "http://user:pw@billing.example.com/auth",
            "W003",
            "BILLING['AUTH_URL'] uses plain http outside DEBUG: 'http://billing.example.com/auth'.",
        ),
    ],
)
def test_a_url_is_echoed_without_its_user_info(settings, url, code, msg):
    settings.DEBUG = False
    settings.BILLING = {**GOOD, "AUTH_URL": url}
    errors = check_billing_settings()
    assert ids(errors) == [f"billing_integration.{code}"]
    assert errors[0].msg == msg
    assert "pw" not in errors[0].hint


NOTICE_ON = {"NOTICES": {"payment_failed": True, "trial_ending": True}}
SITE_LINKS = (
    "notices are on (payment_failed, trial_ending) and the emails link to the account page "
    "with an absolute URL."
)


def test_site_url_must_be_set_when_a_notice_is_on(settings):
    settings.BILLING = {**GOOD, **NOTICE_ON, "SITE_URL": ""}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E041"]
    assert errors[0].msg == (
        "BILLING['SITE_URL'] must be set when notices are on (payment_failed, trial_ending): "
        "the emails link to the account page with an absolute URL."
    )


@pytest.mark.parametrize(
    "site, shown",
    [
        ("app.example.com", "'app.example.com'"),
        ("https://", "'https://'"),
        (
            "https://app.example.com:99999",
            "'https://app.example.com:99999' (its port is not a number from 1 to 65535)",
        ),
        ("https://app.example.com /", "'https://app.example.com /' (it contains whitespace)"),
        (
            "https://user:pw@app.example.com:x",
            "'https://app.example.com:x' (its port is not a number from 1 to 65535)",
        ),
    ],
)
def test_a_site_url_set_but_not_absolute_is_said_so(settings, site, shown):
    settings.BILLING = {**GOOD, **NOTICE_ON, "SITE_URL": site}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E041"]
    assert errors[0].msg == (
        f"BILLING['SITE_URL'] is not an absolute http(s) URL: {shown}; {SITE_LINKS}"
    )
    assert errors[0].hint == 'For example "https://app.example.com".'


def test_an_absolute_site_url_passes(settings):
    settings.BILLING = {**GOOD, **NOTICE_ON, "SITE_URL": "https://app.example.com:8443/app"}
    assert check_billing_settings() == []


def test_a_short_webhook_secret_is_an_error_that_says_its_length(settings):
    settings.BILLING = {**GOOD, "WEBHOOK_SECRET": "whsec_" + "eHh4eHh4eHh4eHh4eHh4"}  # 15 bytes
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E004"]
    assert "decodes to 15 bytes: at least 16 are needed" in errors[0].msg
    assert "eHh4" not in errors[0].msg + errors[0].hint


def test_malformed_webhook_secret_is_not_echoed(settings):
    settings.BILLING = {**GOOD, "WEBHOOK_SECRET": "not-a-secret-value"}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E004"]
    assert "not-a-secret-value" not in errors[0].msg + errors[0].hint


@pytest.mark.parametrize("basic", ["hook:s3cr3t\n", " hook:s3cr3t", "hook:s3cr3t\t"])
def test_basic_credentials_with_whitespace_at_an_end_are_an_error(settings, basic):
    """A newline read from the environment: every delivery would be refused (401), so the
    check says so, without echoing the credentials."""
    settings.BILLING = {**GOOD, "WEBHOOK_BASIC_AUTH": basic}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E005"]
    assert "whitespace" in errors[0].msg
    assert "s3cr3t" not in errors[0].msg + errors[0].hint


@pytest.mark.parametrize("basic", ["hook:", ":"])
def test_basic_credentials_without_a_password_are_an_error(settings, basic):
    """Anyone could send credentials with an empty password: deliveries are refused, and the
    check says so."""
    settings.BILLING = {**GOOD, "WEBHOOK_BASIC_AUTH": basic}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E005"]
    assert "password" in errors[0].msg


def test_no_verification_outside_debug_is_an_error(settings):
    settings.DEBUG = False
    settings.BILLING = {k: v for k, v in GOOD.items() if k != "WEBHOOK_SECRET"}
    assert ids(check_billing_settings()) == ["billing_integration.E006"]
    settings.DEBUG = True
    assert check_billing_settings() == []


def test_unverified_allowed_always_warns(settings):
    settings.BILLING = {**GOOD, "WEBHOOK_ALLOW_UNVERIFIED": True}
    assert ids(check_billing_settings()) == ["billing_integration.W001"]


def test_manage_py_check_names_the_setting(settings):
    # No django_db mark: a check that touched the database would fail with RuntimeError.
    settings.BILLING = {k: v for k, v in GOOD.items() if k != "CLIENT_SECRET"}
    with pytest.raises(SystemCheckError) as info:
        call_command("check", tags=["billing"])
    assert "BILLING['CLIENT_SECRET']" in str(info.value)


def test_manage_py_check_never_queries_the_database_by_default(settings):
    # No django_db mark: the database-tagged check of the service binding must not run.
    settings.BILLING = GOOD
    call_command("check")
    call_command("check", tags=["billing"])


@pytest.mark.django_db
def test_database_checks_report_a_mirror_of_another_service(settings):
    from django.core.checks import run_checks
    from django.utils import timezone

    from billing_integration.models import ServiceBinding

    settings.BILLING = GOOD
    assert [e for e in run_checks(databases=["default"]) if e.id.startswith("billing")] == []
    ServiceBinding.objects.create(
        base_url="https://billing.example.com",
        realm="sandbox",
        client_id="id",
        recorded_at=timezone.now(),
    )
    assert [e for e in run_checks() if e.id == "billing_integration.E010"] == []
    # a mirror that holds nothing yet follows the settings: nothing to report
    assert [e for e in run_checks(databases=["default"]) if e.id.startswith("billing")] == []
    from billing_integration.models import Customer
    from billing_integration.outbox import from_remote

    with from_remote():  # a customer of the recorded service
        Customer.objects.create(remote_id=uuid.uuid4(), identifier="c-1")
    errors = [e for e in run_checks(databases=["default"]) if e.id == "billing_integration.E010"]
    assert len(errors) == 1
    assert "https://billing.example.com" in errors[0].msg and GOOD["BASE_URL"] in errors[0].msg
    assert "billing_service relink" in errors[0].hint
    assert GOOD["CLIENT_SECRET"] not in errors[0].msg + errors[0].hint
    with pytest.raises(SystemCheckError, match="E010"):
        call_command("check", "--database", "default")
    with pytest.raises(SystemCheckError, match="E010"):
        call_command("migrate", verbosity=0, skip_checks=False)  # as `manage.py migrate`
    # The same service, written with a trailing slash: nothing to report.
    settings.BILLING = {**GOOD, "BASE_URL": "https://billing.example.com/"}
    assert [e for e in run_checks(databases=["default"]) if e.id.startswith("billing")] == []


# --- check --deploy ----------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
HTTPS = {
    **GOOD,
    "BASE_URL": "https://billing.example.com",
    "AUTH_URL": "https://billing.example.com/auth",
    "CHECKOUT_URL": "https://billing.example.com",
}


def demo_webhook_secret() -> str:
    for line in (ROOT / "example_project" / "demo.env").read_text().splitlines():
        if line.startswith("BILLING_WEBHOOK_SECRET="):
            return line.split("=", 1)[1].strip()
    raise AssertionError("no BILLING_WEBHOOK_SECRET in demo.env")


def deploy_messages() -> list:
    """What ``check --deploy`` reports for the billing tag (no database touched)."""
    return run_checks(tags=["billing"], include_deployment_checks=True)


def test_deploy_passes_a_production_configuration(settings):
    settings.DEBUG = False
    settings.BILLING = HTTPS
    assert deploy_messages() == []


@pytest.mark.parametrize("debug", [False, True])
def test_deploy_refuses_the_public_demo_webhook_secret(settings, debug):
    settings.DEBUG = debug
    demo = demo_webhook_secret()
    for value in (demo, ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", demo]):
        settings.BILLING = {**HTTPS, "WEBHOOK_SECRET": value}
        errors = deploy_messages()
        assert ids(errors) == ["billing_integration.E011"]
        assert errors[0].level == ERROR
        assert demo not in errors[0].msg + errors[0].hint
    # Only under --deploy: a plain check accepts it (the demo runs with it).
    settings.BILLING = {**HTTPS, "WEBHOOK_SECRET": demo}
    assert run_checks(tags=["billing"]) == []


def test_deploy_refuses_the_sandbox_client_secret(settings):
    from billing_integration.sandbox.config import DEFAULT_CLIENT_SECRET

    settings.DEBUG = False
    settings.BILLING = {**HTTPS, "CLIENT_SECRET": DEFAULT_CLIENT_SECRET}
    errors = deploy_messages()
    assert ids(errors) == ["billing_integration.E012"]
    assert DEFAULT_CLIENT_SECRET not in errors[0].msg + errors[0].hint
    assert "CLIENT_SECRET" in errors[0].msg


@pytest.mark.parametrize("key", ["BASE_URL", "AUTH_URL", "CHECKOUT_URL"])
def test_deploy_warns_about_plain_http_urls(settings, key):
    settings.DEBUG = False
    settings.BILLING = {**HTTPS, key: "http://127.0.0.1:8100"}
    warnings = deploy_messages()
    assert ids(warnings) == ["billing_integration.W010"]
    assert warnings[0].level == WARNING and f"BILLING['{key}']" in warnings[0].msg
    # A remote http URL outside DEBUG: W003 of the plain check says it, once.
    settings.BILLING = {**HTTPS, key: "http://billing.example.com"}
    assert ids(deploy_messages()) == ["billing_integration.W003"]
    settings.DEBUG = True
    assert ids(deploy_messages()) == ["billing_integration.W010"]


def test_manage_py_check_deploy_fails_on_the_demo_settings(settings):
    settings.DEBUG = False
    settings.BILLING = {
        **GOOD,
        "CLIENT_SECRET": "sandbox-secret",
        "WEBHOOK_SECRET": demo_webhook_secret(),
    }
    with pytest.raises(SystemCheckError) as info:
        call_command("check", "--deploy", tags=["billing"])
    text = str(info.value)
    assert "billing_integration.E011" in text and "billing_integration.E012" in text
    assert "billing_integration.W010" in text
    assert demo_webhook_secret() not in text and "sandbox-secret" not in text


@pytest.mark.parametrize(
    "extra,expected",
    [
        ({"INTERACTIVE_DEADLINE": 0}, ["billing_integration.E014"]),
        ({"INTERACTIVE_DEADLINE": "8"}, ["billing_integration.E014"]),
        ({"CHECKOUT_EXPIRY": -1}, ["billing_integration.E007"]),
        ({"CHECKOUT_EXPIRY": "300"}, ["billing_integration.E007"]),
        ({"INTERACTIVE_DEADLINE": 2.5, "CHECKOUT_EXPIRY": 600}, []),
    ],
)
def test_checkout_settings_are_checked(settings, extra, expected):
    settings.BILLING = {**GOOD, **extra}
    errors = check_billing_settings()
    assert ids(errors) == expected
    for error in errors:
        assert f"BILLING['{next(iter(extra))}']" in error.msg


def test_removed_checkout_retry_settings_are_refused(settings):
    """INTERACTIVE_DEADLINE replaced them: a project still setting them is told so."""
    settings.BILLING = {**GOOD, "CHECKOUT_MAX_RETRIES": 1}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E000"]
    assert errors[0].msg == (
        "BILLING['CHECKOUT_MAX_RETRIES'] was removed: use BILLING['INTERACTIVE_DEADLINE']."
    )


@pytest.mark.parametrize("value", [[], (), "BASE_URL", ["BASE_URL"]])
def test_billing_that_is_not_a_dict_is_e000(settings, value):
    # Empty or not, a BILLING that is not a dict is said to be one, not read as unset keys.
    settings.BILLING = value
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E000"]
    assert errors[0].msg == f"settings.BILLING must be a dict, not {type(value).__name__}."
    assert errors[0].hint == 'Set BILLING = {"BASE_URL": ..., ...} (docs/settings.md).'


def test_the_subscriber_model_of_a_billing_that_is_not_a_dict_is_the_user(settings):
    # Read when the models load, before any check runs: E000 must get to say what is wrong.
    settings.BILLING = "BASE_URL"
    assert subscriber_model_label() == settings.AUTH_USER_MODEL


@pytest.mark.parametrize("value", [["XOF"], {"x": "XOF"}, "XOF"])
def test_a_currency_table_that_cannot_be_read_is_e000_naming_it(settings, value):
    # Was a traceback out of manage.py check (int() of a key, .items() of a list).
    settings.BILLING = {**GOOD, "CURRENCIES": value}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E000"]
    assert errors[0].msg.startswith("BILLING['CURRENCIES'] must be a dict of the service's ")
    assert errors[0].hint == "Fix the value of BILLING['CURRENCIES'] (docs/settings.md)."


@pytest.mark.parametrize("value", ["False", "no", 0, 1])
def test_allow_unverified_that_is_not_a_bool_is_e000_naming_it(settings, value):
    # env("BILLING_WEBHOOK_ALLOW_UNVERIFIED", default=False) without cast=bool reads "False":
    # that text was truthy, so unsigned deliveries were accepted.
    settings.BILLING = {**GOOD, "WEBHOOK_ALLOW_UNVERIFIED": value}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E000"]
    assert errors[0].msg == (
        f"BILLING['WEBHOOK_ALLOW_UNVERIFIED'] must be True or False, not {value!r}."
    )


@pytest.mark.parametrize("key", ["SUBSCRIBER_RESOLVER", "CUSTOMER_FIELDS"])
@pytest.mark.parametrize("path", ["proj.nowhere.resolver", "billing_integration.conf.NOPE", 5])
def test_a_callable_setting_that_does_not_import_is_e015(settings, key, path):
    # It failed only at the first checkout or access check, with ImportError (a 500).
    settings.BILLING = {**GOOD, key: path}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E015"]
    assert errors[0].msg.startswith(f"BILLING['{key}'] is not the dotted path of a callable: ")
    assert errors[0].hint == "Set it to 'package.module.function', or leave it out."


def test_callable_settings_that_import_pass(settings):
    settings.BILLING = {
        **GOOD,
        "SUBSCRIBER_RESOLVER": "billing_integration.access.get_subscriber",
        "CUSTOMER_FIELDS": currencies.currency_code,  # a callable itself is accepted too
    }
    assert check_billing_settings() == []


@pytest.mark.parametrize(
    "key,value",
    [
        # "" or None requested tokens from {AUTH_URL}/realms//protocol/..., "a/b" another path.
        ("REALM", ""),
        ("REALM", None),
        ("REALM", "a/b"),
        ("REALM", " sandbox"),
        ("REALM", 1),
        # A list or dict crashed manage.py check (unhashable, in E023's `in settings.CACHES`).
        ("CACHE", ["default"]),
        ("CACHE", {}),
        ("CACHE", ""),
        ("CLIENT_ID", 1),
        ("CLIENT_ID", ["id"]),
        # 1 crashed every command as the models loaded (OneToOneField(1)).
        ("SUBSCRIBER_MODEL", 1),
        ("SUBSCRIBER_MODEL", ""),
        ("SUBSCRIBER_MODEL", "auth"),
        # Read with str() or `.items()` at the first event, page or notice, not at check time.
        ("EVENT_TYPE_ALIASES", ["x"]),
        ("EVENT_TYPE_ALIASES", {"subscription.cancelled": None}),
        ("EVENT_TYPE_ALIASES", {1: "subscription.canceled"}),
        ("PRICING_URL", 1),
        ("BASE_TEMPLATE", ["base.html"]),
        ("SITE_URL", 0),
        # str(None) was read as the currency code "None".
        ("CURRENCIES", {1: None}),
        ("CURRENCIES", {1: ""}),
        # Every currency was unknown: each checkout refused at run time, the checks silent.
        ("CURRENCIES", {}),
    ],
)
def test_a_value_of_the_wrong_shape_is_e000_naming_the_key(settings, key, value):
    settings.BILLING = {**GOOD, key: value}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E000"]
    assert errors[0].msg.startswith(f"BILLING['{key}'] must be ")
    assert errors[0].hint == f"Fix the value of BILLING['{key}'] (docs/settings.md)."
    with pytest.raises(BillingConfigurationError) as info:  # where checks do not run
        billing_settings.BASE_URL
    assert info.value.setting == f"BILLING['{key}']"


def test_a_client_secret_of_the_wrong_shape_is_not_echoed(settings):
    settings.BILLING = {**GOOD, "CLIENT_SECRET": ["s3cr3t-value"]}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E000"]
    assert errors[0].msg == "BILLING['CLIENT_SECRET'] must be a string, not list."


def test_the_subscriber_model_of_a_label_that_is_not_text_is_the_user(settings):
    # Read when the models load, before any check runs: E000 must get to say what is wrong.
    settings.BILLING = {**GOOD, "SUBSCRIBER_MODEL": 1}
    assert subscriber_model_label() == settings.AUTH_USER_MODEL


@pytest.mark.parametrize(
    "key,value",
    [
        ("REALM", "billing-prod"),
        ("SUBSCRIBER_MODEL", "auth.User"),
        ("EVENT_TYPE_ALIASES", {"sub.gone": "subscription.canceled"}),
        ("EVENT_TYPE_ALIASES", None),
        ("PRICING_URL", None),
        ("PRICING_URL", "pricing"),
        ("PRICING_URL", "/plans/?ref=x"),
        ("BASE_TEMPLATE", ""),
        ("SITE_URL", None),
        ("CLIENT_ID", None),
    ],
)
def test_values_of_the_documented_shapes_pass(settings, key, value):
    settings.BILLING = {**GOOD, key: value}
    assert [e.id for e in check_billing_settings() if e.id != "billing_integration.E001"] == []


@pytest.mark.parametrize(
    "key,value,text",
    [
        # Every billing page failed with TemplateDoesNotExist; the checks said nothing.
        ("BASE_TEMPLATE", "nowhere/base.html", "names the template 'nowhere/base.html', "),
        # Django's fields.E300 named Customer.subscriber, not the setting to fix.
        ("SUBSCRIBER_MODEL", "shop.Account", "names the model 'shop.Account', not installed."),
        # The account page linked to "/", the access redirect went to the relative "pricng".
        ("PRICING_URL", "pricng", "is neither a path nor the name of a URL pattern: 'pricng'."),
    ],
)
def test_a_value_that_names_nothing_is_e000_naming_the_key(settings, key, value, text):
    settings.BILLING = {**GOOD, key: value}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E000"]
    assert errors[0].msg.startswith(f"BILLING['{key}'] {text}")
    assert errors[0].hint == f"Fix the value of BILLING['{key}'] (docs/settings.md)."


def test_a_base_template_that_does_not_compile_is_e000(settings, tmp_path):
    (tmp_path / "broken.html").write_text("{% block title %}", encoding="utf-8")
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": [tmp_path]}]
    settings.BILLING = {**GOOD, "BASE_TEMPLATE": "broken.html"}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E000"]
    assert errors[0].msg.startswith("BILLING['BASE_TEMPLATE'] names the template 'broken.html', ")


@pytest.mark.parametrize("value", ["True", 1, None])
def test_a_notice_that_is_not_true_or_false_is_e040(settings, value):
    # Only True sends: "True" from the environment passed the checks and sent nothing.
    settings.BILLING = {**GOOD, "NOTICES": {"payment_failed": value}}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E040"]
    assert errors[0].msg == (
        "BILLING['NOTICES'] must be a dict of notice kinds to True/False, "
        f"not {{'payment_failed': {value!r}}}."
    )
    assert errors[0].hint.endswith("; each True or False.")


def test_a_cache_alias_not_in_caches_names_the_key_where_checks_do_not_run(settings):
    # Was Django's "The connection 'nowhere' doesn't exist.", logged as the cache being down.
    from billing_integration.conf import shared_cache

    settings.BILLING = {**GOOD, "CACHE": "nowhere"}
    with pytest.raises(BillingConfigurationError) as info:
        shared_cache()
    assert str(info.value) == (
        "BILLING['CACHE'] names the cache 'nowhere', which is not in settings.CACHES."
    )


@pytest.mark.parametrize(
    ("secret", "said"),
    [
        ("whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3\n", "whitespace at its start or end"),
        ("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3", "does not start with 'whsec_'"),
        ("whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NT-_", "base64url"),
    ],
)
def test_a_webhook_secret_in_another_encoding_says_what_is_wrong(settings, secret, said):
    """A newline from the environment, the key without its prefix, the URL-safe alphabet: each
    was 'not of the form whsec_<base64>', which an operator looking at a secret of that form
    could not act on; it still says nothing of the secret itself."""
    settings.BILLING = {**GOOD, "WEBHOOK_SECRET": secret}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E004"]
    assert said in errors[0].msg
    assert "MDEy" not in errors[0].msg + errors[0].hint
