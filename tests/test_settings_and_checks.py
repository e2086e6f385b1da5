"""The settings reader names the exact key to set; the system checks name the setting to fix."""

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from billing_integration.checks import check_billing_settings
from billing_integration.conf import billing_settings
from billing_integration.exceptions import BillingConfigurationError

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
    settings.BILLING = {**GOOD, "PAGE_SIZE": 7}
    assert billing_settings.PAGE_SIZE == 7
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
    assert "CLIENT_SECERT" in errors[0].msg


def test_currency_mapping(settings):
    settings.BILLING = {**GOOD, "CURRENCIES": {"7": "xaf", 8: "USD"}}
    assert billing_settings.currency_code(7) == "xaf"
    assert billing_settings.currency_id("XAF") == 7
    with pytest.raises(BillingConfigurationError, match="CURRENCIES"):
        billing_settings.currency_code(99)


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


def test_malformed_webhook_secret_is_not_echoed(settings):
    settings.BILLING = {**GOOD, "WEBHOOK_SECRET": "not-a-secret-value"}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E004"]
    assert "not-a-secret-value" not in errors[0].msg + errors[0].hint


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


@pytest.mark.parametrize(
    "extra,expected",
    [
        ({"INTERACTIVE_DEADLINE": 0}, ["billing_integration.E014"]),
        ({"INTERACTIVE_DEADLINE": "8"}, ["billing_integration.E014"]),
        ({"MULTIPLE_PURCHASE_PRODUCTS": "Ebook"}, ["billing_integration.E015"]),
        ({"MULTIPLE_PURCHASE_PRODUCTS": [3]}, ["billing_integration.E015"]),
        ({"INTERACTIVE_DEADLINE": 2.5, "MULTIPLE_PURCHASE_PRODUCTS": ["Ebook"]}, []),
    ],
)
def test_checkout_settings_are_checked(settings, extra, expected):
    settings.BILLING = {**GOOD, **extra}
    assert ids(check_billing_settings()) == expected


def test_removed_checkout_retry_settings_are_refused(settings):
    """INTERACTIVE_DEADLINE replaced them: a project still setting them is told so."""
    settings.BILLING = {**GOOD, "CHECKOUT_MAX_RETRIES": 1}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E000"]
    assert "CHECKOUT_MAX_RETRIES" in errors[0].msg and "INTERACTIVE_DEADLINE" in errors[0].msg
