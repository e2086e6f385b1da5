"""The hosted checkout page: ``/checkout/<session_id>``.

GET shows the product, price and cycle with a phone number field; POST ``step=phone``
answers 303 to ``GET ?step=pin&phone=...``, the "Confirm with your PIN on your phone" step (a
simulated prompt with an "I entered my PIN" button), so a reload stays on that step instead of
re-posting or going back; an empty or invalid number answers 400 with the form and a message
saying what to enter. POST ``step=confirm`` pays per the test phone number (see ``ledger``)
and shows the result, linking (and redirecting after a few seconds) to the sandbox's configured
``return_url`` (``--return-url`` or ``POST /_sandbox/config``), ``{session_id}`` in it replaced
by the session id. A ``return_url`` parameter on the page is never followed: the configured one
(as configured, or with the session id filled in) is accepted, any other answers 400, so the
page is no open redirect. Expired sessions answer 410, completed ones say so.

The POST that pays (``step=confirm``) must carry the PIN step's hidden ``form_token``: an HMAC
of the session id under a key kept in the store (``form_token``), so only a page that read the
PIN step can send it; a page of another site cannot read it (same-origin policy) and its
POST is refused 403 (``data-outcome="invalid_form"``), nothing paid.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from html import escape
from typing import Any
from urllib.parse import urlencode, urlsplit

from werkzeug.wrappers import Request, Response

from .config import SandboxConfig
from .ledger import NEVER, SUCCESS, Ledger
from .store import Store
from .web import html_response

_PHONE = re.compile(r"^\+?[0-9][0-9 \-.()]{6,19}$")
_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:28rem;margin:3rem auto;padding:0 1rem;"
    "color:#222}main{border:1px solid #ddd;border-radius:8px;padding:1.5rem}"
    "button{padding:.6rem 1.2rem;font-size:1rem}input{padding:.5rem;font-size:1rem;width:100%;"
    "box-sizing:border-box;margin:.5rem 0 1rem}.muted{color:#666}.error{color:#b00020}"
)
MESSAGES = {
    "declined": "Your payment was declined.",
    "insufficient_funds": "Your payment failed: insufficient funds.",
}


def page(
    title: str, body: str, status: int = 200, outcome: str = "", refresh: str | None = None
) -> Response:
    meta = ""
    if refresh:
        meta = f'<meta http-equiv="refresh" content="3;url={escape(refresh)}">'
    html = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">{meta}'
        f"<title>{escape(title)} - Billing sandbox checkout</title><style>{_CSS}</style></head>"
        f'<body><p class="muted">Billing sandbox (test mode)</p>'
        f'<main data-outcome="{escape(outcome)}"><h1>{escape(title)}</h1>{body}</main>'
        f"</body></html>"
    )
    return html_response(html, status)


class CheckoutPages:
    def __init__(self, store: Store, config: SandboxConfig, ledger: Ledger) -> None:
        self.store = store
        self.config = config
        self.ledger = ledger
        # kept in the store: a page shown before a restart can still be confirmed after it
        key = store.get_config("form_key")
        if not isinstance(key, str) or not key:
            key = secrets.token_hex(32)
            store.set_config("form_key", key)
        self._form_key = key.encode()

    def form_token(self, session_id: str) -> str:
        """The hidden field the paying form carries (the PIN step's)."""
        return hmac.new(self._form_key, session_id.encode(), hashlib.sha256).hexdigest()

    def _forged(self, request: Request, session_id: str) -> bool:
        """A POST without the PIN step's ``form_token`` (a page of another site)."""
        sent = request.form.get("form_token") or ""
        return not hmac.compare_digest(sent.encode(), self.form_token(session_id).encode())

    def return_url(self, session_id: str) -> str | None:
        """The configured return URL for this session, or None (none, or not http(s))."""
        url = self.config.return_url
        if not url or urlsplit(url).scheme not in ("http", "https"):
            return None
        return url.replace("{session_id}", session_id)

    def _refused_return_url(self, request: Request, session_id: str) -> bool:
        """A ``return_url`` parameter that is not the configured one (never followed)."""
        asked = request.values.get("return_url")
        if not asked:
            return False
        return asked not in (self.config.return_url, self.return_url(session_id))

    def _describe(self, session: dict[str, Any]) -> tuple[dict[str, Any], str, str]:
        product = self.store.get("product", session["product"]) or {"name": "?"}
        currency = self.config.currency_code(session["selected_currency"]) or "?"
        amount = self.ledger.price(
            product, session["selected_billing_cycle"], session["selected_currency"]
        )
        code = session["selected_billing_cycle"]
        if code:
            unit, _, freq = code.rpartition("-")
            cycle = f"every {unit[:-1]}" if freq == "1" else f"every {freq} {unit}"
        else:
            cycle = "one-time payment"
        return product, f"{amount:g} {currency}", cycle

    def handle(self, request: Request, session_id: str) -> Response:
        session = self.store.get("checkout_session", session_id)
        if session is None:
            return page(
                "Checkout not found",
                "<p>There is no checkout session with this address.</p>",
                status=404,
                outcome="not_found",
            )
        if self._refused_return_url(request, session_id):
            return page(
                "Unknown return address",
                "<p>This checkout link names a return address that is not the one "
                "configured for this merchant; it is not followed. Please start again "
                "from the merchant's site.</p>",
                status=400,
                outcome="invalid_return_url",
            )
        session = self.ledger.expire_if_due(session)
        return_url = self.return_url(session_id)
        back = ""
        if return_url:
            back = f'<p><a id="return" href="{escape(return_url)}">Return to the merchant</a></p>'
        if session["status"] == "expired":
            return page(
                "This checkout session has expired",
                "<p>The session expired before the payment was confirmed. Please "
                "start again from the merchant's site.</p>" + back,
                status=410,
                outcome="expired",
            )
        if session["status"] == "completed":
            return page(
                "Payment already completed",
                "<p>This checkout session is already completed; nothing more to do.</p>" + back,
                outcome="completed",
            )
        product, price, cycle = self._describe(session)
        summary = (
            f'<p><strong id="product">{escape(product["name"])}</strong></p>'
            f'<p id="price">{escape(price)} <span id="cycle" class="muted">'
            f"({escape(cycle)})</span></p>"
        )
        action = f"/checkout/{escape(session_id)}"
        if request.method == "POST":
            step = request.form.get("step")
            phone = (request.form.get("phone") or "").strip()
        else:  # the PIN step is a GET (after a redirect): a reload stays on it
            step = "pin" if request.args.get("step") == "pin" else None
            phone = (request.args.get("phone") or "").strip()
        if step in ("phone", "pin", "confirm"):
            if not phone:
                return self._phone_form(
                    summary,
                    action,
                    "Enter your mobile-money phone number, e.g. 0700000001.",
                    400,
                    outcome="missing_phone",
                )
            if not _PHONE.match(phone):
                return self._phone_form(
                    summary, action, "Enter a valid mobile-money phone number.", 400
                )
            if step == "phone":
                query = {"step": "pin", "phone": phone}
                if request.values.get("return_url"):
                    query["return_url"] = request.values["return_url"]
                return Response(
                    status=303, headers={"Location": f"/checkout/{session_id}?{urlencode(query)}"}
                )
            if step == "pin":
                return page(
                    "Confirm with your PIN on your phone",
                    summary + f"<p>We sent a payment prompt to <strong>{escape(phone)}"
                    "</strong>. Confirm with your PIN on your phone, then continue.</p>"
                    f'<form method="post" action="{action}">'
                    '<input type="hidden" name="step" value="confirm">'
                    f'<input type="hidden" name="phone" value="{escape(phone)}">'
                    '<input type="hidden" name="form_token" '
                    f'value="{self.form_token(session_id)}">'
                    '<button type="submit">I entered my PIN</button></form>',
                    outcome="pin",
                )
            if self._forged(request, session_id):
                return page(
                    "Please confirm on this page",
                    summary + "<p>This confirmation was not sent from this checkout page, "
                    "so nothing was paid.</p>"
                    f'<p><a href="{action}">Start the payment again</a></p>',
                    status=403,
                    outcome="invalid_form",
                )
            return self._confirm(session, phone, summary, action, return_url, back)
        return self._phone_form(summary, action)

    def _phone_form(
        self,
        summary: str,
        action: str,
        error: str = "",
        status: int = 200,
        outcome: str = "invalid_phone",
    ) -> Response:
        err = f'<p class="error">{escape(error)}</p>' if error else ""
        return page(
            "Checkout",
            summary + err + f'<form method="post" action="{action}" novalidate>'
            '<input type="hidden" name="step" value="phone">'
            '<label for="phone">Mobile-money phone number</label>'
            '<input id="phone" name="phone" type="tel" required '
            'placeholder="0700000001">'
            '<button type="submit">Pay</button></form>',
            status=status,
            outcome="form" if not error else outcome,
        )

    def _confirm(
        self,
        session: dict[str, Any],
        phone: str,
        summary: str,
        action: str,
        return_url: str | None,
        back: str,
    ) -> Response:
        result = self.ledger.confirm_checkout(session, phone)
        outcome = result["outcome"]
        if outcome == SUCCESS:
            return page(
                "Payment successful",
                summary + "<p>Thank you, your payment is confirmed and your "
                "subscription is active.</p>" + back,
                outcome="success",
                refresh=return_url,
            )
        if outcome == NEVER:
            return page(
                "Waiting for your confirmation",
                summary + "<p>We have not received your PIN confirmation yet. This "
                "session stays open until it expires.</p>" + back,
                status=202,
                outcome="pending",
            )
        message = MESSAGES.get(outcome, "Your payment failed.")
        return page(
            "Payment failed",
            summary + f'<p class="error">{escape(message)}</p>'
            f'<p><a href="{action}">Try another number</a></p>' + back,
            status=402,
            outcome=outcome,
        )
