"""Money movements: payments, invoices, refunds; checkout completion; renewals on the clock;
and the trigger that emits any event with the state change it implies.

Test phone numbers (the number a customer confirms with at checkout decides the outcome):

=============  ================================  =========================================
number         first payment (checkout)          renewals
=============  ================================  =========================================
0700000001     succeeds                          succeed
0700000002     declined (``declined``)           -
0700000003     fails (``insufficient_funds``)    -
0700000004     never confirmed: session expires  -
0700000005     succeeds                          fail (``insufficient_funds``)
anything else  succeeds                          succeed
=============  ================================  =========================================

A failed renewal sends ``payment.failed`` and is retried one (sandbox) day later; after
``MAX_RENEWAL_FAILURES`` failed attempts the subscription is canceled
(``subscription.canceled``). A subscription with ``auto_renew`` false is canceled at its next
billing date instead of renewed.

A trial (``trial_end_date``) ends at its first billing date, the trial's end. What the service
does then is not in the interface; the sandbox's guess is its config ``trial_end``: ``"renew"``
(the default) treats it as any billing date above; ``"lapse"`` ends the subscription quietly
(status ``expired``, nothing billed, no event).
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

from . import clock as timeutil
from .api import BillingAPI
from .clock import Clock
from .config import SandboxConfig
from .events import EVENT_TYPES, EventBus
from .store import Store, public
from .web import NotFound, ValidationFailed, error_entry

SUCCESS, NEVER = "success", "never_confirmed"
TEST_NUMBERS: dict[str, tuple[str, str]] = {
    "0700000001": (SUCCESS, SUCCESS),
    "0700000002": ("declined", "declined"),
    "0700000003": ("insufficient_funds", "insufficient_funds"),
    "0700000004": (NEVER, NEVER),
    "0700000005": (SUCCESS, "insufficient_funds"),
}
MAX_RENEWAL_FAILURES = 3
RENEWAL_RETRY = timedelta(days=1)
INVOICE_STATUS = {
    "invoice.paid": "paid",
    "invoice.voided": "void",
    "invoice.marked_uncollectable": "uncollectable",
    "invoice.deleted": "deleted",
}


def normalise_phone(phone: str) -> str:
    return re.sub(r"[\s\-.()]", "", phone or "")


def outcomes(phone: str | None) -> tuple[str, str]:
    """(first payment outcome, renewal outcome) for a phone number."""
    return TEST_NUMBERS.get(normalise_phone(phone or ""), (SUCCESS, SUCCESS))


class Ledger:
    def __init__(
        self, store: Store, clock: Clock, config: SandboxConfig, api: BillingAPI, events: EventBus
    ) -> None:
        self.store = store
        self.clock = clock
        self.config = config
        self.api = api
        self.events = events

    # -- documents ---------------------------------------------------------------------------
    def _doc(self, **fields: Any) -> dict[str, Any]:
        now = self.clock.now_str()
        return {"id": str(uuid.uuid4()), **fields, "date_created": now, "date_updated": None}

    def _touch(self, kind: str, doc: dict[str, Any], due: str | None = None) -> dict[str, Any]:
        doc["date_updated"] = self.clock.now_str()
        return self.store.save(kind, doc, due=due)

    def price(self, product: dict[str, Any], cycle_code: str | None, currency_id: int) -> float:
        prices = product.get("prices") or []
        blueprint = self.api.blueprint_of(product)
        if blueprint is not None and cycle_code:
            unit, freq = timeutil.parse_cycle(cycle_code)
            for cycle in blueprint["billing_cycles"]:
                if cycle["cycle"] == unit and cycle["frequency"] == freq:
                    prices = cycle["prices"]
        for price in prices:
            if price["currency"] == currency_id:
                amount: float = price["amount"]
                return amount
        return 0

    def _sub_amount(self, sub: dict[str, Any]) -> tuple[float, str]:
        product = self.store.get("product", sub["product"]) or {}
        currency = sub["selected_currency"]
        cid = self.config.currency_id(currency)
        cycle = sub["selected_billing_cycle"]
        amount = self.price(product, cycle, cid) if product and cid is not None else 0
        return amount, currency

    def new_invoice(
        self, ctx: dict[str, Any], status: str, period_start: str | None, period_end: str | None
    ) -> dict[str, Any]:
        doc = self._doc(
            status=status,
            customer=ctx["customer"],
            subscription=ctx.get("subscription"),
            product=ctx["product"],
            amount=ctx["amount"],
            currency=ctx["currency"],
            period_start=period_start,
            period_end=period_end,
        )
        return self.store.insert("invoice", doc)

    def new_payment(
        self,
        ctx: dict[str, Any],
        status: str,
        failure_reason: str | None = None,
        invoice: str | None = None,
    ) -> dict[str, Any]:
        doc = self._doc(
            status=status,
            amount=ctx["amount"],
            currency=ctx["currency"],
            customer=ctx["customer"],
            subscription=ctx.get("subscription"),
            product=ctx["product"],
            invoice=invoice,
            failure_reason=failure_reason,
        )
        return self.store.insert("payment", doc)

    def new_refund(
        self, payment: dict[str, Any], status: str, reason: str | None
    ) -> dict[str, Any]:
        doc = self._doc(
            status=status,
            payment=payment["id"],
            amount=payment["amount"],
            currency=payment["currency"],
            customer=payment["customer"],
            subscription=payment.get("subscription"),
            reason=reason or "requested_by_customer",
        )
        return self.store.insert("refund", doc)

    def _sub_ctx(self, sub: dict[str, Any]) -> dict[str, Any]:
        amount, currency = self._sub_amount(sub)
        return {
            "customer": sub["customer"],
            "subscription": sub["id"],
            "product": sub["product"],
            "amount": amount,
            "currency": currency,
        }

    def _latest(self, kind: str, **match: Any) -> dict[str, Any] | None:
        found = None
        for doc in self.store.page(kind, None):
            if all(doc.get(k) == v for k, v in match.items()):
                found = doc
        return found

    # -- checkout ------------------------------------------------------------------------------
    def confirm_checkout(self, session: dict[str, Any], phone: str) -> dict[str, Any]:
        """The customer entered the PIN: pay and enrol (or fail) per the test number."""
        first, _ = outcomes(phone)
        if first == NEVER:
            return {"outcome": NEVER}
        product = self.store.must("product", session["product"])
        customer = self.store.must("customer", session["customer"])
        currency = self.config.currency_code(session["selected_currency"])
        ctx = {
            "customer": customer["id"],
            "subscription": None,
            "product": product["id"],
            "amount": self.price(
                product, session["selected_billing_cycle"], session["selected_currency"]
            ),
            "currency": currency,
        }
        with self.store.transaction():
            if first != SUCCESS:
                payment = self.new_payment(ctx, "failed", failure_reason=first)
                event = self.events.emit("payment.failed", payment)
                return {"outcome": first, "payment": payment, "events": [event]}
            subscription = None
            period_start = period_end = None
            if product.get("subscription_blueprint"):
                assert currency is not None  # checked when the session was made
                subscription = self.api.new_subscription(
                    session["user_created"],
                    customer,
                    product,
                    session["selected_billing_cycle"],
                    currency,
                    phone=normalise_phone(phone),
                )
                ctx["subscription"] = subscription["id"]
                period_start = subscription["cycle_start_date"]
                period_end = subscription["cycle_end_date"]
                if session.get("action") != "new_subscription":
                    self._stop_replaced(session, subscription)
            customer["phone"] = phone
            customer["user_updated"] = session["user_created"]
            self._touch("customer", customer)
            invoice = self.new_invoice(ctx, "paid", period_start, period_end)
            payment = self.new_payment(ctx, "completed", invoice=invoice["id"])
            session["status"] = "completed"
            session["completed_at"] = self.clock.now_str()
            session["_phone"] = phone
            self._touch("checkout_session", session)
            events = [
                self.events.emit("payment.completed", payment),
                self.events.emit("invoice.paid", invoice),
            ]
        return {
            "outcome": SUCCESS,
            "subscription": subscription,
            "payment": payment,
            "invoice": invoice,
            "events": events,
        }

    def _stop_replaced(self, session: dict[str, Any], new: dict[str, Any]) -> None:
        """A plan change confirmed: the subscription it names in ``upgrade_to`` /
        ``downgrade_to`` (or, when they name a product, the customer's other renewing
        subscriptions) stops renewing; its paid period runs to its end."""
        named = [session.get(f) for f in ("upgrade_to", "downgrade_to") if session.get(f)]
        old = [self.store.get("subscription", str(i)) for i in named]
        replaced = [doc for doc in old if doc is not None]
        if not replaced:
            replaced = [
                doc
                for doc in self.store.page("subscription", None)
                if doc["customer"] == session["customer"] and doc["id"] != new["id"]
            ]
        for doc in replaced:
            if doc["status"] == "published" and doc.get("auto_renew", True):
                doc["auto_renew"] = False
                doc["user_updated"] = session["user_created"]
                self._touch("subscription", doc, due=doc["next_billing_date"])

    def apply_change(self, sub_id: str, values: dict[str, Any]) -> dict[str, Any]:
        """What staff do on the service by hand (the dashboard): ``auto_renew``, or a new
        ``product`` / ``selected_billing_cycle`` / ``selected_currency`` in place, billed from
        the next renewal on (the period paid runs to its end)."""
        sub = self.store.must("subscription", sub_id)
        errors = []
        if "auto_renew" in values:
            flag = values["auto_renew"]
            if isinstance(flag, str):
                flag = flag.strip().lower() in ("1", "true", "on", "yes")
            sub["auto_renew"] = bool(flag)
        product_id = values.get("product") or sub["product"]
        product = self.store.get("product", product_id)
        cycle = values.get("selected_billing_cycle") or sub["selected_billing_cycle"]
        currency = values.get("selected_currency") or sub["selected_currency"]
        if product is None:
            errors.append(error_entry(f"Unknown product {product_id}.", "not_found", "product"))
        else:
            currency_id = self.config.currency_id(str(currency))
            if currency_id is None or not self.price(product, cycle, currency_id):
                message = f"The product has no price for {cycle} in {currency}."
                errors.append(error_entry(message, "no_price", "selected_billing_cycle"))
        if errors:
            raise ValidationFailed(errors)
        sub.update(product=product_id, selected_billing_cycle=cycle, selected_currency=currency)
        return self._touch("subscription", sub, due=sub["next_billing_date"])

    # -- renewals and the clock -------------------------------------------------------------------
    def _move_cycle(self, sub: dict[str, Any]) -> tuple[str, str]:
        unit, freq = timeutil.parse_cycle(sub["selected_billing_cycle"])
        start = timeutil.parse(sub["next_billing_date"])
        end = timeutil.add_cycle(start, unit, freq)
        sub["cycle_start_date"] = timeutil.fmt(start)
        sub["cycle_end_date"] = sub["next_billing_date"] = timeutil.fmt(end)
        sub.pop("_failures", None)
        return sub["cycle_start_date"], sub["cycle_end_date"]

    def renew(self, sub: dict[str, Any]) -> list[dict[str, Any]]:
        """Bill one due period of ``sub`` and emit what happened."""
        events: list[dict[str, Any]] = []
        with self.store.transaction():
            if sub["status"] != "published":
                self.store.save("subscription", sub, due=None)
                return events
            trial_ends = sub.get("trial_end_date") and sub["trial_end_date"] == sub.get(
                "next_billing_date"
            )
            if trial_ends and self.config.trial_end == "lapse":
                sub["status"] = "expired"
                self._touch("subscription", sub, due=None)
                return events
            if not sub.get("auto_renew", True):
                sub["status"] = "canceled"
                self._touch("subscription", sub, due=None)
                return [self.events.emit("subscription.canceled", sub)]
            _, renewal = outcomes(sub.get("_phone"))
            ctx = self._sub_ctx(sub)
            if renewal == SUCCESS:
                period_start, period_end = self._move_cycle(sub)
                invoice = self.new_invoice(ctx, "paid", period_start, period_end)
                payment = self.new_payment(ctx, "completed", invoice=invoice["id"])
                self._touch("subscription", sub, due=sub["next_billing_date"])
                events.append(self.events.emit("payment.completed", payment))
                events.append(self.events.emit("invoice.paid", invoice))
                events.append(self.events.emit("subscription.renewal", sub))
                return events
            failures = sub.get("_failures", 0) + 1
            payment = self.new_payment(ctx, "failed", failure_reason=renewal)
            events.append(self.events.emit("payment.failed", payment))
            if failures >= MAX_RENEWAL_FAILURES:
                sub["status"] = "canceled"
                sub["auto_renew"] = False
                sub.pop("_failures", None)
                self._touch("subscription", sub, due=None)
                events.append(self.events.emit("subscription.canceled", sub))
            else:
                sub["_failures"] = failures
                retry = timeutil.fmt(self.clock.now() + RENEWAL_RETRY)
                self.store.save("subscription", sub, due=retry)
        return events

    def run_due(self) -> dict[str, int]:
        """Renew due subscriptions and expire open sessions at the current sandbox time."""
        summary = {"renewals": 0, "payment_failures": 0, "canceled": 0, "expired_sessions": 0}
        summary["lapsed_trials"] = 0
        for _ in range(100_000):
            now = self.clock.now_str()
            due = self.store.due("subscription", now, limit=500)
            if not due:
                break
            for sub in due:
                events = self.renew(sub)
                summary["lapsed_trials"] += not events and sub["status"] == "expired"
                for event in events:
                    key = {
                        "subscription.renewal": "renewals",
                        "payment.failed": "payment_failures",
                        "subscription.canceled": "canceled",
                    }
                    if event["type"] in key:
                        summary[key[event["type"]]] += 1
        now = self.clock.now_str()
        for session in self.store.due("checkout_session", now, limit=100_000):
            with self.store.transaction():
                if session["status"] == "open":
                    session["status"] = "expired"
                    self._touch("checkout_session", session, due=None)
                    summary["expired_sessions"] += 1
                else:
                    self.store.save("checkout_session", session, due=None)
        return summary

    def expire_if_due(self, session: dict[str, Any]) -> dict[str, Any]:
        if session["status"] == "open" and session["expires_at"] <= self.clock.now_str():
            session["status"] = "expired"
            self._touch("checkout_session", session, due=None)
        return session

    # -- trigger ---------------------------------------------------------------------------------
    def trigger(
        self, event_type: str | None, obj_id: str | None, reason: str | None = None
    ) -> dict[str, Any]:
        """Apply the state change ``event_type`` implies on ``obj_id`` and emit the event."""
        if event_type not in EVENT_TYPES:
            raise ValidationFailed(
                [
                    error_entry(
                        f"Unknown event type {event_type!r}; one of {', '.join(EVENT_TYPES)}.",
                        "unknown_event_type",
                        "type",
                    )
                ]
            )
        kind = self.store.kind_of(obj_id or "")
        if kind is None:
            raise NotFound(f"No object {obj_id}.")
        group, _, action = event_type.partition(".")
        with self.store.transaction():
            doc = getattr(self, f"_trigger_{group}")(action, kind, obj_id, reason)
            return self.events.emit(event_type, doc)

    def _wrong(self, event_type: str, kind: str) -> ValidationFailed:
        return ValidationFailed(
            [error_entry(f"{event_type} cannot apply to a {kind}.", "wrong_object", "object")]
        )

    def _trigger_subscription(
        self, action: str, kind: str, obj_id: str, reason: str | None
    ) -> dict[str, Any]:
        if kind != "subscription":
            raise self._wrong(f"subscription.{action}", kind)
        sub = self.store.must("subscription", obj_id)
        if action == "renewal":
            self._move_cycle(sub)
            return self._touch("subscription", sub, due=sub["next_billing_date"])
        sub["status"] = "canceled" if action == "canceled" else "paused"
        if action == "canceled":
            sub["auto_renew"] = False
        return self._touch("subscription", sub, due=None)

    def _trigger_payment(
        self, action: str, kind: str, obj_id: str, reason: str | None
    ) -> dict[str, Any]:
        status = action  # completed / failed / canceled
        failure = (reason or "declined") if status == "failed" else None
        if kind == "subscription":
            sub = self.store.must("subscription", obj_id)
            ctx = self._sub_ctx(sub)
            invoice = self.new_invoice(
                ctx,
                "paid" if status == "completed" else "open",
                sub["cycle_start_date"],
                sub["cycle_end_date"],
            )
            return self.new_payment(ctx, status, failure_reason=failure, invoice=invoice["id"])
        if kind != "payment":
            raise self._wrong(f"payment.{action}", kind)
        payment = self.store.must("payment", obj_id)
        payment["status"] = status
        payment["failure_reason"] = failure
        return self._touch("payment", payment)

    def _payment_for(self, kind: str, obj_id: str, event_type: str) -> dict[str, Any]:
        if kind == "payment":
            return self.store.must("payment", obj_id)
        if kind == "subscription":
            payment = self._latest("payment", subscription=obj_id, status="completed")
            if payment is None:
                payment = self._trigger_payment("completed", kind, obj_id, None)
            return payment
        raise self._wrong(event_type, kind)

    def _trigger_refund(
        self, action: str, kind: str, obj_id: str, reason: str | None
    ) -> dict[str, Any]:
        if kind == "refund":
            refund = self.store.must("refund", obj_id)
            refund["status"] = action
            if reason:
                refund["reason"] = reason
            return self._touch("refund", refund)
        payment = self._payment_for(kind, obj_id, f"refund.{action}")
        if action == "initiated":
            return self.new_refund(payment, "initiated", reason)
        latest = self._latest("refund", payment=payment["id"], status="initiated")
        refund = latest if latest is not None else self.new_refund(payment, "initiated", reason)
        refund["status"] = action
        return self._touch("refund", refund)

    def _trigger_invoice(
        self, action: str, kind: str, obj_id: str, reason: str | None
    ) -> dict[str, Any]:
        status = INVOICE_STATUS[f"invoice.{action}"]
        if kind == "invoice":
            invoice = self.store.must("invoice", obj_id)
        elif kind == "payment" and self.store.must("payment", obj_id).get("invoice"):
            invoice = self.store.must("invoice", self.store.must("payment", obj_id)["invoice"])
        elif kind == "subscription":
            sub = self.store.must("subscription", obj_id)
            invoice = self.new_invoice(
                self._sub_ctx(sub), "open", sub["cycle_start_date"], sub["cycle_end_date"]
            )
        else:
            raise self._wrong(f"invoice.{action}", kind)
        invoice["status"] = status
        return self._touch("invoice", invoice)

    # -- seeding -----------------------------------------------------------------------------------
    def seed(
        self, account: str, customers: int, subscriptions: int, product_id: str | None = None
    ) -> dict[str, Any]:
        """Bulk-create customers and subscriptions (benchmarks), in one transaction."""
        now = self.clock.now()
        now_s = timeutil.fmt(now)
        customers = max(customers, 1 if subscriptions else 0)
        with self.store.transaction():
            product = None
            if subscriptions:
                product = self.store.get("product", product_id) if product_id else None
                if product_id and product is None:
                    raise NotFound(f"Product {product_id} not found.")
                if product is None:
                    first = next(iter(self.config.currencies))  # 1 (XOF) unless a dialect
                    _, body = self.api.create_product(
                        account,
                        {
                            "name": "Seeded plan",
                            "description": "Created by /_sandbox/seed",
                            "status": "published",
                            "selected_currencies": [str(first)],
                            "subscription_blueprint": {
                                "billing_type": "flat-rate",
                                "billing_cycles": [
                                    {
                                        "cycle": "months",
                                        "frequency": 1,
                                        "prices": [{"currency": first, "amount": 5000}],
                                    }
                                ],
                            },
                        },
                    )
                    product = self.store.must("product", body["data"]["id"])
            blueprint = self.api.blueprint_of(product) if product else None
            base = {
                "date_created": now_s,
                "date_updated": None,
                "user_created": account,
                "user_updated": None,
            }
            cust_docs = []
            for i in range(customers):
                cust_docs.append(
                    (
                        {
                            "id": str(uuid.uuid4()),
                            **base,
                            "status": "published",
                            "identifier": f"seed-{i}",
                            "first_name": "Seed",
                            "last_name": str(i),
                            "email": f"seed{i}@example.com",
                            "address_line_1": None,
                            "address_line_2": None,
                            "phone": None,
                        },
                        None,
                    )
                )
            self.store.insert_many("customer", cust_docs)
            sub_docs = []
            if subscriptions:
                assert product is not None and blueprint is not None  # made above
                cycle = blueprint["billing_cycles"][0]
                code = f"{cycle['cycle']}-{cycle['frequency']}"
                currency = self.config.currency_code(cycle["prices"][0]["currency"])
                end = timeutil.fmt(timeutil.add_cycle(now, cycle["cycle"], cycle["frequency"]))
                for i in range(subscriptions):
                    doc = {
                        "id": str(uuid.uuid4()),
                        **base,
                        "status": "published",
                        "product": product["id"],
                        "customer": cust_docs[i % len(cust_docs)][0]["id"],
                        "cycle_start_date": now_s,
                        "cycle_end_date": end,
                        "next_billing_date": end,
                        "auto_renew": True,
                        "discount_coupon": None,
                        "trial_end_date": None,
                        "selected_billing_cycle": code,
                        "selected_currency": currency,
                    }
                    sub_docs.append((doc, end))
                self.store.insert_many("subscription", sub_docs)
        return {
            "customers": customers,
            "subscriptions": subscriptions,
            "product": public(product) if product else None,
        }
