"""Client pieces that need no server: retry policy, Retry-After parsing, redaction, timestamps."""

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from billing_integration.client.retry import RetryPolicy, parse_retry_after
from billing_integration.exceptions import (
    BillingAPIError,
    BillingAuthenticationError,
    BillingConfigurationError,
    BillingError,
    BillingNotFoundError,
    BillingRateLimitError,
    BillingServerError,
    BillingValidationError,
    error_for_status,
    redact,
)
from billing_integration.timestamps import format_timestamp, parse_timestamp


def test_backoff_is_bounded_and_jittered():
    policy = RetryPolicy(max_retries=5, backoff_base=0.5, backoff_max=4.0)
    waits = [policy.delay(n) for n in range(10) for _ in range(50)]
    assert all(0 <= w <= 4.0 for w in waits)
    assert len({round(w, 6) for w in waits}) > 100  # jittered, not a fixed ladder
    assert max(policy.delay(0) for _ in range(200)) <= 0.5


def test_retry_after_is_honoured_and_capped():
    policy = RetryPolicy(retry_after_max=10.0)
    assert policy.delay(0, retry_after=3.0) == 3.0
    assert policy.delay(3, retry_after=500.0) == 10.0


@pytest.mark.parametrize(
    ("header", "expected"),
    [("2", 2.0), ("0", 0.0), ("", None), (None, None), ("soon", None)],
)
def test_parse_retry_after_seconds(header, expected):
    assert parse_retry_after(header) == expected


def test_parse_retry_after_http_date():
    when = datetime.now(UTC) + timedelta(seconds=30)
    assert 25 <= parse_retry_after(format_datetime(when, usegmt=True)) <= 31


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, BillingValidationError),
        (401, BillingAuthenticationError),
        (404, BillingNotFoundError),
        (422, BillingValidationError),
        (429, BillingRateLimitError),
        (503, BillingServerError),
    ],
)
def test_error_tree(status, cls):
    assert error_for_status(status) is cls
    assert issubclass(cls, BillingAPIError) and issubclass(cls, BillingError)


def test_configuration_error_is_improperly_configured():
    from django.core.exceptions import ImproperlyConfigured

    assert issubclass(BillingConfigurationError, ImproperlyConfigured)
    assert issubclass(BillingConfigurationError, BillingError)


def test_redact_json_form_and_text():
    assert redact({"access_token": "abc", "nested": [{"client_secret": "s3"}], "name": "x"}) == {
        "access_token": "[redacted]",
        "nested": [{"client_secret": "[redacted]"}],
        "name": "x",
    }
    text = redact("grant_type=client_credentials&client_id=a&client_secret=TOPSECRET")
    assert "TOPSECRET" not in text and "client_id=a" in text
    assert "tok123" not in redact('{"access_token": "tok123"}')


def test_api_error_text_is_redacted():
    error = BillingAPIError(status=400, operation="token", body={"access_token": "tok-XYZ"})
    assert "tok-XYZ" not in str(error) and "tok-XYZ" not in repr(error)


HTML_PAGE = (
    "<!DOCTYPE html><html><head><title>500 Internal Server Error</title><style>"
    + "body { font-family: sans-serif; } " * 40
    + "</style></head><body><h1>Internal Server Error</h1>"
    + "<p>The server encountered an unexpected condition.</p>" * 100
    + "</body></html>"
)
#: A page whose head alone is longer than the body kept on the exception.
LONG_HEAD_PAGE = HTML_PAGE.replace(
    "<head>", "<head><style>" + "p { margin: 0; } " * 400 + "</style>"
)


@pytest.mark.parametrize(
    "body",
    [
        HTML_PAGE,
        LONG_HEAD_PAGE,
        {"message": "x" * 5000},
        {"error": HTML_PAGE},
        {"errors": [{"message": "y" * 5000, "code": "boom"}]},
    ],
    ids=["html page", "long head", "long message", "html in error", "long errors"],
)
def test_an_error_quotes_a_bounded_excerpt_with_status_and_request_id(body):
    error = BillingServerError(
        status=500, operation="create_product", body=body, request_id="req-42"
    )
    text = str(error)
    assert text.startswith("create_product failed with HTTP 500: ")
    assert text.endswith("(request id req-42)")
    assert len(text) <= 400
    assert "<" not in text and "font-family" not in text  # a page's text, not its markup
    if body in (HTML_PAGE, LONG_HEAD_PAGE):
        assert "Internal Server Error" in text


def test_an_excerpt_leaves_plain_text_alone():
    error = BillingValidationError(status=400, operation="x", body={"message": "a < b > c"})
    assert str(error) == "x failed with HTTP 400: a < b > c"


def test_timestamps_round_trip():
    moment = datetime(2025, 3, 4, 5, 6, 7, 891234, tzinfo=UTC)
    assert format_timestamp(moment) == "2025-03-04T05:06:07.891Z"
    assert parse_timestamp("2025-03-04T05:06:07.891Z") == moment.replace(microsecond=891000)
    assert parse_timestamp("2025-03-04T05:06:07+00:00") == moment.replace(microsecond=0)
    assert parse_timestamp(None) is None
    with pytest.raises(ValueError):
        parse_timestamp("yesterday")
