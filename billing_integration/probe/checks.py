"""The built-in checks of ``billing_probe``, in the order they run: read-only ones first, then
the ``--write`` ones. Each is a function ``(probe) -> findings`` registered with ``@check``;
adding a guess is one more such function (docs/guesses.md, "Adding a check")."""

from __future__ import annotations

import re
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count

from .. import currencies
from ..checkout.changes import CHANGE_ACTION, PATCH_AUTO_RENEW, refuses_guess
from ..client.client import PAGE_SIZE
from ..conf import billing_settings, guesses
from ..exceptions import BillingError
from ..timestamps import format_timestamp, parse_timestamp
from . import CONFIRMED, CONTRADICTED, UNKNOWN, Finding, Probe, check, not_checked

RESOURCES = ("products", "customers", "subscriptions")
#: ``expires_in`` values read as seconds that are plausible for an access token.
PLAUSIBLE_SECONDS = (10, 86400)
#: The interface's timestamp form: ISO 8601 UTC with milliseconds.
STRICT_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
PROBE_NAME = "billing-probe"

# The interface's tables (section 2): field -> type. "ts": a timestamp; "?": may be null.
TOKEN_FIELDS = {
    "access_token": "str",
    "expires_in": "int",
    "refresh_expires_in": "int",
    "refresh_token": "str",
    "token_type": "str",
    "not-before-policy": "int",
    "session_state": "str",
    "scope": "str",
}
_META = {
    "id": "uuid",
    "date_created": "ts",
    "date_updated": "ts?",
    "user_created": "uuid",
    "user_updated": "uuid?",
}
FIELDS: dict[str, dict[str, str]] = {
    "products": {
        **_META,
        "name": "str",
        "description": "str",
        "status": "str",
        "selected_currencies": "list",
        "subscription_blueprint": "uuid?",
        "prices": "list?",
        "image": "any",
        "features": "list",
    },
    "customers": {
        **_META,
        "status": "str",
        "identifier": "str",
        "first_name": "str",
        "last_name": "str",
        "email": "str",
        "address_line_1": "str?",
        "address_line_2": "str?",
        "phone": "str?",
    },
    "subscriptions": {
        **_META,
        "status": "str",
        "product": "uuid",
        "customer": "uuid",
        "cycle_start_date": "ts?",
        "cycle_end_date": "ts?",
        "next_billing_date": "ts?",
        "auto_renew": "bool",
        "discount_coupon": "any",
        "trial_end_date": "ts?",
        "selected_billing_cycle": "str",
        "selected_currency": "str",
    },
    "checkout_sessions": {
        **_META,
        "status": "str",
        "customer": "uuid",
        "product": "uuid",
        "expires_at": "ts",
        "action": "str",
        "completed_at": "ts?",
        "selected_billing_cycle": "str",
        "selected_currency": "int",
    },
}


def _is(value: Any, kind: str) -> bool:
    if kind.endswith("?"):
        return value is None or _is(value, kind[:-1])
    if kind == "any":
        return True
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "list":
        return isinstance(value, list)
    if kind == "uuid":
        try:
            return isinstance(value, str) and bool(uuid.UUID(value))
        except ValueError:
            return False
    return isinstance(value, str)  # str, ts


def shape_problems(item: Any, table: dict[str, str]) -> list[str]:
    """How ``item`` differs from an interface table (missing fields, other types)."""
    if not isinstance(item, dict):
        return [f"an item is a {type(item).__name__}, not an object"]
    problems = [f"{name} missing" for name in table if name not in item]
    problems += [
        f"{name} is {type(item[name]).__name__} ({_excerpt(item[name])}), not {kind}"
        for name, kind in table.items()
        if name in item and not _is(item[name], kind)
    ]
    return problems


