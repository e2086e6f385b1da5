"""The sandbox's switchable guesses (issue 28): change actions at checkout and
``PATCH /subscriptions/{id}`` are refused out of the box and accepted once switched on; the
dashboard applies a change or a stop of renewal by hand. Over HTTP."""

from __future__ import annotations

import requests


def paid_subscription(api, sandbox, customer, product, cycle="months-1") -> dict:
    session = api.session(customer, product, selected_billing_cycle=cycle)
    assert sandbox.complete_checkout(session["id"]).status_code == 200
    return [s for s in sandbox.objects("subscription") if s["customer"] == customer["id"]][-1]


def test_out_of_the_box_both_guesses_are_refused(api, sandbox):
    customer, product = api.customer(), api.product()
    sub = paid_subscription(api, sandbox, customer, product)
    body = {
        "customer": customer["id"],
        "product": product["id"],
        "selected_currency": 1,
        "selected_billing_cycle": "years-1",
        "action": "upgrade",
        "upgrade_to": sub["id"],
    }
    refused = api.post("/checkout_sessions", body)
    assert refused.status_code == 400
    assert refused.json()["errors"][0]["field"] == "action"
    patched = api.patch(f"/subscriptions/{sub['id']}", {"auto_renew": False})
    assert patched.status_code == 404
    assert sandbox.object("subscription", sub["id"])["auto_renew"] is True


def test_an_accepted_change_action_stops_the_old_subscription_once_paid(api, sandbox):
    sandbox.config(change_actions=["upgrade"])
    customer, product = api.customer(), api.product()
    old = paid_subscription(api, sandbox, customer, product)
    session = api.session(
        customer, product, selected_billing_cycle="years-1", action="upgrade", upgrade_to=old["id"]
    )
    assert session["action"] == "upgrade" and session["upgrade_to"] == old["id"]
    assert sandbox.object("subscription", old["id"])["auto_renew"] is True  # not paid yet
    assert sandbox.complete_checkout(session["id"]).status_code == 200
    subs = sandbox.objects("subscription")
    assert [(s["selected_billing_cycle"], s["auto_renew"]) for s in subs] == [
        ("months-1", False),
        ("years-1", True),
    ]
    # new_subscription carries no target; an unknown target is refused
    bad = api.post(
        "/checkout_sessions",
        {**{k: session[k] for k in ("customer", "product", "selected_currency")},
         "selected_billing_cycle": "months-1", "action": "new_subscription",
         "upgrade_to": old["id"]},
    )  # fmt: skip
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "upgrade_to"


def test_patch_changes_auto_renew_only_when_switched_on(api, sandbox):
    sandbox.config(patch_subscriptions=True)
    sub = paid_subscription(api, sandbox, api.customer(), api.product())
    answer = api.patch(f"/subscriptions/{sub['id']}", {"auto_renew": False})
    assert answer.status_code == 200 and answer.json()["data"]["auto_renew"] is False
    refused = api.patch(f"/subscriptions/{sub['id']}", {"auto_renew": True, "product": "x"})
    assert refused.status_code == 400
    summary = sandbox.advance(days=32)
    assert summary["canceled"] == 1 and summary["renewals"] == 0


def test_the_dashboard_applies_a_change_and_a_stop_by_hand(api, sandbox):
    customer = api.customer()
    basic, pro = api.product(name="Basic"), api.product(name="Pro")
    sub = paid_subscription(api, sandbox, customer, basic)
    page = requests.get(f"{sandbox.url}/_sandbox/", timeout=5).text
    action = f"/_sandbox/subscriptions/{sub['id']}/apply"
    assert f"action='{action}'" in page and "Stop renewal" in page and "Apply change" in page

    form = {"product": pro["id"], "selected_billing_cycle": "months-1", "selected_currency": "XOF"}
    moved = requests.post(sandbox.url + action, data=form, allow_redirects=False, timeout=5)
    assert moved.status_code == 303 and moved.headers["Location"] == "/_sandbox/"
    assert sandbox.object("subscription", sub["id"])["product"] == pro["id"]
    assert sandbox.advance(days=32)["renewals"] == 1
    renewal = [p for p in sandbox.objects("payment") if p["status"] == "completed"][-1]
    assert renewal["product"] == pro["id"]

    stopped = requests.post(sandbox.url + action, data={"auto_renew": "false"}, timeout=5)
    assert stopped.status_code == 200  # followed back to the dashboard
    assert sandbox.object("subscription", sub["id"])["auto_renew"] is False
    wrong = requests.post(
        sandbox.url + action, json={"selected_billing_cycle": "weeks-1"}, timeout=5
    )
    assert wrong.status_code == 400
