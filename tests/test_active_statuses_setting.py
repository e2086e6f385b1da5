"""``BILLING['ACTIVE_STATUSES']``: a non-empty list or tuple of non-empty strings, checked at
start-up (system check E008 naming the key); a bad value never grants access at run time."""

import pytest

from billing_integration.checks import check_billing_settings
from billing_integration.conf import billing_settings
from billing_integration.exceptions import BillingConfigurationError
from billing_integration.models import active_statuses, grants_access

from .test_settings_and_checks import GOOD, ids


def test_the_default_allow_list_is_published(settings):
    settings.BILLING = GOOD
    assert billing_settings.ACTIVE_STATUSES == ("published",)
    assert active_statuses() == ("published",)


def test_configured_statuses_are_normalised(settings):
    settings.BILLING = {**GOOD, "ACTIVE_STATUSES": [" Published", "TRIALING", "trialing"]}
    assert check_billing_settings() == []
    assert active_statuses() == ("published", "trialing")


@pytest.mark.parametrize(
    "value",
    [
        "published",
        [],
        (),
        [1],
        ["published", None],
        [""],
        ["  "],
        None,
        {"published": True},
        [["published"]],
    ],
)
def test_a_bad_value_is_a_system_check_error_naming_the_key(settings, value):
    settings.BILLING = {**GOOD, "ACTIVE_STATUSES": value}
    errors = check_billing_settings()
    assert ids(errors) == ["billing_integration.E008"]
    assert "BILLING['ACTIVE_STATUSES']" in errors[0].msg
    # At run time the rule refuses to decide rather than grant access on a bad list.
    with pytest.raises(BillingConfigurationError, match=r"BILLING\['ACTIVE_STATUSES'\]"):
        grants_access("published", None, None)
