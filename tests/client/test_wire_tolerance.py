"""The client against answers the interface says nothing about (redirects, odd token answers,
204s, bodies in other shapes): a clear error of the package's tree, nothing sent twice, no
secret sent or shown anywhere else."""

import json
import logging
import time

import pytest
import requests
import responses
from django.core.cache import caches

from billing_integration.client import BillingClient, Deadline, RetryPolicy
from billing_integration.exceptions import BillingAPIError, BillingError, BillingTransportError
from tests.client.conftest import AUTH_URL, TOKEN, sandbox_client

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_shared_token")]

SECRET = "cl1ent-S3cret"
API = "http://billing.test/v1/api/billing"


def make_client(**kwargs) -> BillingClient:
    kwargs.setdefault("retry", RetryPolicy(max_retries=2))
    return sandbox_client(SECRET, **kwargs)


def to_elsewhere() -> list:
    return [c.request for c in responses.calls if "elsewhere.test" in c.request.url]


@pytest.mark.parametrize("status", [301, 302, 307, 308])
@responses.activate
def test_a_redirected_call_is_not_followed_with_the_token(status, caplog):
    caplog.set_level(logging.DEBUG)
    responses.post(AUTH_URL, json={"access_token": TOKEN, "expires_in": 300})
    location = "http://elsewhere.test/v1/api/billing/products"
    responses.post(API + "/products", status=status, headers={"Location": location})
    responses.post(location, json={"data": {"id": "p1"}})
    responses.get(location, json={"data": [{"id": "p1"}]})
    with pytest.raises(BillingAPIError) as info:
        make_client().create_product({"name": "x"})
    assert not to_elsewhere()
    assert not info.value.retryable and info.value.status == status
    assert location in str(info.value)
    assert len([c for c in responses.calls if c.request.url == API + "/products"]) == 1
    assert TOKEN not in str(info.value) + repr(info.value) + caplog.text
    assert info.value.in_doubt  # a write answered 3xx may have been applied


@pytest.mark.parametrize("status", [301, 302, 303, 307])
@pytest.mark.parametrize("method", ["POST", "PATCH"])
@responses.activate
def test_a_write_answered_3xx_is_in_doubt_and_sent_once(status, method):
    """303 See Other is a service's "done, look there": the write may have been applied. The
    error is in doubt (the caller keeps its idempotency key), not retried, not followed."""
    responses.post(AUTH_URL, json={"access_token": TOKEN, "expires_in": 300})
    location = "http://elsewhere.test/v1/api/billing/products/p1"
    path = "/products" if method == "POST" else "/products/p1"
    responses.add(method, API + path, status=status, headers={"Location": location})
    client = make_client()
    with pytest.raises(BillingAPIError) as info:
        if method == "POST":
            client.create_product({"name": "x"}, idempotency_key="key-1")
        else:
            client.update_product("p1", {"name": "x"}, idempotency_key="key-1")
    assert info.value.in_doubt and not info.value.retryable and info.value.status == status
    assert location in str(info.value)
    assert not to_elsewhere()
    sent = [c.request for c in responses.calls if c.request.url == API + path]
    assert [r.headers["x-idempotency-id"] for r in sent] == ["key-1"]
    assert TOKEN not in str(info.value) + repr(info.value)


@pytest.mark.parametrize("status", [301, 302, 303, 307])
@responses.activate
def test_a_read_answered_3xx_is_an_error_not_in_doubt(status):
    responses.post(AUTH_URL, json={"access_token": TOKEN, "expires_in": 300})
    responses.get(API + "/products/p1", status=status, headers={"Location": "/elsewhere"})
    with pytest.raises(BillingAPIError) as info:
        make_client().get_product("p1")
    assert not info.value.in_doubt and not info.value.retryable
    assert str(info.value) == f"get_product failed with HTTP {status}: redirected to /elsewhere"


