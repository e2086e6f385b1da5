"""An answer that quotes what the client sent (the token, the client secret) in any form: the
error's text, its ``body`` and the logs never hold it (they are stored as ``last_error`` and
``sync_error`` and shown in the admin, the Health page and ``billing_doctor``)."""

import json
import logging

import pytest
import requests
import responses

from billing_integration.client import BillingClient, RetryPolicy
from billing_integration.exceptions import BillingError
from tests.client.conftest import AUTH_URL, TOKEN, sandbox_client

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_shared_token")]

SECRET = "cl1ent-S3cret/with+chars"
PRODUCT_URL = "http://billing.test/v1/api/billing/products/p1"


def make_client() -> BillingClient:
    return sandbox_client(SECRET, retry=RetryPolicy(max_retries=0))


def shown(error: BillingError, caplog) -> list[str]:
    return [str(error), repr(error), repr(getattr(error, "body", None)), caplog.text]


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (401, {"errors": [{"message": "Invalid access token.", "value": TOKEN}]}),
        (403, {"message": f"Token {TOKEN} may not do this"}),
        (400, {"errors": [{"message": f"bad x-kc-token header {TOKEN}", "code": "bad"}]}),
        (500, {"request": {"headers": {"authorization": f"Bearer {TOKEN}"}}}),
        (502, f"upstream refused Bearer {TOKEN}"),
    ],
)
@responses.activate
def test_an_answer_quoting_the_token_sent_does_not_leak_it(status, body, caplog):
    caplog.set_level(logging.DEBUG)
    responses.post(AUTH_URL, json={"access_token": TOKEN, "expires_in": 300})
    kwargs = {"body": body} if isinstance(body, str) else {"json": body}
    responses.get(PRODUCT_URL, status=status, **kwargs)
    with pytest.raises(BillingError) as info:
        make_client().get_product("p1")
    assert f"HTTP {status}" in str(info.value)
    for text in shown(info.value, caplog):
        assert TOKEN not in text
    assert "[redacted]" in str(info.value)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (401, {"error": "invalid_client", "error_description": f"Unknown secret {SECRET}"}),
        (400, {"error": "invalid_request", "received": f"secret {SECRET!r}"}),
        (400, {"error": "invalid_request", "form": "client_secret=cl1ent-S3cret%2Fwith%2Bchars"}),
        (503, {"message": f"upstream said: '{SECRET}' is not accepted"}),
        (502, f"<html><body><p>POSTed secret: <b>{SECRET}</b></p></body></html>"),
    ],
)
@responses.activate
def test_a_token_answer_quoting_the_client_secret_does_not_leak_it(status, body, caplog):
    caplog.set_level(logging.DEBUG)
    kwargs = {"body": body} if isinstance(body, str) else {"json": body}
    responses.post(AUTH_URL, status=status, **kwargs)
    with pytest.raises(BillingError) as info:
        make_client().get_product("p1")
    assert info.value.operation == "token"
    for text in shown(info.value, caplog):
        assert SECRET not in text
        assert "S3cret" not in text


@pytest.mark.parametrize("fails", ["token", "call"])
@responses.activate
def test_an_error_report_shows_no_local_variable_holding_a_secret(fails, settings):
    """Django's error report (the admins' HTML email, the debug page's frames) hides the locals
    of the client's calls and of what they call: the form with the secret, the token header."""
    import sys

    from django.views.debug import ExceptionReporter

    settings.DEBUG = False
    if fails == "token":
        responses.post(AUTH_URL, body=requests.ConnectionError("refused"))
    else:
        responses.post(AUTH_URL, json={"access_token": TOKEN, "expires_in": 300})
        responses.get(PRODUCT_URL, body=requests.ConnectionError("refused"))
    try:
        make_client().get_product("p1")
    except BillingError:
        report = ExceptionReporter(None, *sys.exc_info()).get_traceback_html()
    assert "billing_integration/client/client.py" in report  # the client's frames are shown
    assert SECRET not in report and TOKEN not in report


def test_a_secret_short_enough_to_break_the_json_still_gives_a_redacted_error():
    """A secret that also stands in the answer's JSON syntax (here ``1``): the error is still
    built, with the body as redacted text."""
    from billing_integration.exceptions import BillingAPIError

    error = BillingAPIError(status=500, operation="x", body={"code": 123, "k": "1"}, sent=("1",))
    assert "1" not in json.dumps(error.body) and "1" not in str(error).split(":", 1)[1]


LIST_URL = "http://billing.test/v1/api/billing/customers"


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@responses.activate
def test_a_list_redirected_to_another_host_never_sends_it_the_token(status):
    """A page answered with a redirect to another host (a moved service, a hostile proxy):
    requests followed it with every header, ``x-kc-token`` included (it only drops
    ``Authorization``). The client follows no redirect: the pull fails with a clear error."""
    responses.post(AUTH_URL, json={"access_token": TOKEN, "expires_in": 300})
    responses.get(LIST_URL, status=status, headers={"Location": "http://evil.test/customers"})
    responses.get("http://evil.test/customers", json={"data": []})
    with pytest.raises(BillingError, match=f"HTTP {status}.*redirect"):
        list(make_client().list_customers())
    assert [c.request.url.split("?")[0] for c in responses.calls] == [AUTH_URL, LIST_URL]


@pytest.mark.parametrize("status", [307, 308])
@responses.activate
def test_a_token_call_redirected_to_another_host_never_sends_it_the_secret(status):
    """A 307/308 makes requests send the same POST, form and client secret included, to the
    new address."""
    responses.post(AUTH_URL, status=status, headers={"Location": "http://evil.test/token"})
    responses.post("http://evil.test/token", json={"access_token": TOKEN, "expires_in": 300})
    with pytest.raises(BillingError):
        list(make_client().list_customers())
    assert [c.request.url for c in responses.calls] == [AUTH_URL]


@responses.activate
def test_a_next_link_to_another_host_in_a_page_is_never_followed():
    """Pages page by ``offset`` on BASE_URL: a ``links.next`` (or any field beside ``data``)
    is not read, so its host never gets a request, nor the token."""
    row = {"id": "7d7b7c1e-1d7a-4b53-9e0e-3f1c2b1a0c01", "identifier": "a"}
    evil = "http://evil.test/customers?page=2"
    extra = {"links": {"next": evil}, "meta": {"total_count": 2}}
    responses.post(AUTH_URL, json={"access_token": TOKEN, "expires_in": 300})
    responses.get(LIST_URL, json={"data": [row], **extra})
    responses.get(LIST_URL, json={"data": [], **extra})
    responses.get(evil, json={"data": [dict(row, id="7d7b7c1e-1d7a-4b53-9e0e-3f1c2b1a0c02")]})
    assert list(make_client().list_customers()) == [row]
    hosts = {c.request.url.split("/")[2] for c in responses.calls}
    assert hosts == {"auth.test", "billing.test"}
