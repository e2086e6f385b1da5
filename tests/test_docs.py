"""The documentation site says what the code does.

The site itself is built by ``make docs`` (part of ``make test``, warnings as errors). These
tests pin what a build cannot see: every setting has a description (the settings reference is
generated from them), every system check id in the code is explained in troubleshooting.md
and no page names an id the code does not have, and the event payloads of events.md are
processed by the app and have the fields the sandbox sends, and every name the pages' code
uses (public imports, command options, make targets, template tags, Celery task, permission
and URL names, settings keys) exists.
"""

from __future__ import annotations

import base64
import importlib.util
import inspect
import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.dispatch import Signal
from django.urls import reverse

from billing_integration.conf import DEFAULTS, DOCS, REQUIRED
from billing_integration.models import (
    Customer,
    EventState,
    Invoice,
    Payment,
    Product,
    Refund,
    Subscription,
    WebhookEvent,
)
from billing_integration.outbox import from_remote
from billing_integration.testing import sign_webhook
from billing_integration.webhooks import signals
from billing_integration.webhooks.types import CANONICAL_TYPES

ROOT = Path(__file__).resolve().parent.parent
DOCS_DIR = ROOT / "docs"
CHECK_ID = re.compile(r"billing_integration\.([EW]\d{3})")
SHORT_ID = re.compile(r"(?<![\w.])`?([EW]0\d\d)\b")


def _ext():
    spec = importlib.util.spec_from_file_location(
        "billing_docs", DOCS_DIR / "_ext" / "billing_docs.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- settings ---------------------------------------------------------------------------------


def test_every_setting_has_a_one_line_description():
    assert sorted(set(DEFAULTS) - set(DOCS)) == [], "add the key's description to conf.DOCS"
    assert sorted(set(DOCS) - set(DEFAULTS)) == [], "conf.DOCS describes a key DEFAULTS lacks"
    for key, text in DOCS.items():
        assert text.strip() and "\n" not in text, key


def test_the_settings_reference_lists_every_key_with_its_default():
    lines = _ext().settings_markdown()
    rows = {line.split("|")[1].strip().strip("`"): line for line in lines if line.startswith("| `")}
    assert set(rows) == set(DEFAULTS)
    for key, env in REQUIRED.items():
        assert f"**required** (`{env}`)" in rows[key]
    assert "`300`" in rows["CHECKOUT_EXPIRY"] and DOCS["CHECKOUT_EXPIRY"] in rows["CHECKOUT_EXPIRY"]


def test_settings_are_grouped_by_the_comments_of_conf_py():
    source = """DEFAULTS = {
    # --- connection ----------
    "A": 1,
    # a comment that is no group
    "B": 2,
    # --- wake-ups: kicks (more) ---
    "C": 3,
}
"""
    groups = _ext().setting_groups(source, ["A", "B", "C", "D"])
    assert groups == [("connection", ["A", "B"]), ("wake-ups", ["C"]), ("other", ["D"])]


# --- system checks ----------------------------------------------------------------------------


def _ids_in_code() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "billing_integration").rglob("*.py"):
        found |= set(CHECK_ID.findall(path.read_text(encoding="utf-8")))
    return found


def test_every_check_id_of_the_code_is_explained_in_troubleshooting():
    page = (DOCS_DIR / "troubleshooting.md").read_text(encoding="utf-8")
    ids = _ids_in_code()
    assert len(ids) > 10
    missing = sorted(i for i in ids if f"### `billing_integration.{i}`" not in page)
    assert missing == [], f"add a section per check id to docs/troubleshooting.md: {missing}"


