"""``billing_probe`` against the sandbox: every guess confirmed (or unknown) in its default
mode; in each dialect the guess it breaks is reported contradicted, with the exit status of a
guess the app relies on (1) or copes without (0). The raw answers file holds no secret."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from billing_integration.models import EventState, WebhookEvent
from billing_integration.probe import CHECKS, CONFIRMED, Finding, check, run_probe

pytestmark = pytest.mark.django_db(transaction=True)

#: Confirmed against the sandbox's default mode with --write (the rest: unknown, no
#: delivery or 429 seen here).
CONFIRMED_BY_DEFAULT = {
    "token_fields", "expires_in_unit", "token_header", "data_wrapping", "field_names",
    "timestamps", "currency_ids", "subscription_currency_form", "pagination",
    "unknown_id_status", "error_shape", "idempotency_replay", "idempotency_conflict",
    "product_create", "status_moves", "checkout_session",
}  # fmt: skip
#: Refused by the sandbox out of the box (the plan-change guesses are off in the app too).
REFUSED_BY_DEFAULT = {"change_plan_action", "patch_subscription"}


def probe(tmp_path, *args: str) -> tuple[int, dict, str]:
    """Run the command with --json; (exit status, its JSON, the saved file's text)."""
    out, path = StringIO(), tmp_path / "answers.json"
    code = 0
    try:
        call_command("billing_probe", "--json", "--output", str(path), *args, stdout=out)
    except CommandError as exc:
        code = exc.returncode
    return code, json.loads(out.getvalue()), path.read_text()


def verdicts(report: dict) -> dict[str, str]:
    return {f["guess"]: f["verdict"] for f in report["findings"]}


@pytest.fixture
def sandbox(billing_sandbox):
    billing_sandbox.seed(customers=3, subscriptions=2)
    return billing_sandbox


def test_default_sandbox_every_guess_confirmed(sandbox, tmp_path):
    code, report, saved = probe(tmp_path, "--write")
    found = verdicts(report)
    assert code == 0 and report["exit_code"] == 0
    assert {g for g, v in found.items() if v == CONFIRMED} == CONFIRMED_BY_DEFAULT, found
    assert {g for g, v in found.items() if v == "contradicted"} == REFUSED_BY_DEFAULT, found
    others = CONFIRMED_BY_DEFAULT | REFUSED_BY_DEFAULT
    assert {v for g, v in found.items() if g not in others} == {"unknown"}
    # What it did on the sandbox: two probe products, both archived; one open session.
    probes = [p for p in sandbox.objects("product") if p["name"].startswith("billing-probe")]
    assert len(probes) == 2 and {p["status"] for p in probes} == {"archived"}
    sessions = sandbox.objects("checkout_session")
    assert [s["status"] for s in sessions] == ["open"]
    assert len([c for c in sandbox.objects("customer") if "probe" in c["identifier"]]) == 1
    # The raw answers are saved, without the client secret or the token.
    tokens = {
        r["headers"]["x-kc-token"] for r in sandbox.requests() if "x-kc-token" in r["headers"]
    }
    assert tokens and sandbox.client_secret not in saved
    assert not [t for t in tokens if t in saved]
    document = json.loads(saved)
    assert [a["label"] for a in document["answers"]][:2] == ["token", "token accepted"]
    assert document["answers"][0]["body"]["access_token"] == "[redacted]"


def test_each_finding_names_a_setting_or_none(sandbox, tmp_path):
    from billing_integration.conf import DEFAULTS

    _, report, _ = probe(tmp_path, "--write")
    settings = {f["setting"].split("[")[0] for f in report["findings"]}
    assert {s for s in settings if not s.startswith("no setting")} <= set(DEFAULTS)
    assert "no setting" in settings


def test_read_only_by_default(sandbox, tmp_path):
    code, report, _ = probe(tmp_path)
    assert code == 0 and report["write"] is False
    methods = {r["method"] for r in sandbox.requests() if r["operation"] != "token"}
    assert methods == {"GET"}
    assert "status_moves" not in verdicts(report)


def test_write_is_refused_outside_the_sandbox_realm(sandbox, settings, tmp_path):
    settings.BILLING = {**settings.BILLING, "REALM": "production"}
    with pytest.raises(CommandError, match="--i-know") as refused:
        call_command("billing_probe", "--write", "--output", str(tmp_path / "x.json"))
    assert refused.value.returncode == 2
    assert sandbox.requests() == []  # nothing was sent


@pytest.mark.parametrize(
    ("dialect", "guesses", "exit_code"),
    [
        ("no_paging", {"pagination"}, 0),
        ("error_shape", {"error_shape"}, 0),
        ("currency_ids", {"currency_ids", "product_create"}, 1),
        ("expires_in_ms", {"expires_in_unit"}, 1),
        ("refuse_draft_archive", {"status_moves"}, 1),
    ],
)
def test_each_dialect_is_reported(billing_sandbox, tmp_path, dialect, guesses, exit_code):
    billing_sandbox.dialects(dialect)
    billing_sandbox.seed(customers=3, subscriptions=2)
    code, report, _ = probe(tmp_path, "--write")
    found = verdicts(report)
    contradicted = {g for g, v in found.items() if v == "contradicted"}
    assert contradicted - REFUSED_BY_DEFAULT == guesses, report["findings"]
    assert code == exit_code == report["exit_code"]


@pytest.mark.parametrize(
    ("dialect", "verdict", "exit_code"),
    [
        ("events_upper", "confirmed", 0),
        ("events_past", "confirmed", 0),
        ("events_prefixed", "contradicted", 1),
    ],
)
def test_event_type_dialects(billing_sandbox, client, eager, tmp_path, dialect, verdict, exit_code):
    billing_sandbox.dialects(dialect)
    billing_sandbox.seed(customers=1, subscriptions=1)
    subscription = billing_sandbox.objects("subscription")[0]["id"]
    event = billing_sandbox.trigger("subscription.renewal", subscription)
    assert billing_sandbox.deliver(client, event).status_code == 200
    stored = WebhookEvent.objects.get()
    assert stored.raw_type == event["type"] != "subscription.renewal"
    code, report, _ = probe(tmp_path)
    assert verdicts(report)["event_types"] == verdict and code == exit_code
    expected = EventState.UNRECOGNISED if verdict == "contradicted" else EventState.PROCESSED
    assert stored.state == expected


def test_a_check_is_a_registered_function(sandbox):
    """What issue-style extensions do: one function, registered, run in order."""

    @check("extra_guess")
    def extra(probe):
        answer = probe.call("extra", "GET", "/customers", params={"limit": 1})
        yield Finding("extra_guess", CONFIRMED, "customers list", f"HTTP {answer.status}")

    try:
        report = run_probe()
    finally:
        CHECKS[:] = [c for c in CHECKS if c.name != "extra_guess"]
    assert [f.seen for f in report.findings if f.guess == "extra_guess"] == ["HTTP 200"]
    assert any(a["label"] == "extra" for a in report.answers)


def test_text_output_one_line_per_guess(billing_sandbox, tmp_path):
    billing_sandbox.dialects("currency_ids")
    billing_sandbox.seed(customers=3, subscriptions=2)
    out = StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("billing_probe", "--output", str(tmp_path / "a.json"), stdout=out)
    assert failed.value.returncode == 1 and "currency_ids" in str(failed.value)
    lines = out.getvalue().splitlines()
    assert lines[-1].endswith(str(tmp_path / "a.json"))
    guesses = [line.split()[1].rstrip(":") for line in lines[:-1]]
    assert len(guesses) == len(set(guesses)) and "pagination" in guesses
    wrong = next(line for line in lines if " currency_ids:" in line)
    assert wrong.startswith("CONTRADICTED") and "952" in wrong
    assert "setting: BILLING['CURRENCIES']" in wrong
    signing = next(line for line in lines if " signing:" in line)
    assert signing.startswith("unknown") and "BILLING['WEBHOOK_SECRET']" in signing


def test_the_plan_change_guesses_are_reported_as_the_sandbox_answers(sandbox, settings, tmp_path):
    """Issue 28's guesses (``--write``): refused by the sandbox out of the box (contradicted,
    exit 0 while the app's guesses are off, 1 once the app relies on them); accepted once the
    sandbox takes them (confirmed)."""
    _, report, _ = probe(tmp_path, "--write")
    assert verdicts(report)["patch_subscription"] == "contradicted"
    guesses = {"change_plan_action": "upgrade", "patch_auto_renew": True}
    settings.BILLING = {**settings.BILLING, "GUESSES": guesses}
    code, report, _ = probe(tmp_path, "--write")
    found = verdicts(report)
    assert code == 1
    assert found["change_plan_action"] == found["patch_subscription"] == "contradicted"
    sandbox.config(change_actions=["upgrade"], patch_subscriptions=True)
    code, report, _ = probe(tmp_path, "--write")
    found = verdicts(report)
    assert code == 0, report
    assert found["change_plan_action"] == found["patch_subscription"] == CONFIRMED
    patches = [
        r for r in sandbox.requests() if r["method"] == "PATCH" and "/subscriptions/" in r["path"]
    ]
    assert patches and all(set(r["body"]) == {"auto_renew"} for r in patches)


def test_a_refusal_about_one_object_leaves_a_plan_change_guess_unknown(sandbox, settings, tmp_path):
    """As the app takes it (docs/changes.md): a 400 about the object or a value (the PATCH of
    a paused subscription, an ``expires_at`` in the past for the sandbox's clock) does not
    contradict the guess; a 404 (no PATCH route) and a 400 naming the action do."""
    guesses = {"change_plan_action": "upgrade", "patch_auto_renew": True}
    settings.BILLING = {**settings.BILLING, "GUESSES": guesses}
    sandbox.config(change_actions=["upgrade"], patch_subscriptions=True)
    for sub in sandbox.objects("subscription"):
        sandbox.trigger("subscription.paused", sub["id"])
    sandbox.advance(seconds=3600)  # the sandbox an hour ahead: the probe's session expired

    _, report, _ = probe(tmp_path, "--write")

    found = {f["guess"]: f for f in report["findings"]}
    assert found["patch_subscription"]["verdict"] == "unknown", found["patch_subscription"]
    assert "HTTP 400: invalid_state" in found["patch_subscription"]["seen"]
    assert found["change_plan_action"]["verdict"] == "unknown", found["change_plan_action"]
    assert "HTTP 400: in_the_past" in found["change_plan_action"]["seen"]
    sandbox.config(change_actions=[], patch_subscriptions=False)
    _, report, _ = probe(tmp_path, "--write")
    found = {f["guess"]: f for f in report["findings"]}
    assert found["patch_subscription"]["verdict"] == "contradicted"  # 404
    assert found["change_plan_action"]["verdict"] == "contradicted"  # 400 naming the action


def test_the_answers_file_is_readable_by_its_owner_only(sandbox, tmp_path):
    """It holds a page of the service's customers (names, emails): no other user of the
    machine may read it, whatever the umask."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        probe(tmp_path)
    finally:
        os.umask(old)
    saved = tmp_path / "answers.json"
    assert "customers" in saved.read_text()
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
