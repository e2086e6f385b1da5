"""``make demo-check``: start the demo stack, check it end to end over plain HTTP, stop it.

The same Procfile and set-up as ``make demo`` (sandbox, runserver, Celery worker and beat under
honcho), but on free ports with its own state in ``var/demo-check/`` (SQLite file, sandbox data,
broker folder), so it runs beside a ``make demo`` without touching it. Checks:

1. the seeded products reach the sandbox (pushed by the worker through the outbox) and the
   pricing page shows a checkout button per cycle and currency;
2. a user signs up, posts the pricing page's checkout form, lands on the sandbox's hosted
   page, pays with the success number, returns, and the members page answers 200; the
   reports page, gated by the feature ``reports`` (Pro and Team), still refuses her Starter;
3. the sandbox delivered ``payment.completed`` and ``invoice.paid`` to the example project
   (2xx), the worker processed them: the account page lists the completed payment;
4. a user paying with the declining number gets a 402 from the sandbox, and the members page
   sends them away (302, not 200); the sandbox's ``payment.failed`` reaches their account page.

Exit status 0 when all pass; on a failure the tail of the stack's log is printed.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "var" / "demo-check"
VENV_BIN = Path(sys.executable).parent
SEEDED = {"Starter", "Pro", "Team"}
SUCCESS_PHONE, DECLINED_PHONE = "0700000001", "0700000002"


class CheckFailed(AssertionError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except (requests.RequestException, ValueError, KeyError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.25)
    raise CheckFailed(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def check(condition: Any, message: str) -> None:
    if not condition:
        raise CheckFailed(message)
    print(f"  ok  {message}")


def stack_env(web_port: int, sandbox_port: int) -> dict[str, str]:
    sandbox = f"http://127.0.0.1:{sandbox_port}"
    env = dict(os.environ)
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        DJANGO_SETTINGS_MODULE="example_project.settings",
        DATABASE_URL=f"sqlite:///{WORK / 'db.sqlite3'}",
        CACHE_URL="dbcache://billing_cache",
        CELERY_BROKER_URL="filesystem://",
        CELERY_BROKER_FOLDER=str(WORK),
        DEMO_HOST="127.0.0.1",
        DEMO_WEB_PORT=str(web_port),
        DEMO_SANDBOX_PORT=str(sandbox_port),
        DEMO_SANDBOX_DATA=str(WORK / "sandbox.sqlite3"),
        DEMO_BEAT_SCHEDULE=str(WORK / "celerybeat-schedule"),
        BILLING_BASE_URL=sandbox,
        BILLING_AUTH_URL=f"{sandbox}/auth",
        BILLING_CHECKOUT_URL=sandbox,
        PYTHONUNBUFFERED="1",
    )
    for key in ("BILLING_EXTRA", "CELERY_TASK_ALWAYS_EAGER"):
        env.pop(key, None)
    return env


# --- HTML helpers (the pages are ours; plain regular expressions are enough) ----------------
def csrf_of(page: str) -> str:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    if not match:
        raise CheckFailed("no CSRF token on the page")
    return match.group(1)


def checkout_forms(page: str) -> list[dict[str, Any]]:
    """Every POST form of the pricing page: its action and fields (hidden inputs, buttons)."""
    forms = []
    for match in re.finditer(r"<form\b([^>]*)>(.*?)</form>", page, re.S | re.I):
        attrs, body = match.groups()
        action = re.search(r'action="([^"]*)"', attrs)
        if not action or "/billing/checkout/" not in action.group(1):
            continue
        fields = {}
        for tag in re.finditer(r"<(?:input|button)\b([^>]*)>", body, re.I):
            name = re.search(r'name="([^"]+)"', tag.group(1))
            value = re.search(r'value="([^"]*)"', tag.group(1))
            if name:
                fields[name.group(1)] = html.unescape(value.group(1)) if value else ""
        forms.append({"action": html.unescape(action.group(1)), "fields": fields})
    return forms


class Browser:
    """A requests session with the few moves of a person using the site."""

    def __init__(self, web: str) -> None:
        self.web = web
        self.http = requests.Session()

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.http.get(self.web + path if path.startswith("/") else path, timeout=30, **kw)

    def signup(self, username: str, password: str) -> None:
        page = self.get("/accounts/signup/")
        check(page.status_code == 200, f"sign-up page answers 200 for {username}")
        answer = self.http.post(
            self.web + "/accounts/signup/",
            data={
                "csrfmiddlewaretoken": csrf_of(page.text),
                "username": username,
                "password1": password,
                "password2": password,
            },
            headers={"Referer": self.web + "/accounts/signup/"},
            timeout=30,
        )
        check(
            answer.status_code == 200 and answer.url.rstrip("/").endswith("/pricing"),
            f"{username} signed up and was sent to the pricing page",
        )

    def start_checkout(self, product: str, cycle: str, currency: str) -> str:
        """POST the pricing page's form for that option; return the sandbox page URL."""
        page = self.get("/pricing/")
        section = re.search(
            rf'<section class="card plan"[^>]*>\s*<h2>{re.escape(product)}\b(.*?)</section>',
            page.text,
            re.S,
        )
        check(section, f"pricing lists {product}")
        option = re.search(
            rf'<div class="option" data-cycle="{cycle}" data-currency="{currency}">(.*?)</div>\s*'
            rf'(?=<div class="option"|</section>|$)',
            section.group(1) + "</section>",
            re.S,
        )
        check(option, f"pricing has a {product} option {cycle} {currency}")
        forms = checkout_forms(option.group(1))
        check(len(forms) == 1, f"one checkout button for {product} {cycle} {currency}")
        form = forms[0]
        answer = self.http.post(
            requests.compat.urljoin(self.web, form["action"]),
            data=form["fields"],
            headers={"Referer": self.web + "/pricing/"},
            allow_redirects=False,
            timeout=60,
        )
        check(
            answer.status_code in (302, 303),
            f"checkout view answers a redirect (got {answer.status_code})",
        )
        return answer.headers["Location"]

    def pay(self, checkout_url: str, phone: str) -> requests.Response:
        """The hosted page with plain HTTP: the phone form, then "I entered my PIN"."""
        page = self.http.get(checkout_url, timeout=30)
        check(
            page.status_code == 200 and 'name="phone"' in page.text,
            "the sandbox's hosted page asks for a phone number",
        )
        first = self.http.post(checkout_url, data={"step": "phone", "phone": phone}, timeout=30)
        check(
            first.status_code == 200 and "I entered my PIN" in first.text,
            f"{phone}: the PIN step follows",
        )
        token = re.search(r'name="form_token" value="([0-9a-f]+)"', first.text)
        check(token is not None, f"{phone}: the PIN step's form carries its token")
        confirm = {"step": "confirm", "phone": phone, "form_token": token.group(1) if token else ""}
        return self.http.post(checkout_url, data=confirm, timeout=30)


