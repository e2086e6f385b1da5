"""``BILLING['GUESSES']`` (issue 28): defaults, and a bad key or value named exactly, by the
reader and by the system check E013; the key it replaced is refused with what to do."""

from __future__ import annotations

import pytest

from billing_integration.checks import check_billing_settings
from billing_integration.conf import GUESS_DEFAULTS, guesses
from billing_integration.exceptions import BillingConfigurationError


def test_defaults_switch_every_guess_off(settings):
    settings.BILLING = {**settings.BILLING, "GUESSES": {}}
    assert (
        guesses()
        == {
            "subscription_currency_form": "code",
            "change_plan_action": None,
            "change_plan_target": "subscription",
            "patch_auto_renew": False,
        }
        == GUESS_DEFAULTS
    )
    settings.BILLING = {**settings.BILLING, "GUESSES": {"patch_auto_renew": True}}
    assert guesses()["patch_auto_renew"] is True and guesses()["change_plan_action"] is None


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"patch_auto_renew": "yes"}, "BILLING['GUESSES']['patch_auto_renew']"),
        ({"patch_auto_renew": 1}, "BILLING['GUESSES']['patch_auto_renew']"),
        ({"change_plan_target": "plan"}, "BILLING['GUESSES']['change_plan_target']"),
        ({"change_plan_action": ""}, "BILLING['GUESSES']['change_plan_action']"),
        ({"change_plan_actoin": "upgrade"}, "BILLING['GUESSES']['change_plan_actoin']"),
    ],
)
def test_a_bad_guess_is_named_exactly(settings, given, named):
    settings.BILLING = {**settings.BILLING, "GUESSES": given}
    with pytest.raises(BillingConfigurationError) as info:
        guesses()
    assert named in str(info.value) and info.value.setting == named
    [error] = [e for e in check_billing_settings() if e.id == "billing_integration.E013"]
    assert named in error.msg


def test_the_old_key_says_what_to_do(settings):
    settings.BILLING = {**settings.BILLING, "SUBSCRIPTION_CURRENCY_FORM": "id"}
    errors = [e for e in check_billing_settings() if e.id == "billing_integration.E000"]
    assert "BILLING['GUESSES']['subscription_currency_form']" in errors[0].msg