@pytest.mark.parametrize("status", [301, 302, 307, 308])
@responses.activate
def test_a_redirected_token_call_does_not_send_the_secret_on(status):
    location = "http://elsewhere.test/token"
    responses.post(AUTH_URL, status=status, headers={"Location": location})
    responses.post(location, json={"access_token": TOKEN, "expires_in": 300})
    responses.get(location, json={"access_token": TOKEN, "expires_in": 300})
    with pytest.raises(BillingError) as info:
        make_client().get_product("p1")
    assert not to_elsewhere()
    assert info.value.operation == "token" and location in str(info.value)
    assert SECRET not in str(info.value)


@pytest.mark.parametrize(
    ("expires_in", "probed"),
    [
        ("300", 300.0),
        (300.5, 300.5),
        (1e300, 86400.0),
        *[(odd, 0.0) for odd in (None, "", "soon", "nan", "Infinity", -5, [300], True)],
    ],
)
@responses.activate
def test_a_token_answer_with_an_odd_expires_in_gives_a_token_kept_for_a_while(expires_in, probed):
    """``expires_in`` as a string, missing, not a number, not finite, negative or absurd: the
    token is used (for its lifetime, at most a day, else ``DEFAULT_LIFETIME``), one fetch for
    several calls; ``probe_token`` reports 0 for an unreadable one."""
    answer = {"access_token": TOKEN}
    if expires_in is not None:
        answer["expires_in"] = expires_in
    responses.post(AUTH_URL, json=answer)
    responses.get(API + "/products/p1", json={"data": {"id": "p1"}})
    client = make_client()
    assert client.get_product("p1") == {"id": "p1"}
    assert make_client().get_product("p1") == {"id": "p1"}  # another process: the shared one
    assert len([c for c in responses.calls if c.request.url == AUTH_URL]) == 1
    assert client.probe_token() == probed


@pytest.mark.parametrize(
    ("operation", "method", "path", "args"),
    [
        ("get_product", "GET", "/products/p1", ("p1",)),
        ("update_product", "PATCH", "/products/p1", ("p1", {"name": "y"})),
    ],
)
@pytest.mark.parametrize("data", [None, "ok", 7, [], [{"id": "p1"}, {"id": "p2"}]])
@responses.activate
def test_a_call_answered_with_data_that_is_not_one_object_is_a_lost_answer(
    operation, method, path, args, data
):
    """``{"data": null}``, a string, a number or a list of other than one object, where one
    resource is the answer: read again (the same key for a write), not handed on as it is."""
    responses.post(AUTH_URL, json={"access_token": TOKEN, "expires_in": 300})
    responses.add(method, API + path, json={"data": data})
    responses.add(method, API + path, json={"data": {"id": "p1", "name": "y"}})
    assert getattr(make_client(), operation)(*args) == {"id": "p1", "name": "y"}
    sent = [c.request for c in responses.calls if c.request.url == API + path]
    assert len(sent) == 2
    if method == "PATCH":
        assert sent[0].headers["x-idempotency-id"] == sent[1].headers["x-idempotency-id"]


@pytest.mark.parametrize("token", ["tök€n-0123", "line\nbreak-0123", " lead-0123", "", 12345, {}])
@responses.activate
def test_a_token_that_cannot_be_sent_as_a_header_is_refused_at_once(token, caplog):
    """A token that is not visible ASCII text (a header cannot carry it: UnicodeEncodeError
    out of http.client, InvalidHeader from requests, retried as a connection failure and the
    service taken as down): the token answer is refused, nothing is sent with it."""
    caplog.set_level(logging.DEBUG)
    responses.post(AUTH_URL, json={"access_token": token, "expires_in": 300})
    responses.get(API + "/products/p1", json={"data": {"id": "p1"}})
    client = make_client()
    with pytest.raises(BillingError) as info:
        client.get_product("p1")
    assert type(info.value).__name__ == "BillingAuthenticationError"
    assert info.value.operation == "token" and not info.value.retryable
    assert [c.request.url for c in responses.calls] == [AUTH_URL]
    assert client.backoff.wait() == 0
    if isinstance(token, str) and token:
        assert "0123" not in str(info.value) + repr(info.value.body) + caplog.text