def run_checks(web: str, sandbox: str) -> None:
    api = requests.Session()

    print("1. seeded products pushed to the sandbox")

    def remote_names() -> set[str]:
        answer = api.get(f"{sandbox}/_sandbox/objects/product", timeout=10)
        return {p["name"] for p in answer.json()["data"]}

    remote = wait_for(
        "the seeded products in the sandbox",
        lambda: (names := remote_names()) >= SEEDED and names,
        timeout=90,
    )
    check(remote >= SEEDED, f"sandbox holds {sorted(SEEDED)}")
    products = api.get(f"{sandbox}/_sandbox/objects/product", timeout=10).json()["data"]
    check(
        all(p["status"] == "published" for p in products if p["name"] in SEEDED),
        "they are published remotely",
    )
    pricing = requests.get(f"{web}/pricing/", timeout=30)
    check(
        pricing.status_code == 200 and all(n in pricing.text for n in SEEDED),
        "pricing page lists them",
    )

    print("2. a subscriber pays with the success number")
    alice = Browser(web)
    name = f"alice-{uuid.uuid4().hex[:6]}"
    alice.signup(name, "correct-horse-battery")
    check(
        alice.get("/members/", allow_redirects=False).status_code == 302,
        "members page refuses her before paying",
    )
    url = alice.start_checkout("Starter", "months-1", "XOF")
    check(url.startswith(f"{sandbox}/checkout/"), f"redirected to the sandbox's page ({url})")
    session_id = url.rsplit("/", 1)[1]
    done = alice.pay(url, SUCCESS_PHONE)
    check(
        done.status_code == 200 and 'data-outcome="success"' in done.text,
        "the sandbox confirms the payment",
    )
    back = re.search(r'<a id="return" href="([^"]+)"', done.text)
    check(back, "the result page links back to the example project")
    back_url = html.unescape(back.group(1))
    check(
        back_url.startswith(f"{web}/billing/checkout/return/") and session_id in back_url,
        "the return URL is the project's checkout_return with the session id",
    )
    returned = alice.get(back_url)
    check(returned.status_code == 200, "the return page answers 200")
    members = wait_for(
        "the members page to open",
        lambda: (r := alice.get("/members/", allow_redirects=False)).status_code == 200 and r,
        timeout=30,
    )
    check(
        "Members area" in members.text and "Starter" in members.text,
        "members page 200 with her Starter plan",
    )
    reports = alice.get("/reports/", allow_redirects=False)
    check(
        reports.status_code == 302 and "/pricing/" in reports.headers.get("Location", ""),
        "the reports page (feature 'reports', Pro and Team) refuses her Starter plan",
    )

    print("3. events delivered and processed")
    wait_for(
        "the deliveries",
        lambda: (
            requests.post(
                f"{sandbox}/_sandbox/deliveries/flush", json={"timeout": 10}, timeout=20
            ).status_code
            == 200
        ),
        timeout=60,
    )
    session = api.get(
        f"{sandbox}/_sandbox/objects/checkout_session/{session_id}", timeout=10
    ).json()["data"]
    check(session["status"] == "completed", "the sandbox's checkout session is completed")
    deliveries = api.get(f"{sandbox}/_sandbox/deliveries", timeout=10).json()["data"]
    mine = [
        d for d in deliveries if d["event"].get("data", {}).get("customer") == session["customer"]
    ]
    check(
        {d["event"]["type"] for d in mine} >= {"payment.completed", "invoice.paid"},
        "sandbox sent payment.completed and invoice.paid",
    )
    check(
        all(d["status"] == "delivered" for d in mine),
        f"delivered to {web}/billing/webhooks/ with a 2xx",
    )
    account = wait_for(
        "the completed payment on the account page",
        lambda: (
            (r := alice.get("/account/")).status_code == 200
            and re.search(r'<table id="billing-payments">.*?<td>Completed</td>', r.text, re.S)
            and r
        ),
        timeout=60,
    )
    check("XOF\xa05,000" in account.text, "account page lists the payment (XOF 5,000, Completed)")

    print("4. a declined payment opens nothing")
    bob = Browser(web)
    bob.signup(f"bob-{uuid.uuid4().hex[:6]}", "correct-horse-battery")
    url = bob.start_checkout("Pro", "months-1", "USD")
    failed = bob.pay(url, DECLINED_PHONE)
    check(
        failed.status_code == 402 and 'data-outcome="declined"' in failed.text,
        "the sandbox declines 0700000002 (402)",
    )
    bob.get(f"{web}/billing/checkout/return/?session={url.rsplit('/', 1)[1]}")
    refused = bob.get("/members/", allow_redirects=False)
    check(refused.status_code == 302, f"members page refuses him ({refused.status_code})")
    wait_for(
        "the failed payment on his account page",
        lambda: re.search(
            r'<table id="billing-payments">.*?<td>Failed</td>\s*<td>Declined</td>',
            bob.get("/account/").text,
            re.S,
        ),
        timeout=60,
    )
    check(True, "his account page shows the declined payment")


