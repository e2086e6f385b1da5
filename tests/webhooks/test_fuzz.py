"""Property-based fuzz of the endpoint: no body, header set or envelope gives a 5xx."""

from __future__ import annotations

import json
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing_integration.models import WebhookEvent

from .conftest import SECRET, as_meta, sign

URL = "/billing/webhooks/"
pytestmark = pytest.mark.django_db

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

header_text = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=300)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
types_ = st.sampled_from(
    [
        "invoice.paid",
        "payment.failed",
        "refund.approved",
        "subscription.renewal",
        "Invoice Marked as uncollectable",
        "",
        "x" * 300,
        "unknown.type",
    ]
) | st.text(max_size=40)
data_ = st.fixed_dictionaries(
    {},
    optional={
        "id": st.uuids().map(str) | st.text(max_size=40) | st.integers(),
        "status": st.text(max_size=20),
        "amount": st.integers()
        | st.floats(allow_nan=True, allow_infinity=True)
        | st.text(max_size=10),
        "currency": st.text(max_size=10) | st.integers(),
        "customer": st.uuids().map(str) | st.text(max_size=10),
        "subscription": st.uuids().map(str) | st.none(),
        "payment": st.uuids().map(str),
        "date_updated": st.text(max_size=30) | st.integers(),
        "cycle_start_date": st.text(max_size=30) | st.none(),
    },
)
envelopes = st.fixed_dictionaries(
    {"type": types_, "data": data_ | json_values},
    optional={
        "id": st.uuids().map(str) | st.text(max_size=300) | st.integers() | st.none(),
        "created_at": st.text(max_size=30) | st.integers() | st.floats(allow_nan=False),
    },
)


def not_finite(value) -> bool:
    """``value`` holds a float NaN or infinity (which ``json.dumps`` writes as non-JSON)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(not_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(not_finite(v) for v in value)
    return False


@pytest.fixture
def fuzz_settings(settings, eager):
    # Inline processing: the handlers see the fuzzed data in the request, too.
    settings.BILLING = {
        **settings.BILLING,
        "WEBHOOK_SECRET": SECRET,
    }


@FUZZ
@given(
    body=st.binary(max_size=2000),
    headers=st.dictionaries(
        st.sampled_from(
            [
                "webhook-id",
                "webhook-timestamp",
                "webhook-signature",
                "authorization",
                "svix-id",
                "content-type",
                "x-anything",
            ]
        ),
        header_text,
    ),
)
def test_random_bytes_and_headers_never_5xx(client, fuzz_settings, body, headers):
    response = client.post(URL, data=body, content_type="application/json", **as_meta(headers))
    assert response.status_code < 500
    assert response.status_code in (400, 401, 413)


@FUZZ
@given(
    body=st.binary(max_size=2000) | json_values.map(lambda v: json.dumps(v).encode()),
    msg_id=header_text,
    skew=st.integers(min_value=-10_000, max_value=10_000),
)
def test_signed_random_bodies_never_5xx(
    client, fuzz_settings, body, msg_id, skew, django_capture_on_commit_callbacks
):
    headers = sign(body, msg_id=msg_id or "m", timestamp=int(time.time()) + skew)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(URL, data=body, content_type="application/json", **as_meta(headers))
    assert response.status_code < 500, response.content


@FUZZ
@given(env=envelopes)
def test_signed_random_envelopes_never_5xx_and_are_stored(
    client, fuzz_settings, env, django_capture_on_commit_callbacks
):
    body = json.dumps(env).encode()
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            URL, data=body, content_type="application/json", **as_meta(sign(body))
        )
    assert response.status_code == 200, response.content
    stored = WebhookEvent.objects.get(event_id=response.json()["id"])
    if not_finite(env):
        # not JSON (Python writes and reads it): stored, and never applied
        assert stored.state != "processed"