def test_no_page_names_a_check_id_the_code_does_not_have():
    ids = _ids_in_code()
    named: dict[str, set[str]] = {}
    for path in [ROOT / "README.md", *sorted(DOCS_DIR.glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for found in set(CHECK_ID.findall(text)) | set(SHORT_ID.findall(text)):
            named.setdefault(found, set()).add(path.name)
    unknown = {i: sorted(pages) for i, pages in named.items() if i not in ids}
    assert unknown == {}


def test_the_pages_name_the_admin_section_as_the_admin_shows_it():
    """``*Billing > Products*``, ``admin index → *Billing*``: the app's ``verbose_name``."""
    from django.apps import apps

    section = apps.get_app_config("billing_integration").verbose_name
    named = []
    for path in [ROOT / "README.md", *sorted(DOCS_DIR.glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        named += re.findall("\\*(\\w[\\w ]*?) [>\u203a] ", text)
        named += re.findall(r"admin index → \*([^*]+)\*", text)
    assert len(named) >= 3 and set(named) == {section}, named


# --- events -----------------------------------------------------------------------------------


def documented_events() -> dict[str, dict]:
    """The example payload of each ``### `type` `` section of docs/events.md."""
    page = (DOCS_DIR / "events.md").read_text(encoding="utf-8")
    found = re.findall(r"^### `([a-z_.]+)`\n\n```json\n(.*?)^```", page, re.S | re.M)
    events = {name: json.loads(body) for name, body in found}
    assert len(events) == len(found), "a type is documented twice"
    return events


def test_events_page_has_one_example_per_canonical_type_and_names_every_signal():
    events = documented_events()
    assert sorted(events) == sorted(CANONICAL_TYPES)
    for name, envelope in events.items():
        assert envelope["type"] == name
    page = (DOCS_DIR / "events.md").read_text(encoding="utf-8")
    names = ["billing_event_received", *(t.replace(".", "_") for t in CANONICAL_TYPES)]
    in_code = [n for n, value in vars(signals).items() if isinstance(value, Signal)]
    assert sorted(in_code) == sorted(names)
    assert [n for n in names if f"`{n}`" not in page] == []


CUSTOMER = "5f0c1c9e-7c1a-4d51-9a5b-1f3c2b8e4a10"
PRODUCT = "8d3b6a2e-0f4c-4e8a-b1d2-3c4e5f6a7b80"
SUBSCRIPTION = "c2a7e0d4-5b6f-4a3c-9e81-2f4d6b8a0c13"
#: The status each type stores, as docs/events.md says ("The type decides the status").
STORED_STATUS = {
    "subscription.renewal": "published",
    "subscription.canceled": "canceled",
    "subscription.paused": "paused",
    "payment.completed": "completed",
    "payment.failed": "failed",
    "payment.canceled": "canceled",
    "refund.initiated": "initiated",
    "refund.approved": "approved",
    "refund.rejected": "rejected",
    "invoice.paid": "paid",
    "invoice.voided": "void",
    "invoice.marked_uncollectable": "uncollectable",
    "invoice.deleted": "deleted",
}
MODELS = {"subscription": Subscription, "payment": Payment, "refund": Refund, "invoice": Invoice}


@pytest.mark.django_db
@pytest.mark.parametrize("event_type", sorted(CANONICAL_TYPES))
def test_each_documented_payload_is_applied(
    event_type, client, settings, django_capture_on_commit_callbacks, eager
):
    """Posted as docs/testing.md shows (signed with ``sign_webhook``), each example is stored,
    applied (not stale, not failed) and gives its object the status the page promises."""
    secret = "whsec_" + base64.b64encode(b"docs example secret, 32 bytes!!").decode()
    settings.BILLING = {
        **settings.BILLING,
        "WEBHOOK_SECRET": secret,
    }
    with from_remote():  # the objects the examples name, known locally (no pull needed)
        customer = Customer.objects.create(remote_id=CUSTOMER, identifier="docs:1")
        product = Product.objects.create(remote_id=PRODUCT, name="Pro", status="published")
        Subscription.objects.create(
            remote_id=SUBSCRIPTION,
            customer=customer,
            product=product,
            customer_remote_id=CUSTOMER,
            product_remote_id=PRODUCT,
            status="published",
            remote_updated=datetime(2026, 2, 1, tzinfo=UTC),
        )
    envelope = documented_events()[event_type]
    body = json.dumps(envelope)
    headers = sign_webhook(body, secret)
    received = []
    signal = signals.SIGNALS[event_type]
    signal.connect(lambda sender, **kwargs: received.append(kwargs), weak=False, dispatch_uid="d")
    try:
        with django_capture_on_commit_callbacks(execute=True):
            response = client.post(
                reverse("billing_integration:webhook"),
                body,
                content_type="application/json",
                headers=headers,
            )
    finally:
        signal.disconnect(dispatch_uid="d")
    assert response.status_code == 200 and response.json()["status"] == "received"
    event = WebhookEvent.objects.get(event_id=envelope["id"])
    assert (event.state, event.outcome, event.error) == (EventState.PROCESSED, "applied", "")
    group = event_type.split(".")[0]
    record = MODELS[group].objects.get(remote_id=envelope["data"]["id"])
    assert record.status == STORED_STATUS[event_type]
    assert record.customer == customer
    [kwargs] = received
    assert kwargs["event"].pk == event.pk and kwargs["event_type"] == event_type
    assert kwargs[group].pk == record.pk and kwargs["data"] == envelope["data"]


@pytest.mark.django_db
def test_documented_payloads_have_the_fields_the_sandbox_sends(billing_sandbox):
    """Each example has the envelope and data keys of the event the sandbox emits for its
    type (triggered on a seeded subscription, its payments and refunds)."""
    billing_sandbox.seed(customers=1, subscriptions=1)
    sub = billing_sandbox.objects("subscription")[0]["id"]
    sent = {}
    for event_type in CANONICAL_TYPES:
        group = event_type.split(".")[0]
        if group == "refund":
            payment = billing_sandbox.trigger("payment.completed", sub)["data"]["id"]
            target = billing_sandbox.trigger("refund.initiated", payment)["data"]["id"]
        else:
            target = sub
        sent[event_type] = billing_sandbox.trigger(event_type, target)
    for event_type, documented in documented_events().items():
        emitted = sent[event_type]
        assert sorted(documented) == sorted(emitted), event_type
        assert sorted(documented["data"]) == sorted(emitted["data"]), event_type
        assert documented["data"]["status"] == emitted["data"]["status"], event_type


def test_the_guesses_page_names_only_settings_that_exist():
    """docs/guesses.md: every ``BILLING['KEY']`` it names is a key of ``conf.DEFAULTS``, and
    every setting a probe finding points at is on the page."""
    from billing_integration.conf import DEFAULTS
    from billing_integration.probe import NO_SETTING

    text = (DOCS_DIR / "guesses.md").read_text(encoding="utf-8")
    named = set(re.findall(r"""BILLING\[["'](\w+)["']\]""", text))
    assert {"CURRENCIES", "EVENT_TYPE_ALIASES", "GUESSES"} <= named
    assert named <= set(DEFAULTS), named - set(DEFAULTS)
    source = (ROOT / "billing_integration" / "probe" / "checks.py").read_text()
    pointed = set(re.findall(r'"([A-Z][A-Z_]{3,})"', source)) - {"GET", "POST", "PATCH"}
    assert pointed >= {"CURRENCIES", "WEBHOOK_SECRET"}
    assert pointed <= set(DEFAULTS) and pointed <= named, pointed - named
    assert NO_SETTING in text


# --- the test helpers -------------------------------------------------------------------------


def test_the_testing_page_names_every_fixture_and_handle_method_as_it_is():
    """docs/testing.md: each fixture of the plugin, and each public method of ``SandboxHandle``
    written as ``name(params)`` with the parameters the method takes."""
    import inspect

    from billing_integration.testing import SandboxHandle, plugin

    page = (DOCS_DIR / "testing.md").read_text(encoding="utf-8").replace("\\|", "|")
    fixture = type(plugin.billing_sandbox)
    fixtures = [name for name, value in vars(plugin).items() if isinstance(value, fixture)]
    assert {"billing_sandbox", "billing_inline"} <= set(fixtures)
    assert [f for f in fixtures if f"`{f}`" not in page] == []
    for name, method in inspect.getmembers(SandboxHandle, inspect.isfunction):
        if name.startswith("_"):
            continue
        written = re.search(rf"`{name}\(([^`]*?)\)", page)
        assert written, f"docs/testing.md does not show SandboxHandle.{name}()"
        params = [p for p in inspect.signature(method).parameters if p != "self"]
        assert re.findall(r"(?:^|,\s*)\**(\w+)(?=\s*[:=,]|\s*$)", written[1]) == params, name


@pytest.mark.django_db
def test_the_testing_page_lists_what_advance_returns(billing_sandbox):
    page = (DOCS_DIR / "testing.md").read_text(encoding="utf-8")
    [row] = [line for line in page.splitlines() if line.startswith("| `advance(")]
    documented = re.search(r"`\{(.*?)\}`", row)[1]
    assert sorted(re.findall(r'"(\w+)"', documented)) == sorted(billing_sandbox.advance(1))


# --- code a reader pastes ---------------------------------------------------------------------
#
# README.md and docs/*.md show imports, calls, commands and template tags to copy. Each name
# they use exists: the public module exports it, the management command takes the option, the
# Makefile has the target, the template library has the tag or filter.

PAGES = [ROOT / "README.md", *sorted(DOCS_DIR.glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
PUBLIC_IMPORT = re.compile(r"from billing_integration\.billing import (?:\(([^)]*)\)|([^\n]*))")
PUBLIC_ATTRIBUTE = re.compile(r"(?<![\w./])billing\.([A-Za-z_]\w*)\b(?!\.)")
COMMAND = re.compile(r"\b(billing_[a-z_]+)\b([^\n`|#]*)")
MAKE = re.compile(r"(?<![\w-])make ([a-z][\w-]*)")


def _page_text(path: Path) -> str:
    """The page's text; README's "Upgrading" (names that are gone, on purpose) left out."""
    text = path.read_text(encoding="utf-8")
    if path.name == "README.md":
        before, _, after = text.partition("\n## Upgrading\n")
        text = before + "\n## " + after.partition("\n## ")[2]
    return text


def _code(text: str, langs: tuple[str, ...] | None = None) -> list[str]:
    """The fenced blocks (of ``langs``, or all) and, with ``langs`` None, the inline spans."""
    found = [code for lang, code in FENCE.findall(text) if langs is None or lang in langs]
    if langs is None:
        found += re.findall(r"`([^`\n]+)`", FENCE.sub("", text))
    return found


def public_names_used(text: str) -> set[str]:
    """What code on a page takes from ``billing_integration.billing``: the names it imports and
    the attributes it reads of ``billing`` (``from billing_integration import billing``)."""
    names: set[str] = set()
    for code in _code(text):
        for group, line in PUBLIC_IMPORT.findall(code):
            for part in re.sub(r"#[^\n]*", "", group or line).split(","):
                if part.strip():
                    names.add(part.split()[0])
        names |= set(PUBLIC_ATTRIBUTE.findall(code)) - {"py"}  # billing.py: a file
    return names


def command_options_used(text: str, commands: set[str]) -> set[tuple[str, str]]:
    """``(command, --option)`` for each option written after one of the app's commands."""
    used = set()
    for code in _code(text):
        for name, rest in COMMAND.findall(code):
            if name in commands:
                used |= {(name, option) for option in re.findall(r"(?<!\w)--[a-z][\w-]*", rest)}
    return used


def make_targets_used(text: str) -> set[str]:
    return {target for code in _code(text) for target in MAKE.findall(code)}


def template_names_used(text: str) -> tuple[set[str], set[str]]:
    """The tags (``{% name``) and filters (``|name``) of the Django template code on a page."""
    tags: set[str] = set()
    filters: set[str] = set()
    for code in _code(text):
        for tag in re.findall(r"\{%\s*(.*?)\s*%\}", code):
            tags.add(tag.split()[0])
            filters |= set(re.findall(r"\|(\w+)", tag))
        for variable in re.findall(r"\{\{(.*?)\}\}", code):
            filters |= set(re.findall(r"\|(\w+)", variable))
    return tags, filters


def test_the_extractors_see_a_wrong_name():
    page = """Call `billing.nope(user)`, then `billing_sync --nope`, and `make nope`:

```python
from billing_integration.billing import (
    subscribed,  # a comment
    Nope as Other,
)
from billing_integration.billing import sign_webhook
```

```django
{% load billing %}{% nope_tag product %}{{ user|nope_filter:"x" }}
```
"""
    assert public_names_used(page) == {"nope", "subscribed", "Nope", "sign_webhook"}
    assert command_options_used(page, {"billing_sync"}) == {("billing_sync", "--nope")}
    assert make_targets_used(page) == {"nope"}
    assert template_names_used(page) == ({"load", "nope_tag"}, {"nope_filter"})
    assert public_names_used("`billing.py`, `billing.subscription.renewal`") == set()


def test_every_public_name_the_pages_use_is_exported():
    from billing_integration import billing

    used = {path.name: public_names_used(_page_text(path)) for path in PAGES}
    assert len(set().union(*used.values())) > 20
    unknown = {page: sorted(names - set(billing.__all__)) for page, names in used.items()}
    assert {page: names for page, names in unknown.items() if names} == {}


# A page for users imports from the public module only; a settings module, read before the
# apps load, imports the beat schedule from ``billing_integration.schedule`` (it imports nothing).
# CONTRACTS.md is for contributors: it names the private modules.
HOST_IMPORT = re.compile(
    r"^\s*(?:from billing_integration\.(\w+)|import billing_integration\.(\w+))", re.M
)


def test_the_pages_import_from_the_public_module_only():
    found = {}
    for path in PAGES:
        if path.name == "CONTRACTS.md":
            continue
        for code in _code(_page_text(path), ("python", "py", "")):
            modules = {a or b for a, b in HOST_IMPORT.findall(code)} - {"billing", "schedule"}
            if modules:
                found.setdefault(path.name, set()).update(modules)
    assert found == {}


def test_every_command_option_the_pages_use_exists():
    from django.core.management import get_commands, load_command_class

    commands = {name for name, app in get_commands().items() if app == "billing_integration"}
    used = set().union(*(command_options_used(_page_text(path), commands) for path in PAGES))
    assert {("billing_sync", "--push"), ("billing_doctor", "--json")} <= used
    unknown = []
    for name, option in sorted(used):
        parser = load_command_class("billing_integration", name).create_parser("manage.py", name)
        if option not in parser._option_string_actions:
            unknown.append(f"{name} {option}")
    assert unknown == []


def test_every_make_target_the_pages_use_exists():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    used = set().union(*(make_targets_used(_page_text(path)) for path in PAGES))
    assert {"demo", "test", "docs"} <= used
    assert sorted(used - targets) == []


def test_every_template_tag_and_filter_the_pages_use_exists():
    from django.template import engines

    engine = engines["django"].engine
    libraries = [*engine.template_builtins, *engine.template_libraries.values()]
    tags = set().union(*(library.tags for library in libraries))
    filters = set().union(*(library.filters for library in libraries))
    tags |= {f"end{tag}" for tag in tags} | {"else", "elif", "empty", "plural"}
    used_tags: set[str] = set()
    used_filters: set[str] = set()
    for path in PAGES:
        found_tags, found_filters = template_names_used(_page_text(path))
        used_tags |= found_tags
        used_filters |= found_filters
    assert {"billing_checkout_button", "if_feature"} <= used_tags and "has_feature" in used_filters
    assert sorted(used_tags - tags) == [] and sorted(used_filters - filters) == []


DOTTED = re.compile(r"(?<![\w/])billing_integration\.([a-z_]+)\b(?![./])")
URL_NAME = re.compile(r"billing_integration:([a-z_]+)")
SETTING_KEY = re.compile(r"""BILLING\[["']([A-Z_]+)["']\]""")


def dotted_names_used(text: str) -> set[str]:
    """``billing_integration.<name>`` that is no module: a Celery task or a permission."""
    import importlib

    names = set()
    for name in set(DOTTED.findall(text)):
        try:
            importlib.import_module(f"billing_integration.{name}")
        except ImportError:
            names.add(name)
    return names


def test_the_name_extractors_see_a_wrong_name():
    page = "`billing_integration.nope_task`, `billing_integration.models`, `E001`, "
    page += "`billing_integration.E001`, `reverse('billing_integration:nope')`, `BILLING['NOPE']`"
    assert dotted_names_used(page) == {"nope_task"}  # check ids are upper case
    assert set(URL_NAME.findall(page)) == {"nope"} and SETTING_KEY.findall(page) == ["NOPE"]


def test_every_task_permission_and_url_name_the_pages_use_exists():
    """``billing_integration.sync_all`` (a Celery task, in a beat schedule or a route),
    ``billing_integration.view_report`` (a permission), ``billing_integration:checkout`` (a URL
    name): each is the app's."""
    from celery import current_app
    from django.apps import apps
    from django.urls import get_resolver

    current_app.loader.import_default_modules()
    prefix = "billing_integration."
    tasks = {name.removeprefix(prefix) for name in current_app.tasks if name.startswith(prefix)}
    permissions = set()
    for model in apps.get_app_config("billing_integration").get_models():
        permissions |= {codename for codename, _ in model._meta.permissions}
        actions = model._meta.default_permissions
        permissions |= {f"{action}_{model._meta.model_name}" for action in actions}
    urls = get_resolver().namespace_dict["billing_integration"][1].reverse_dict
    url_names = {key for key in urls if isinstance(key, str)}
    dotted, named = set(), set()
    for path in PAGES:
        text = _page_text(path)
        dotted |= dotted_names_used(text)
        named |= set(URL_NAME.findall(text))
    assert {"sync_all", "view_report"} <= dotted and {"checkout", "webhook"} <= named
    assert sorted(dotted - tasks - permissions) == [] and sorted(named - url_names) == []


def test_every_setting_the_pages_name_is_a_key_of_billing():
    """``BILLING['KEY']`` and the keys of ``BILLING = {...}`` blocks are keys of
    ``conf.DEFAULTS``; a removed key is named only where E000's refusal of it is explained."""
    from billing_integration.conf import REMOVED

    unknown = {}
    for path in PAGES:
        text = _page_text(path)
        keys = set(SETTING_KEY.findall(text))
        for code in _code(text, ("python",)):
            if re.search(r"^BILLING = \{", code, re.M):
                keys |= set(re.findall(r'^\s+"([A-Z_]+)":', code, re.M))
        allowed = set(DEFAULTS) | (set(REMOVED) if path.name == "troubleshooting.md" else set())
        if keys - allowed:
            unknown[path.name] = sorted(keys - allowed)
    assert unknown == {}


def test_the_pages_install_the_package_from_a_checkout_or_a_wheel():
    """The package is not on PyPI: a ``pip install`` of it names a path (a checkout, ``.``,
    or a wheel), never the bare name, which pip would look up on PyPI."""
    bare = []
    for path in PAGES:
        for line in _page_text(path).splitlines():
            for spec in re.findall(
                r"pip install (?:-e )?'?([^\s'`]*billing_integration[^\s'`]*)", line
            ):
                if "/" not in spec and not spec.startswith("."):
                    bare.append(f"{path.name}: {spec}")
    assert bare == []


def test_the_settings_page_names_every_key_the_reader_refuses_by_its_shape():
    """docs/settings.md lists the keys whose wrong shape is E000 (``conf._SHAPES``, and the
    currency table read beside them)."""
    from billing_integration.conf import _SHAPES

    page = (DOCS_DIR / "settings.md").read_text(encoding="utf-8")
    listed = re.search(r"a value of the wrong shape \((.*?): see", page, re.S)
    assert listed, "docs/settings.md no longer lists the keys read by their shape"
    named = set(re.findall(r"`([A-Z_]+)`", listed[1]))
    assert sorted({*_SHAPES, "CURRENCIES"} - named) == [] and sorted(named - set(DEFAULTS)) == []


def test_the_quick_start_names_every_marker_a_ci_run_refuses_to_skip():
    """docs/quickstart.md says which markers skip without their server or tool and fail under
    CI: every one of ``tests/conftest.py``'s ``BACKENDS``."""
    from tests.conftest import BACKENDS

    page = (DOCS_DIR / "quickstart.md").read_text(encoding="utf-8")
    sentence = re.search(r"^- Tests marked (.*?) are\s+skipped", page, re.M | re.S)
    assert sentence, "docs/quickstart.md no longer says which tests are skipped"
    assert sorted(set(BACKENDS) - set(re.findall(r"`(\w+)`", sentence[1]))) == []


def test_the_contracts_page_names_every_operation_of_the_client():
    """docs/CONTRACTS.md's client block lists each public method of ``BillingClient``: the
    names the other layers (checkout, pages, the probe, the doctor) call it by."""
    from billing_integration.client import BillingClient

    page = (DOCS_DIR / "CONTRACTS.md").read_text(encoding="utf-8")
    block = re.search(r"^## Client .*?^```python\n(.*?)^```", page, re.S | re.M)
    assert block, "docs/CONTRACTS.md no longer has the client's block"
    named = set(re.findall(r"^client\.(\w+)\(", block[1], re.M))
    named |= set(re.findall(r" / client\.(\w+)\(", block[1]))
    methods = {
        name
        for name, value in vars(BillingClient).items()
        if not name.startswith("_") and callable(value)
    }
    assert sorted(methods - named) == []


def _documented_params(params: str) -> inspect.Signature | None:
    """The signature a page writes as ``name(params)``, None when it is no Python parameter list."""
    namespace: dict[str, object] = {}
    try:
        exec(f"def documented({params}): pass", namespace)  # the page's text, not a call
    except SyntaxError:
        return None
    return inspect.signature(namespace["documented"])  # type: ignore[arg-type]


def test_the_contracts_page_writes_the_mirror_functions_as_they_are_called():
    """The names and kinds (keyword-only or not) of the parameters docs/CONTRACTS.md gives the
    mirror's functions are theirs, and it leaves out no parameter they require."""
    import importlib

    modules = [
        importlib.import_module(f"billing_integration.{name}")
        for name in (
            "mapping.products",
            "mapping.subscriptions",
            "mapping.checkout",
            "sync.pull",
            "customers",
            "outbox.push",
            "outbox.tasks",
            "outbox.signals",
            "outbox.retry",
            "service",
        )
    ]
    page = (DOCS_DIR / "CONTRACTS.md").read_text(encoding="utf-8")
    block = re.search(r"^## Mirror .*?^```python\n(.*?)^```", page, re.S | re.M)
    assert block, "docs/CONTRACTS.md no longer has the mirror's block"
    code = re.sub(r"#[^\n]*", "", block[1])
    wrong, seen = [], 0
    for name, params in re.findall(r"(?<![\w\"])([a-z_][\w.]*)\(([^()]*)\)", code):
        written = _documented_params(params)
        real = [getattr(m, name.rsplit(".", 1)[-1], None) for m in modules]
        real = [f for f in real if callable(f) and not isinstance(f, type)]
        if written is None or not real:
            continue
        seen += 1

        def agrees(function: object) -> bool:
            """Positional parameters by position (a page may name them for what they are),
            keyword-only ones by name; none the function requires left out."""
            kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            actual = inspect.signature(function).parameters.values()
            positional = [p for p in actual if p.kind in kinds]
            keyword = {p.name: p for p in actual if p.kind is inspect.Parameter.KEYWORD_ONLY}
            given = [p for p in written.parameters.values() if p.kind in kinds]
            named = [p for p in written.parameters.values() if p.kind not in kinds]
            required = [p for p in positional if p.default is inspect.Parameter.empty]
            return (
                len(required) <= len(given) <= len(positional)
                and all(p.name in keyword for p in named)
                and all(
                    p.default is not inspect.Parameter.empty or p.name in {n.name for n in named}
                    for p in keyword.values()
                )
            )

        if not any(agrees(function) for function in real):
            wrong.append(f"{name}({params})")
    assert seen > 15
    assert wrong == [], "\n".join(wrong)