def main() -> int:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    web_port, sandbox_port = free_port(), free_port()
    env = stack_env(web_port, sandbox_port)
    web, sandbox = f"http://127.0.0.1:{web_port}", f"http://127.0.0.1:{sandbox_port}"
    python = sys.executable
    for cmd in (["migrate", "--noinput", "-v", "0"], ["createcachetable"], ["billing_demo_seed"]):
        subprocess.run([python, "manage.py", *cmd], cwd=ROOT, env=env, check=True)  # noqa: S603

    log_path = WORK / "stack.log"
    with log_path.open("w") as log:
        stack = subprocess.Popen(  # noqa: S603 (a fixed command)
            [
                str(VENV_BIN / "honcho"),
                "--no-colour",
                "-e",
                "example_project/demo.env",
                "-f",
                "Procfile",
                "start",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    print(f"demo stack: web {web}, sandbox {sandbox} (log: {log_path})")
    try:
        wait_for("the sandbox", lambda: requests.get(f"{sandbox}/_sandbox/health", timeout=2).ok)
        wait_for("the web server", lambda: requests.get(f"{web}/", timeout=2).ok)
        wait_for("the worker", lambda: "ready." in log_path.read_text(errors="replace"))
        run_checks(web, sandbox)
    except (CheckFailed, requests.RequestException) as exc:
        print(f"\nFAILED: {exc}\n--- last lines of {log_path} ---")
        print("\n".join(log_path.read_text(errors="replace").splitlines()[-60:]))
        return 1
    finally:
        if stack.poll() is None:
            stack.send_signal(signal.SIGTERM)  # honcho stops its processes
            try:
                stack.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(stack.pid, signal.SIGKILL)
                stack.wait()
    print("\ndemo-check: the demo stack works end to end.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