@responses.activate
def test_a_shared_cache_outage_leaves_each_process_its_own_token(settings):
    """``BILLING['CACHE']`` unreachable (a Redis on a closed port): the token is fetched and
    kept by the process, a 401 still fetches one more, and the calls go through."""
    settings.CACHES = {
        **settings.CACHES,
        "down": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
            "OPTIONS": {"socket_connect_timeout": 0.2, "socket_timeout": 0.2},
        },
    }
    settings.BILLING = {**settings.BILLING, "CACHE": "down"}
    responses.post(AUTH_URL, json={"access_token": TOKEN, "expires_in": 300})
    responses.post(AUTH_URL, json={"access_token": TOKEN + "2", "expires_in": 300})
    path = API + "/products/p1"
    responses.get(path, json={"data": {"id": "p1"}})
    responses.get(path, json={"data": {"id": "p1"}})
    responses.get(path, status=401)
    responses.get(path, json={"data": {"id": "p1"}})
    client = make_client()
    for _ in range(3):
        assert client.get_product("p1") == {"id": "p1"}
    tokens = [c.request.headers.get("x-kc-token") for c in responses.calls if c.request.url == path]
    assert tokens == [TOKEN, TOKEN, TOKEN, TOKEN + "2"]
    assert len([c for c in responses.calls if c.request.url == AUTH_URL]) == 2


@pytest.mark.parametrize(
    ("content_type", "name", "encoding"),
    [
        ("text/plain", "Crème brûlée €", "utf-8"),
        ("text/html", "Crème brûlée €", "utf-8"),
        ("application/json", "Crème brûlée €", "utf-8"),
        ("application/json; charset=iso-8859-1", "Crème brûlée", "latin-1"),
    ],
)
@responses.activate
def test_json_is_read_as_utf_8_whatever_the_content_type_says(content_type, name, encoding):
    """JSON is UTF-8 (RFC 8259): an answer labelled ``text/plain`` or ``text/html`` with no
    charset (which requests reads as ISO-8859-1) keeps its accents; one that is not UTF-8 is
    read in the charset its header names."""
    responses.post(AUTH_URL, json={"access_token": TOKEN, "expires_in": 300})
    body = f'{{"data": {{"id": "p1", "name": "{name}"}}}}'.encode(encoding)
    responses.get(API + "/products/p1", body=body, content_type=content_type)
    client = make_client()
    assert client.get_product("p1")["name"] == name
    assert client.raw("GET", "/products/p1", token=TOKEN).body["data"]["name"] == name


@pytest.mark.parametrize("resource", ["products", "customers", "subscriptions"])
@responses.activate
def test_a_list_answered_204_no_content_is_empty(resource):
    responses.post(AUTH_URL, json={"access_token": TOKEN, "expires_in": 300})
    responses.get(API + f"/{resource}", status=204)
    assert list(getattr(make_client(), f"list_{resource}")()) == []
    assert len([c for c in responses.calls if c.request.url.startswith(API)]) == 1


@pytest.mark.parametrize("failure", [{"status": 503}, {"status": 401}])
@responses.activate
def test_a_refresh_ahead_of_expiry_that_fails_keeps_the_current_token(failure):
    """The token is due for refresh (80% of its life) but still valid, and the token call
    fails: the call goes through with the current token; once expired, the failure is raised."""
    responses.post(AUTH_URL, **failure)
    responses.get(API + "/products/p1", json={"data": {"id": "p1"}})
    client = make_client(retry=RetryPolicy(max_retries=0))
    now = time.time()
    due = {"access_token": TOKEN, "refresh_at": now - 1, "expires_at": now + 60}
    caches["default"].set(client.tokens._key, due, 60)
    assert client.get_product("p1") == {"id": "p1"}
    sent = [c.request for c in responses.calls if c.request.url.startswith(API)]
    assert [r.headers["x-kc-token"] for r in sent] == [TOKEN]
    caches["default"].set(client.tokens._key, {**due, "expires_at": now - 1}, 60)
    with pytest.raises(BillingError):
        make_client(retry=RetryPolicy(max_retries=0)).get_product("p1")