def _excerpt(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _join(parts: list[str], limit: int = 6) -> str:
    more = f" (+{len(parts) - limit} more)" if len(parts) > limit else ""
    return "; ".join(parts[:limit]) + more


def _unavailable(answer: Any) -> bool:
    """The service failed or limited the call (5xx, 429): the answer shows nothing of a guess."""
    return bool(answer.status == 429 or answer.status >= 500)


def _no_answer(answer: Any) -> bool:
    """A write unavailable (``_unavailable``) or applied with its answer lost (2xx, not JSON):
    the answer shows nothing of a guess."""
    lost = answer.status < 300 and not isinstance(answer.body, dict | list)
    return bool(lost or _unavailable(answer))


def _code(body: Any) -> str:
    """The error code of an error body in the interface's guessed shape, else an excerpt."""
    try:
        return str(body["errors"][0]["code"])
    except (KeyError, IndexError, TypeError):
        return _excerpt(body, 120)


# --- the token ------------------------------------------------------------------------------
@check("token")
def token(probe: Probe) -> Iterator[Finding]:
    answer = probe.token_call()
    body = answer.body if isinstance(answer.body, dict) else {}
    if answer.status != 200 or not isinstance(body.get("access_token"), str):
        assumed = "the token call answers the fields of section 2.5"
        seen = f"HTTP {answer.status}, {_excerpt(probe.scrubbed(answer.body), 120)}"
        if _unavailable(answer):
            yield Finding("token_fields", UNKNOWN, assumed, seen, relied_on=False)
        else:
            seen += (
                " (check BILLING['CLIENT_ID'], BILLING['CLIENT_SECRET'], BILLING['AUTH_URL'] "
                "and BILLING['REALM'])"
            )
            yield Finding("token_fields", CONTRADICTED, assumed, seen, "CLIENT_SECRET")
        return
    probe.token = body["access_token"]
    problems = shape_problems(body, TOKEN_FIELDS)
    yield Finding(
        "token_fields",
        CONTRADICTED if problems else CONFIRMED,
        "the token answer has the 8 fields of section 2.5 (the app reads access_token and "
        "expires_in)",
        _join(problems) if problems else "all 8 fields, of the documented types",
        relied_on=any(p.startswith(("access_token", "expires_in")) for p in problems),
    )
    lifetime = body.get("expires_in")
    low, high = PLAUSIBLE_SECONDS
    plausible = isinstance(lifetime, int | float) and low <= lifetime <= high
    seen = f"expires_in = {lifetime!r}"
    if isinstance(lifetime, int | float) and lifetime > high:
        seen += f": {lifetime / 1000:g} s if milliseconds; the app would keep the token that long"
    assumed = f"expires_in is in seconds ({low} s to {high} s is plausible)"
    yield Finding("expires_in_unit", CONFIRMED if plausible else CONTRADICTED, assumed, seen)
    answer = probe.call("token accepted", "GET", "/products", params={"limit": 1, "offset": 0})
    probe.notes["products_status"] = answer.status
    accepted, refused = answer.status < 400, answer.status in (401, 403)
    seen = f"GET /products with x-kc-token: HTTP {answer.status}"
    verdict = CONFIRMED if accepted else CONTRADICTED if refused else UNKNOWN
    if accepted and not isinstance(answer.body, dict):  # a page, say: no sign it was read
        verdict, seen = UNKNOWN, f"{seen}, not a JSON object: {_excerpt(answer.body, 80)}"
    elif answer.status == 404:
        seen += ": the list itself is not there (check BASE_URL)"
    assumed = "the token is sent as the x-kc-token header (not Authorization)"
    yield Finding("token_header", verdict, assumed, seen)


# --- the lists ------------------------------------------------------------------------------
@check("lists")
def lists(probe: Probe) -> Iterator[Finding]:
    if probe.token is None:
        return
    found: dict[str, list[Any]] = {}
    wrapping: list[str] = []
    unavailable: list[str] = []
    for resource in RESOURCES:
        params = {"limit": PAGE_SIZE, "offset": 0}
        answer = probe.call(f"list {resource}", "GET", f"/{resource}", params=params)
        body = answer.body
        if _unavailable(answer):
            unavailable.append(f"GET /{resource}: HTTP {answer.status}, {_excerpt(body, 80)}")
        elif answer.status >= 400 or not isinstance(body, dict) or "data" not in body:
            wrapping.append(f"GET /{resource}: HTTP {answer.status}, {_excerpt(body, 80)}")
        elif not isinstance(body["data"], list):
            wrapping.append(f"GET /{resource}: data is a {type(body['data']).__name__}")
        else:
            found[resource] = body["data"]
    probe.notes["lists"] = found
    if wrapping or unavailable:
        verdict, seen = CONTRADICTED if wrapping else UNKNOWN, _join(wrapping + unavailable)
    else:
        verdict, seen = CONFIRMED, "all three lists are wrapped in data"
    yield Finding("data_wrapping", verdict, 'every list answer is {"data": [...]}', seen)
    problems, counts = [], []
    for resource, items in found.items():
        counts.append(f"{len(items)} {resource}")
        for item in items:
            problems += [f"{resource}: {p}" for p in shape_problems(item, FIELDS[resource])]
    problems = list(dict.fromkeys(problems))
    seen_any = any(found.values())
    yield Finding(
        "field_names",
        CONTRADICTED if problems else CONFIRMED if seen_any else UNKNOWN,
        "field names and types are those of the interface's tables (section 2)",
        _join(problems) if problems else f"read {', '.join(counts)}" if seen_any else "no items",
    )
    yield _timestamps([(r, i) for r, items in found.items() for i in items])


def _timestamps(items: list[tuple[str, Any]]) -> Finding:
    """Every timestamp field: the interface's form, and one the app reads."""
    unreadable, other_form, total = [], [], 0
    for resource, item in items:
        if not isinstance(item, dict):
            continue
        for name, kind in FIELDS[resource].items():
            value = item.get(name)
            if not kind.startswith("ts") or value is None:
                continue
            total += 1
            try:
                ok = isinstance(value, str) and parse_timestamp(value) is not None
            except ValueError:
                ok = False
            if not ok:
                unreadable.append(f"{resource}.{name} = {_excerpt(value)}")
            elif not STRICT_TIMESTAMP.match(value):
                other_form.append(f"{resource}.{name} = {value}")
    assumed = "timestamps are ISO 8601 UTC with milliseconds (2026-01-31T12:00:00.000Z)"
    if unreadable:
        return Finding("timestamps", CONTRADICTED, assumed, "unreadable: " + _join(unreadable))
    if not total:
        return Finding("timestamps", UNKNOWN, assumed, "no timestamp read (no items)")
    seen = f"{total} read"
    if other_form:
        seen += "; another form the app reads too: " + _join(other_form, 3)
    return Finding("timestamps", CONFIRMED, assumed, seen)


# --- currencies -----------------------------------------------------------------------------
@check("currencies")
def currency_checks(probe: Probe) -> Iterator[Finding]:
    found = probe.notes.get("lists", {})
    table = dict(billing_settings.CURRENCIES)
    ids: set[Any] = set()
    forms: set[str] = set()
    by_product: dict[str, set[Any]] = {}  # product id -> its currency ids
    for product in found.get("products", []):
        if not isinstance(product, dict):
            continue
        named = by_product.setdefault(str(product.get("id")), set())
        for value in product.get("selected_currencies") or []:
            forms.add(type(value).__name__)
            named.add(int(str(value)) if currencies.is_id(value) else value)
        for price in product.get("prices") or []:
            if isinstance(price, dict):
                named.add(price.get("currency"))
        ids |= named
    # What an id stands for shows in a subscription of its product, in a currency code.
    agree, disagree = 0, []
    for sub in found.get("subscriptions", []):
        code = sub.get("selected_currency") if isinstance(sub, dict) else None
        theirs = by_product.get(str(sub.get("product"))) if isinstance(sub, dict) else None
        if not isinstance(code, str) or currencies.is_id(code) or not theirs:
            continue
        if code.upper() in {str(table.get(i, "")).upper() for i in theirs}:
            agree += 1
        else:
            listed = ", ".join(f"{i} = {table.get(i, '?')}" for i in sorted(theirs, key=str))
            disagree.append(f"a subscription in {code} of a product in {listed}")
    in_setting = ", ".join(f"{k} = {v}" for k, v in list(table.items())[:4])
    in_setting += ", ..." if len(table) > 4 else ""
    assumed = f"currency ids are those of BILLING['CURRENCIES'] ({in_setting})"
    unknown_ids = sorted((i for i in ids if i not in table), key=str)
    listed = f"ids {', '.join(map(str, sorted(ids, key=str)))} (written as {', '.join(forms)})"
    if unknown_ids:
        verdict = CONTRADICTED
        seen = f"ids not in the setting: {', '.join(map(str, unknown_ids))}"
    elif disagree:
        verdict = CONTRADICTED
        seen = "another currency than the setting names: " + _join(list(dict.fromkeys(disagree)))
    elif ids and agree:
        verdict = CONFIRMED
        seen = f"{listed}; {agree} subscription(s) in the currency their product's id names"
    elif ids:
        verdict = UNKNOWN
        seen = f"{listed}, in the setting; no subscription of them names a currency code"
    else:
        verdict = UNKNOWN
        seen = "no product with a currency to read" + ("" if probe.write else " (try --write)")
    yield Finding("currency_ids", verdict, assumed, seen, "CURRENCIES")
    form = guesses()["subscription_currency_form"]
    values = {
        s.get("selected_currency")
        for s in found.get("subscriptions", [])
        if isinstance(s, dict) and s.get("selected_currency") is not None
    }
    assumed = f'a subscription\'s selected_currency is a currency {form} ("{form}")'
    if not values:
        seen = "no subscription to read"
        yield Finding("subscription_currency_form", UNKNOWN, assumed, seen, _FORM)
        return
    as_ids = {v for v in values if currencies.is_id(v)}
    codes = values - as_ids
    wrong = codes if form == "id" else as_ids
    unknown_codes = {c for c in codes if str(c).upper() not in {v.upper() for v in table.values()}}
    seen = f"selected_currency values: {', '.join(sorted(map(str, values))[:6])}"
    if wrong:
        yield Finding("subscription_currency_form", CONTRADICTED, assumed, seen, _FORM)
    elif unknown_codes or {v for v in as_ids if int(str(v)) not in table}:
        yield Finding("subscription_currency_form", CONTRADICTED, assumed, seen, "CURRENCIES")
    else:
        yield Finding("subscription_currency_form", CONFIRMED, assumed, seen, _FORM)


_FORM = "GUESSES['subscription_currency_form']"


# --- pagination -----------------------------------------------------------------------------
@check("pagination")
def pagination(probe: Probe) -> Iterator[Finding]:
    if probe.token is None:
        return
    found = probe.notes.get("lists", {})
    assumed = "lists page with limit and offset (a page of 1 holds 1; offset moves on)"
    setting = "no setting (PAGE_SIZE and MAX_PAGES are constants of billing_integration.client)"
    resource = next((r for r in RESOURCES if len(found.get(r, [])) >= 2), None)
    if resource is None:
        seen = "no list with 2 items to page through" + ("" if probe.write else " (try --write)")
        yield Finding("pagination", UNKNOWN, assumed, seen, setting, relied_on=False)
        return
    pages = []
    for offset in (0, 1):
        params = {"limit": 1, "offset": offset}
        answer = probe.call(f"page {resource}", "GET", f"/{resource}", params=params)
        if _unavailable(answer):
            seen = f"GET /{resource}?limit=1&offset={offset}: HTTP {answer.status}"
            yield Finding("pagination", UNKNOWN, assumed, seen, setting, relied_on=False)
            return
        data = answer.body.get("data") if isinstance(answer.body, dict) else None
        pages.append(data if isinstance(data, list) else [])
    first, second = pages
    ids = [[i.get("id") for i in page if isinstance(i, dict)] for page in pages]
    copes = "; the app copes: it stops at a page with nothing new, so it reads one big answer"
    if len(first) != 1:
        seen = f"GET /{resource}?limit=1 answered {len(first)} items: limit is ignored" + copes
        yield Finding("pagination", CONTRADICTED, assumed, seen, setting, relied_on=False)
    elif len(second) != 1 or ids[0] == ids[1]:
        seen = f"offset=1 answered {len(second)} item(s), the same as offset=0: offset is ignored"
        yield Finding("pagination", CONTRADICTED, assumed, seen + copes, setting, relied_on=False)
    else:
        seen = f"GET /{resource}?limit=1 answered 1 item; offset=1 the next one"
        yield Finding("pagination", CONFIRMED, assumed, seen, setting, relied_on=False)


# --- errors ---------------------------------------------------------------------------------
@check("errors")
def errors(probe: Probe) -> Iterator[Finding]:
    if probe.token is None:
        return
    missing = str(uuid.uuid4())
    answer = probe.call("unknown product", "GET", f"/products/{missing}")
    unavailable = _unavailable(answer)
    seen = f"GET /products/<a random uuid>: HTTP {answer.status}"
    verdict = CONFIRMED if answer.status == 404 else CONTRADICTED
    if unavailable or answer.status in (401, 403):  # the id was never looked at
        verdict = UNKNOWN
    elif answer.status == 404 and probe.notes.get("products_status") == 404:
        verdict, seen = UNKNOWN, f"{seen}, as GET /products: the path's 404, not the id's"
    yield Finding("unknown_id_status", verdict, "an unknown id is answered 404", seen)
    body = answer.body
    entries = body.get("errors") if isinstance(body, dict) else None
    shaped = isinstance(entries, list) and all(
        isinstance(e, dict) and "code" in e and "message" in e for e in entries
    )
    yield Finding(
        "error_shape",
        UNKNOWN if unavailable else CONFIRMED if shaped and entries else CONTRADICTED,
        'an error body is {"errors": [{"message", "code", "field"}]} (codes such as '
        "invalid_transition); the app only quotes its message",
        f"HTTP {answer.status}: {_excerpt(body, 160)}",
        relied_on=False,
    )


# --- the event callback (what this project received) ----------------------------------------
@check("events")
def events(probe: Probe) -> Iterator[Finding]:
    from ..models import EventState, WebhookEvent

    received = WebhookEvent.objects.exclude(state=EventState.REJECTED)
    by_type: Counter[str] = Counter()
    unrecognised: Counter[str] = Counter()
    for row in received.values("raw_type", "state").annotate(n=Count("pk")):
        by_type[row["raw_type"]] += row["n"]
        if row["state"] == EventState.UNRECOGNISED:
            unrecognised[row["raw_type"]] += row["n"]
    assumed = (
        "event types are named like subscription.renewal, SubscriptionRenewal or "
        "SUBSCRIPTION_RENEWAL, with the object in data"
    )
    if not by_type:
        seen = "no delivery received yet (this reads the deliveries stored here)"
        yield Finding("event_types", UNKNOWN, assumed, seen, "EVENT_TYPE_ALIASES")
    elif unrecognised:
        listed = ", ".join(f"{t or '(none)'} x{n}" for t, n in sorted(unrecognised.items()))
        seen = f"unrecognised: {listed} (admin: Event deliveries, 'Unrecognised events')"
        yield Finding("event_types", CONTRADICTED, assumed, seen, "EVENT_TYPE_ALIASES")
    else:
        listed = ", ".join(sorted(by_type)[:8])
        yield Finding("event_types", CONFIRMED, assumed, f"all understood: {listed}")


@check("signing")
def signing(probe: Probe) -> Iterator[Finding]:
    from ..health import refused_deliveries
    from ..models import WebhookEvent

    methods = dict(
        WebhookEvent.objects.values_list("verified_by").annotate(n=Count("pk")).order_by()
    )
    refused = {r: v["count"] for r, v in refused_deliveries().items() if v["count"]}
    assumed = "deliveries are signed as Standard Webhooks (webhook-id, -timestamp, -signature)"
    signed = methods.get("signature", 0)
    bad = {r: n for r, n in refused.items() if r in ("bad_signature", "missing_headers")}
    seen = f"verified by: {methods or 'none yet'}; refused in the last hour: {refused or 'none'}"
    verdict = CONFIRMED if signed else CONTRADICTED if bad else UNKNOWN
    yield Finding("signing", verdict, assumed, seen, "WEBHOOK_SECRET")


# --- write: idempotency, products, a checkout session ---------------------------------------
@check("idempotency", write=True)
def idempotency(probe: Probe) -> Iterator[Finding]:
    if probe.token is None:
        return
    stamp = uuid.uuid4().hex[:12]
    customer = {
        "identifier": f"{PROBE_NAME}-{stamp}",
        "first_name": "Billing",
        "last_name": "Probe",
        "email": f"{PROBE_NAME}-{stamp}@example.invalid",
    }
    key = str(uuid.uuid4())
    answers = [
        probe.call("probe customer", "POST", "/customers", payload=customer, idempotency_key=key)
        for _ in range(2)
    ]
    ids = [_data(a).get("id") for a in answers]
    probe.notes["customer"] = ids[0] or ids[1]
    assumed = "a key sent again with the same body answers the first object (no second one)"
    conflict = "a key sent again with another body is refused (422, naming idempotency)"
    seen = f"HTTP {answers[0].status} then {answers[1].status}; ids {ids[0]} then {ids[1]}"
    same = answers[1].status < 400 and ids[0] is not None and ids[0] == ids[1]
    verdict = UNKNOWN if any(map(_no_answer, answers)) else CONFIRMED if same else CONTRADICTED
    if answers[0].status >= 400 and not _unavailable(answers[0]):  # no customer to replay
        seen = f"the probe customer was refused: HTTP {answers[0].status}, "
        seen += _excerpt(answers[0].body, 120)
        yield Finding("idempotency_replay", UNKNOWN, assumed, seen)
        yield Finding("idempotency_conflict", UNKNOWN, conflict, "not tried", relied_on=False)
        return
    yield Finding("idempotency_replay", verdict, assumed, seen)
    other = {**customer, "first_name": "Other"}
    answer = probe.call("key reused", "POST", "/customers", payload=other, idempotency_key=key)
    refused = answer.status in (409, 422) and "idempotency" in str(answer.body).lower()
    verdict = UNKNOWN if _unavailable(answer) else CONFIRMED if refused else CONTRADICTED
    seen = f"HTTP {answer.status}: {_excerpt(answer.body, 120)}"
    yield Finding("idempotency_conflict", verdict, conflict, seen, relied_on=False)


@check("products", write=True)
def products(probe: Probe) -> Iterator[Finding]:
    if probe.token is None:
        return
    currency = next(iter(billing_settings.CURRENCIES))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")

    def create(suffix: str) -> tuple[Any, str | None]:
        payload = {
            "name": f"{PROBE_NAME} {stamp} {suffix} (do not sell)",
            "description": "Created by manage.py billing_probe --write; archived by it.",
            "status": "draft",
            "selected_currencies": [str(currency)],
            "subscription_blueprint": {
                "billing_type": "flat-rate",
                "billing_cycles": [
                    {
                        "cycle": "months",
                        "frequency": 1,
                        "prices": [{"currency": currency, "amount": 1}],
                    }
                ],
            },
        }
        answer = probe.call("probe product", "POST", "/products", payload=payload)
        return answer, _data(answer).get("id")

    first, first_id = create("A")
    assumed = f"a draft product in currency {currency} is created as the app sends it"
    if first_id is None:
        seen = f"HTTP {first.status}: {_code(first.body)}"
        if _no_answer(first):
            seen += f"; product A ({PROBE_NAME} {stamp} A) may exist"
            yield Finding("product_create", UNKNOWN, assumed, seen)
            return
        setting = "CURRENCIES" if "currenc" in str(first.body).lower() else "no setting"
        yield Finding("product_create", CONTRADICTED, assumed, seen, setting)
        return
    problems = shape_problems(_data(first), FIELDS["products"])
    verdict = CONTRADICTED if problems else CONFIRMED
    yield Finding("product_create", verdict, assumed, _join(problems) or f"created {first_id}")
    accepted: list[str] = []
    refused: list[str] = []
    failed: list[str] = []
    left: list[str] = probe.notes.setdefault("left", [])

    def move(name: str, remote_id: str, old: str, new: str) -> str:
        """One status move: accepted, refused, or no answer (it may have been applied)."""
        path, payload = f"/products/{remote_id}", {"status": new}
        try:
            answer = probe.call(f"{old} -> {new}", "PATCH", path, payload=payload)
        except BillingError as exc:
            failed.append(f"{old} -> {new}: {exc}")
            left.append(f"product {name} {remote_id} may be left {old}")
            return "no answer"
        if answer.status < 400 and _data(answer).get("status") == new:
            accepted.append(f"{old} -> {new}")
            left[:] = [note for note in left if remote_id not in note]
            return "accepted"
        if _no_answer(answer):
            failed.append(f"{old} -> {new}: HTTP {answer.status}, {_code(answer.body)}")
            left.append(f"product {name} {remote_id} may be left {old}")
            return "no answer"
        refused.append(f"{old} -> {new}: HTTP {answer.status} {_code(answer.body)}")
        left.append(f"product {name} {remote_id} left {old}")
        return "refused"

    try:
        _, second_id = create("B")
    except BillingError as exc:
        second_id = None
        failed.append(f"creating product B: {exc}")
    move("A", first_id, "draft", "archived")
    published = move("B", second_id, "draft", "published") if second_id else "refused"
    if second_id is not None and published == "accepted":
        # B can be sold while published: whatever fails here, it is archived after.
        for guess, part in (
            ("checkout_session", _checkout),
            ("change_plan_action", _change_action),
        ):
            try:
                yield from part(probe, second_id, currency)
            except BillingError as exc:
                yield not_checked(guess, exc)
    if second_id is not None and published != "refused":  # published, or may be
        move("B", second_id, "published", "archived")
    seen = "accepted: " + (", ".join(accepted) or "none")
    if refused:
        seen += "; refused: " + _join(refused)
    if failed:
        seen += "; failed: " + _join(failed)
    if left:
        seen += "; " + ", ".join(left)
    yield Finding(
        "status_moves",
        CONTRADICTED if refused else UNKNOWN if failed else CONFIRMED,
        "a product moves draft -> published, draft -> archived and published -> archived "
        "(the admin's Publish and Archive)",
        seen,
    )


def _session(customer: Any, product_id: str, currency: int, action: str) -> dict[str, Any]:
    """A checkout session's payload, open for 5 minutes."""
    return {
        "customer": customer,
        "product": product_id,
        "expires_at": format_timestamp(datetime.now(UTC) + timedelta(minutes=5)),
        "action": action,
        "selected_currency": currency,
        "selected_billing_cycle": "months-1",
    }


def _checkout(probe: Probe, product_id: str, currency: int) -> Iterator[Finding]:
    customer = probe.notes.get("customer")
    assumed = (
        "a checkout session takes selected_currency as an integer id and action "
        "new_subscription, and answers status open"
    )
    if not customer:
        yield Finding("checkout_session", UNKNOWN, assumed, "no probe customer was created")
        return
    payload = _session(customer, product_id, currency, "new_subscription")
    answer = probe.call("probe checkout", "POST", "/checkout_sessions", payload=payload)
    data = _data(answer)
    problems = shape_problems(data, FIELDS["checkout_sessions"]) if data else []
    if answer.status >= 400 or not data:
        seen = f"HTTP {answer.status}: {_code(answer.body)}"
    elif data.get("status") != "open":
        problems.append(f"status {data.get('status')!r}, not 'open'")
        seen = _join(problems)
    else:
        seen = _join(problems) or f"session {data.get('id')} open (not completed)"
    ok = answer.status < 400 and bool(data) and not problems
    verdict = UNKNOWN if _no_answer(answer) else CONFIRMED if ok else CONTRADICTED
    yield Finding("checkout_session", verdict, assumed, seen)


def _change_action(probe: Probe, product_id: str, currency: int) -> Iterator[Finding]:
    """A checkout session whose ``action`` is a plan change (the configured one, else
    ``upgrade``): does the service take it? (docs/changes.md)"""
    configured = guesses()["change_plan_action"]
    action = configured or "upgrade"
    assumed = f"a checkout session with action {action!r} changes a plan"
    customer = probe.notes.get("customer")
    if not customer:
        yield Finding("change_plan_action", UNKNOWN, assumed, "no probe customer", _ACTION)
        return
    payload = {**_session(customer, product_id, currency, action), "upgrade_to": product_id}
    answer = probe.call("change checkout", "POST", "/checkout_sessions", payload=payload)
    seen = f"HTTP {answer.status}: {_code(answer.body) or _excerpt(_data(answer).get('id'))}"
    verdict = _accepted(answer, CHANGE_ACTION)
    data = _data(answer)
    carried = (data.get("action"), data.get("upgrade_to")) == (action, product_id)
    if verdict == CONFIRMED and not data:  # the answer lost, or unreadable
        verdict = UNKNOWN
    elif verdict == CONFIRMED and not carried:  # taken as a new subscription: a second plan
        verdict = CONTRADICTED
        seen = (
            f"HTTP {answer.status}, but the session has action {_excerpt(data.get('action'))}"
            f" and upgrade_to {_excerpt(data.get('upgrade_to'))}: not a plan change"
        )
    yield Finding("change_plan_action", verdict, assumed, seen, _ACTION, bool(configured))


@check("patch_subscription", write=True)
def patch_subscription(probe: Probe) -> Iterator[Finding]:
    """``PATCH /subscriptions/{id}`` with the subscription's own ``auto_renew`` (a change of
    nothing): does the operation exist? (docs/changes.md)"""
    if probe.token is None:
        return
    assumed = "PATCH /subscriptions/{id} takes auto_renew (stop and resume renewal)"
    relied_on = bool(guesses()["patch_auto_renew"])
    listed = _data_list(
        probe.call("a subscription", "GET", "/subscriptions", params={"limit": 1, "offset": 0})
    )
    first = listed[0] if listed else {}
    verdict = UNKNOWN
    if not first.get("id"):
        seen = "no subscription on the service to try it on"
    elif not isinstance(first.get("auto_renew"), bool):
        # Anything else sent would be a change: true resumes renewal (and charges).
        seen = f"auto_renew is {_excerpt(first.get('auto_renew'))}, not a boolean: not patched"
    else:
        body = {"auto_renew": first["auto_renew"]}
        path = f"/subscriptions/{first['id']}"
        answer = probe.call("PATCH subscription", "PATCH", path, payload=body)
        verdict = _accepted(answer, PATCH_AUTO_RENEW)
        seen = f"HTTP {answer.status}: {_code(answer.body)}"
    yield Finding("patch_subscription", verdict, assumed, seen, _PATCH, relied_on)


_ACTION = "GUESSES['change_plan_action']"
_PATCH = "GUESSES['patch_auto_renew']"


def _accepted(answer: Any, guess: str) -> str:
    """2xx: confirmed; refused as the app switches the guess off (``refuses_guess``: 404, 405,
    or a 400 or 422 naming the guessed field unknown): contradicted; otherwise (a 400 about the
    object or a value, no answer) unknown."""
    if answer.status < 300:
        return CONFIRMED
    return CONTRADICTED if refuses_guess(guess, answer.status, answer.body) else UNKNOWN


def _data_list(answer: Any) -> list[dict[str, Any]]:
    body = answer.body
    data = body.get("data") if isinstance(body, dict) else None
    return [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []


def _data(answer: Any) -> dict[str, Any]:
    body = answer.body
    data = body.get("data") if isinstance(body, dict) else None
    return data if isinstance(data, dict) else {}


# --- last: what the probe met on the way ----------------------------------------------------
@check("rate_limits")
def rate_limits(probe: Probe) -> Iterator[Finding]:
    assumed = "a rate limit answers 429 with Retry-After (the app waits that long, every worker)"
    limited = [a for a in probe.answers if a["status"] == 429]
    if not limited:
        seen = f"no 429 in {len(probe.answers)} calls (the probe does not provoke one)"
        yield Finding("rate_limits", UNKNOWN, assumed, seen, relied_on=False)
        return
    waits = [a["headers"].get("retry-after") for a in limited]
    seen = f"{len(limited)} answer(s) 429, Retry-After: {', '.join(map(str, waits))}"
    verdict = CONFIRMED if all(waits) else CONTRADICTED
    yield Finding("rate_limits", verdict, assumed, seen, relied_on=False)
