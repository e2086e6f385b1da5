"""The one currency conversion: one rule for digits, one for unknown ids and codes."""

import pytest

from billing_integration import currencies
from billing_integration.exceptions import BillingConfigurationError

CURRENCIES = {1: "XOF", 2: "USD", 7: "xaf"}


@pytest.fixture(autouse=True)
def _currencies(settings):
    settings.BILLING = {**settings.BILLING, "CURRENCIES": CURRENCIES}


@pytest.mark.parametrize("value", [1, "1", " 1 ", "XOF", "xof", " Xof "])
def test_an_id_or_a_code_gives_the_id_and_the_code(value):
    assert currencies.currency_id(value) == 1
    assert currencies.currency_code(value) == "XOF"


def test_the_code_is_returned_as_configured():
    assert currencies.currency_code(7) == "xaf"
    assert currencies.currency_id("XAF") == 7


@pytest.mark.parametrize("value", [True, False, 1.0, None, "", "²", "\u0661", "-1", "1.0", []])
def test_only_ints_and_ascii_digits_are_ids(value):
    assert currencies.is_id(value) is False


@pytest.mark.parametrize("value", [9, "9", "GBP", "²", True, None, "", "1" * 5000])
def test_an_unknown_id_or_code_raises_naming_the_setting(value):
    with pytest.raises(BillingConfigurationError) as raised:
        currencies.currency_id(value)
    assert raised.value.setting == "BILLING['CURRENCIES']"
    assert "BILLING['CURRENCIES']" in str(raised.value)
    with pytest.raises(BillingConfigurationError):
        currencies.currency_code(value)


def test_label_shows_an_unknown_value_as_it_is():
    assert currencies.label(2) == "USD"
    assert currencies.label(9) == "9"
    assert currencies.label("GBP") == "GBP"
    assert currencies.label(None) == ""
    assert currencies.label("") == ""