@responses.activate
def test_a_deadline_used_up_by_the_token_call_sends_nothing_more():
    """The token arrives when the deadline has passed: the call raises the deadline's
    ``BillingTransportError`` (it raised urllib3's ValueError for a zero timeout), unsent."""
    now = [0.0]
    deadline = Deadline(5, clock=lambda: now[0])

    def token(request):
        now[0] += 10  # the token call took the whole deadline
        return 200, {}, json.dumps({"access_token": TOKEN, "expires_in": 300})

    responses.add_callback(responses.POST, AUTH_URL, callback=token)
    responses.get(API + "/products/p1", json={"data": {"id": "p1"}})
    with pytest.raises(BillingTransportError, match="no time left"):
        make_client().get_product("p1", deadline=deadline)
    assert not [c for c in responses.calls if c.request.url.startswith(API)]


@responses.activate
def test_a_redirect_quoting_the_token_does_not_show_it():
    """The ``Location`` (and the request id) come from the service: where they quote the token
    sent, the error reads ``[redacted]``."""
    responses.post(AUTH_URL, json={"access_token": TOKEN, "expires_in": 300})
    location = f"https://billing.test/login?next=/products/p1&x-kc-token={TOKEN}"
    headers = {"Location": location, "x-request-id": f"req-{TOKEN}"}
    responses.get(API + "/products/p1", status=302, headers=headers)
    with pytest.raises(BillingAPIError) as info:
        make_client().get_product("p1")
    assert TOKEN not in str(info.value) + info.value.request_id and "[redacted]" in str(info.value)
    assert "https://billing.test/login" in str(info.value)


@responses.activate
def test_an_error_text_keeps_its_own_words_whatever_the_token():
    """A token as short as a letter is cleaned from what the service wrote, not from the
    operation's name and the status the text starts with."""
    responses.post(AUTH_URL, json={"access_token": "t", "expires_in": 300})
    responses.get(API + "/products/p1", status=302, headers={"Location": "/elsewhere"})
    with pytest.raises(BillingAPIError) as info:
        make_client().get_product("p1")
    assert str(info.value) == "get_product failed with HTTP 302: redirected to /elsewhere"


@pytest.mark.parametrize(
    ("failure", "text"),
    [
        (requests.ConnectionError("refused"), "connection failed (ConnectionError)"),
        (requests.ConnectTimeout("no answer"), "timed out"),
    ],
)
@responses.activate
def test_a_token_call_that_reaches_nothing_names_the_setting_to_check(failure, text):
    responses.post(AUTH_URL, body=failure)
    with pytest.raises(BillingTransportError) as info:
        make_client(retry=RetryPolicy(max_retries=0)).get_product("p1")
    assert str(info.value) == f"token: {text}: check BILLING['AUTH_URL']"


@responses.activate
def test_another_call_that_reaches_nothing_names_no_token_setting():
    responses.post(AUTH_URL, json={"access_token": TOKEN, "expires_in": 300})
    responses.get(API + "/products/p1", body=requests.ConnectionError("refused"))
    with pytest.raises(BillingTransportError) as info:
        make_client(retry=RetryPolicy(max_retries=0)).get_product("p1")
    assert str(info.value) == "get_product: connection failed (ConnectionError)"


@responses.activate
def test_a_token_url_not_found_names_the_settings_to_check():
    responses.post(AUTH_URL, status=404, json={"error": "Realm does not exist"})
    with pytest.raises(BillingAPIError) as info:
        make_client().get_product("p1")
    assert type(info.value).__name__ == "BillingNotFoundError" and not info.value.retryable
    assert str(info.value) == (
        "token failed with HTTP 404: no token endpoint at this URL "
        "(check BILLING['AUTH_URL'] and BILLING['REALM']): Realm does not exist"
    )
    assert len(responses.calls) == 1


@pytest.mark.parametrize("status", [400, 401, 403])
@responses.activate
def test_refused_credentials_name_the_settings_to_check(status):
    body = {"error": "unauthorized_client", "error_description": "Invalid client secret"}
    responses.post(AUTH_URL, status=status, json=body)
    with pytest.raises(BillingAPIError) as info:
        make_client().get_product("p1")
    assert type(info.value).__name__ == "BillingAuthenticationError"
    assert str(info.value) == (
        f"token failed with HTTP {status}: credentials refused "
        "(check BILLING['CLIENT_ID'] and BILLING['CLIENT_SECRET']): Invalid client secret"
    )
    assert SECRET not in str(info.value) + repr(info.value.body)


@responses.activate
def test_find_subscription_knows_its_id_in_any_spelling_of_the_uuid():
    """The mapping reads an id in capitals as the same UUID: the lookup of one does too (a
    subscription the list shows was taken for one the service does not have)."""
    remote_id = "0b6b6a2e-5b0c-4f7e-9a51-3c1f0e6d2a10"
    responses.post(AUTH_URL, json={"access_token": TOKEN, "expires_in": 300})
    row = {"id": remote_id.upper(), "status": "published"}
    responses.get(API + "/subscriptions", json={"data": [row]})
    assert make_client().find_subscription(remote_id) == row


@pytest.mark.parametrize("answer", [{}, {"expires_in": "soon"}], ids=["missing", "unreadable"])
@responses.activate
def test_a_token_answer_without_a_usable_expires_in_is_logged_as_such(answer, caplog):
    """The log said "expires_in=60s" as if the service had said so."""
    responses.post(AUTH_URL, json={"access_token": TOKEN, **answer})
    responses.get(API + "/products/p1", json={"data": {"id": "p1"}})
    with caplog.at_level(logging.INFO, logger="billing_integration.client"):
        make_client().get_product("p1")
    (line,) = [r.getMessage() for r in caplog.records if "token" in r.getMessage()]
    assert "no usable expires_in" in line and "60s" in line
    assert TOKEN not in caplog.text


@responses.activate
def test_a_list_whose_next_page_repeats_a_full_page_warns_it_may_be_cut(caplog):
    """A service that honours ``limit`` but not ``offset`` answers its first page again and
    again: the list ends there (nothing new), and the log says the rest may be unread; it was
    silent (a pull reported success with the first page only)."""
    responses.post(AUTH_URL, json={"access_token": TOKEN, "expires_in": 300})
    rows = [{"id": "c1"}, {"id": "c2"}]
    responses.get(API + "/customers", json={"data": rows})
    with caplog.at_level(logging.WARNING, logger="billing_integration.client"):
        assert list(make_client(page_size=2).list_customers()) == rows
    assert "may ignore offset" in caplog.text and "list_customers" in caplog.text


@responses.activate
def test_a_list_answered_whole_on_every_page_does_not_warn(caplog):
    """A service that ignores both ``limit`` and ``offset`` answers the whole list each time:
    read once, nothing to warn about."""
    responses.post(AUTH_URL, json={"access_token": TOKEN, "expires_in": 300})
    rows = [{"id": "c1"}, {"id": "c2"}, {"id": "c3"}]
    responses.get(API + "/customers", json={"data": rows})
    with caplog.at_level(logging.WARNING, logger="billing_integration.client"):
        assert list(make_client(page_size=2).list_customers()) == rows
    assert "offset" not in caplog.text
