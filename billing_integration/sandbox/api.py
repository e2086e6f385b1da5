"""The billing endpoints: products, customers, subscriptions, checkout sessions.

Each handler takes the caller's account id and the parsed JSON body (or query) and returns
``(status, body)``; it raises ``ValidationFailed`` (400, one entry per field) or ``NotFound``
(404). Field names, types and wrapping follow section 2 of the interface to the letter.
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any, TypeGuard

from . import clock as timeutil
from .clock import Clock
from .config import SandboxConfig
from .store import Store, public
from .web import NotFound, ValidationFailed, error_entry

PRODUCT_STATUSES = ("draft", "published", "archived")
BILLING_TYPES = ("flat-rate",)
ACTIONS = ("new_subscription",)
#: What a plan change names, when the sandbox accepts change actions (``change_actions``).
CHANGE_FIELDS = ("upgrade_to", "downgrade_to")
Reply = tuple[int, dict[str, Any]]  # status, JSON body
MAX_LIMIT = 1000
DEFAULT_LIMIT = 100
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
#: Status moves a PATCH may make (besides staying put). archived -> anything is refused.
TRANSITIONS = {("draft", "published"), ("draft", "archived"), ("published", "archived")}


def is_uuid(value: Any) -> bool:
    return isinstance(value, str) and bool(_UUID.match(value))


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Checker:
    """Collects per-field validation errors."""

    def __init__(self, body: Any) -> None:
        self.errors: list[dict[str, Any]] = []
        if not isinstance(body, dict):
            self.fail(None, "The request body must be a JSON object.", "invalid_body")
            body = {}
        self.body: dict[str, Any] = body

    def fail(self, field: str | None, message: str, code: str = "invalid") -> None:
        self.errors.append(error_entry(message, code, field))

    def has(self, name: str) -> bool:
        return name in self.body

    def string(
        self, name: str, *, required: bool = True, non_empty: bool = False, default: Any = None
    ) -> Any:
        if name not in self.body or self.body[name] is None:
            if required:
                self.fail(name, f"{name} is required.", "required")
            return default
        value = self.body[name]
        if not isinstance(value, str):
            self.fail(name, f"{name} must be a string.", "invalid_type")
            return default
        if non_empty and not value.strip():
            self.fail(name, f"{name} must not be empty.", "blank")
            return default
        return value

    def check(self) -> None:
        if self.errors:
            raise ValidationFailed(self.errors)


def page_params(args: Any) -> tuple[int, int]:
    """``limit`` (default 100, max 1000) and ``offset`` from the query string."""
    errors = []
    values = {}
    for name, default, low in (("limit", DEFAULT_LIMIT, 1), ("offset", 0, 0)):
        raw = args.get(name)
        if raw is None or raw == "":
            values[name] = default
            continue
        try:
            values[name] = int(raw)
        except ValueError:
            errors.append(error_entry(f"{name} must be an integer.", "invalid_type", name))
            continue
        if values[name] < low:
            errors.append(error_entry(f"{name} must be >= {low}.", "out_of_range", name))
    if values.get("limit", 0) > MAX_LIMIT:
        errors.append(error_entry(f"limit must be <= {MAX_LIMIT}.", "out_of_range", "limit"))
    if errors:
        raise ValidationFailed(errors)
    return values["limit"], values["offset"]


class BillingAPI:
    def __init__(self, store: Store, clock: Clock, config: SandboxConfig) -> None:
        self.store = store
        self.clock = clock
        self.config = config

    # -- helpers ---------------------------------------------------------------------------
    def _meta(self, account: str) -> dict[str, Any]:
        return {
            "id": str(uuid.uuid4()),
            "date_created": self.clock.now_str(),
            "date_updated": None,
            "user_created": account,
            "user_updated": None,
        }

    def _list(self, kind: str, args: Any, ignore_paging: bool) -> tuple[int, dict[str, Any]]:
        limit, offset = page_params(args)
        if ignore_paging or self.config.speaks("no_paging"):
            docs = self.store.page(kind, None, 0)
        else:
            docs = self.store.page(kind, limit, offset)
        return 200, {"data": [public(d) for d in docs]}

    def _price_list(self, value: Any, field: str, chk: Checker) -> list[dict[str, Any]]:
        if not isinstance(value, list) or not value:
            chk.fail(field, f"{field} must be a non-empty array of price objects.", "invalid_type")
            return []
        prices = []
        for i, price in enumerate(value):
            pf = f"{field}[{i}]"
            if not isinstance(price, dict):
                chk.fail(pf, f"{pf} must be an object with currency and amount.", "invalid_type")
                continue
            currency, amount = price.get("currency"), price.get("amount")
            if not is_int(currency):
                chk.fail(
                    f"{pf}.currency", "currency must be an integer currency id.", "invalid_type"
                )
            elif currency not in self.config.currencies:
                chk.fail(f"{pf}.currency", f"Unknown currency id {currency}.", "unknown_currency")
            if not is_number(amount):
                chk.fail(f"{pf}.amount", "amount must be a number.", "invalid_type")
            elif amount < 0:
                chk.fail(f"{pf}.amount", "amount must be >= 0.", "out_of_range")
            prices.append({"currency": currency, "amount": amount})
        return prices

    def _currencies(self, chk: Checker, required: bool) -> list[str] | None:
        if not chk.has("selected_currencies") or chk.body["selected_currencies"] is None:
            if required:
                chk.fail("selected_currencies", "selected_currencies is required.", "required")
            return None
        value = chk.body["selected_currencies"]
        if not isinstance(value, list):
            chk.fail(
                "selected_currencies",
                "selected_currencies must be an array of strings "
                'holding currency ids, e.g. ["1", "2"].',
                "invalid_type",
            )
            return None
        if not value:  # required means at least one: a product sold in no currency sells nothing
            chk.fail(
                "selected_currencies",
                'selected_currencies must name at least one currency id, e.g. ["1"].',
                "blank",
            )
            return None
        result = []
        for i, item in enumerate(value):
            field = f"selected_currencies[{i}]"
            if not isinstance(item, str) or not (item.strip().isascii() and item.strip().isdigit()):
                chk.fail(
                    field,
                    "Each selected currency must be a string holding an integer "
                    'currency id, e.g. "1".',
                    "invalid_type",
                )
            elif int(item) not in self.config.currencies:
                chk.fail(field, f"Unknown currency id {item}.", "unknown_currency")
            else:
                result.append(str(int(item)))
        return result

    def _blueprint(self, value: Any, chk: Checker) -> dict[str, Any] | None:
        field = "subscription_blueprint"
        if not isinstance(value, dict):
            chk.fail(
                field, f"{field} must be an object (billing_type, billing_cycles).", "invalid_type"
            )
            return None
        billing_type = value.get("billing_type")
        if not isinstance(billing_type, str):
            chk.fail(f"{field}.billing_type", "billing_type must be a string.", "invalid_type")
        elif billing_type not in BILLING_TYPES:
            chk.fail(
                f"{field}.billing_type",
                f"Unknown billing_type {billing_type!r}; expected one of {BILLING_TYPES}.",
                "invalid_choice",
            )
        cycles = value.get("billing_cycles")
        if not isinstance(cycles, list) or not cycles:
            chk.fail(
                f"{field}.billing_cycles",
                "billing_cycles must be a non-empty array.",
                "invalid_type",
            )
            cycles = []
        clean, seen = [], set()
        for i, cycle in enumerate(cycles):
            cf = f"{field}.billing_cycles[{i}]"
            if not isinstance(cycle, dict):
                chk.fail(cf, f"{cf} must be an object.", "invalid_type")
                continue
            unit, freq = cycle.get("cycle"), cycle.get("frequency")
            if not isinstance(unit, str):
                chk.fail(f"{cf}.cycle", "cycle must be a string.", "invalid_type")
            elif unit not in timeutil.CYCLE_UNITS:
                chk.fail(
                    f"{cf}.cycle",
                    f"Unknown cycle {unit!r}; expected months or years.",
                    "unknown_cycle",
                )
            if not is_int(freq):
                chk.fail(f"{cf}.frequency", "frequency must be an integer.", "invalid_type")
            elif freq < 1:
                chk.fail(f"{cf}.frequency", "frequency must be >= 1.", "out_of_range")
            elif (unit, freq) in seen:
                chk.fail(cf, f"Duplicate billing cycle {unit}-{freq}.", "duplicate")
            seen.add((unit, freq))
            prices = self._price_list(cycle.get("prices"), f"{cf}.prices", chk)
            clean.append({"cycle": unit, "frequency": freq, "prices": prices})
        return {"billing_type": billing_type, "billing_cycles": clean}

    def _store_blueprint(self, blueprint: dict[str, Any], product_id: str) -> str:
        doc = {"id": str(uuid.uuid4()), "product": product_id, **blueprint}
        self.store.insert("blueprint", doc)
        return str(doc["id"])

    def blueprint_of(self, product: dict[str, Any]) -> dict[str, Any] | None:
        bp = product.get("subscription_blueprint")
        return self.store.get("blueprint", bp) if bp else None

    # -- products --------------------------------------------------------------------------
    def list_products(self, account: str, args: Any, ignore_paging: bool = False) -> Reply:
        return self._list("product", args, ignore_paging)

    def get_product(self, account: str, product_id: str) -> Reply:
        doc = self.store.get("product", product_id)
        if doc is None:
            raise NotFound(f"Product {product_id} not found.")
        return 200, {"data": public(doc)}

    def create_product(self, account: str, body: Any) -> Reply:
        chk = Checker(body)
        name = chk.string("name", non_empty=True)
        description = chk.string("description", required=False, default="")
        status = chk.string("status", required=False, default="draft")
        if status is not None and status not in PRODUCT_STATUSES:
            chk.fail(
                "status",
                f"Unknown status {status!r}; expected one of {PRODUCT_STATUSES}.",
                "invalid_choice",
            )
        currencies = self._currencies(chk, required=True)
        bp_in = chk.body.get("subscription_blueprint")
        prices_in = chk.body.get("prices")
        blueprint = prices = None
        if bp_in is not None and prices_in is not None:
            chk.fail(
                "prices",
                "A product has either subscription_blueprint (recurring) or "
                "root prices (one-time), not both.",
                "conflict",
            )
        elif bp_in is not None:
            blueprint = self._blueprint(bp_in, chk)
        elif prices_in is not None:
            prices = self._price_list(prices_in, "prices", chk)
        else:
            chk.fail(
                "subscription_blueprint",
                "Give subscription_blueprint (recurring product) or prices (one-time product).",
                "required",
            )
        self._check_extras(chk)
        chk.check()
        doc = self._meta(account)
        doc.update(
            {
                "name": name,
                "description": description,
                "status": status,
                "selected_currencies": currencies,
                "subscription_blueprint": None,
                "prices": prices,
                "image": chk.body.get("image"),
                "features": chk.body.get("features") or [],
            }
        )
        with self.store.transaction():
            if blueprint is not None:
                doc["subscription_blueprint"] = self._store_blueprint(blueprint, doc["id"])
            self.store.insert("product", doc)
        return 200, {"data": public(doc)}

    def _check_extras(self, chk: Checker) -> None:
        if chk.has("features") and not isinstance(chk.body["features"], list | type(None)):
            chk.fail("features", "features must be an array.", "invalid_type")

    def update_product(self, account: str, product_id: str, body: Any) -> Reply:
        doc = self.store.get("product", product_id)
        if doc is None:
            raise NotFound(f"Product {product_id} not found.")
        chk = Checker(body)
        changes: dict[str, Any] = {}
        if chk.has("name"):
            changes["name"] = chk.string("name", non_empty=True)
        if chk.has("description"):
            changes["description"] = chk.string("description", default="")
        if chk.has("status"):
            status = chk.string("status")
            if status is not None:
                if status not in PRODUCT_STATUSES:
                    chk.fail(
                        "status",
                        f"Unknown status {status!r}; expected one of {PRODUCT_STATUSES}.",
                        "invalid_choice",
                    )
                elif status != doc["status"] and (doc["status"], status) not in self._moves():
                    chk.fail(
                        "status",
                        f"A {doc['status']} product cannot become {status}.",
                        "invalid_transition",
                    )
                changes["status"] = status
        if chk.has("selected_currencies"):
            changes["selected_currencies"] = self._currencies(chk, required=True)
        blueprint = None
        if chk.has("subscription_blueprint"):
            if doc["subscription_blueprint"] is None:
                chk.fail(
                    "subscription_blueprint",
                    "A one-time product has no subscription_blueprint.",
                    "not_allowed",
                )
            else:
                blueprint = self._blueprint(chk.body["subscription_blueprint"], chk)
        if chk.has("prices"):  # not a field of the update (interface 4.5)
            chk.fail(
                "prices",
                "prices cannot be changed: a PATCH takes status, name, description, "
                "selected_currencies and subscription_blueprint.",
                "not_allowed",
            )
        chk.check()
        with self.store.transaction():
            if blueprint is not None:
                changes["subscription_blueprint"] = self._store_blueprint(blueprint, doc["id"])
            doc.update(changes)
            doc["date_updated"] = self.clock.now_str()
            doc["user_updated"] = account
            self.store.save("product", doc)
        return 200, {"data": public(doc)}

    def _moves(self) -> set[tuple[str, str]]:
        """The status moves a PATCH may make (the ``refuse_draft_archive`` dialect: one fewer)."""
        if self.config.speaks("refuse_draft_archive"):
            return TRANSITIONS - {("draft", "archived")}
        return TRANSITIONS

    # -- customers -------------------------------------------------------------------------
    def list_customers(self, account: str, args: Any, ignore_paging: bool = False) -> Reply:
        return self._list("customer", args, ignore_paging)

    def create_customer(self, account: str, body: Any) -> Reply:
        chk = Checker(body)
        identifier = chk.string("identifier", non_empty=True)
        first_name = chk.string("first_name", required=False, default="")
        last_name = chk.string("last_name", required=False, default="")
        email = chk.string("email", required=False, default="")
        if email and "@" not in email:
            chk.fail("email", "email must be an email address.", "invalid")
        for name in ("address_line_1", "address_line_2", "phone"):
            if chk.has(name):
                chk.fail(name, f"{name} is not accepted on creation.", "not_accepted")
        chk.check()
        doc = self._meta(account)
        doc.update(
            {
                "status": "published",
                "identifier": identifier,
                "first_name": first_name,
                "last_name": last_name,
                "email": email,
                "address_line_1": None,
                "address_line_2": None,
                "phone": None,
            }
        )
        self.store.insert("customer", doc)
        return 200, {"data": public(doc)}

    # -- subscriptions ---------------------------------------------------------------------
    def list_subscriptions(self, account: str, args: Any, ignore_paging: bool = False) -> Reply:
        return self._list("subscription", args, ignore_paging)

    def _reference(self, chk: Checker, name: str, kind: str) -> dict[str, Any] | None:
        value = chk.string(name)
        if value is None:
            return None
        if not is_uuid(value):
            chk.fail(name, f"{name} must be a UUID.", "invalid")
            return None
        doc = self.store.get(kind, value)
        if doc is None:
            chk.fail(name, f"Unknown {kind} {value}.", "unknown_" + kind)
        return doc

    def _sellable(self, chk: Checker, product: dict[str, Any] | None) -> None:
        if product is None:
            return
        if product["status"] == "archived":
            chk.fail(
                "product",
                "The product is archived: it takes no new subscriptions or purchases.",
                "product_archived",
            )
        elif product["status"] != "published":
            chk.fail(
                "product",
                f"The product is not published (status {product['status']}).",
                "product_not_published",
            )

    def _cycle_prices(
        self, chk: Checker, product: dict[str, Any] | None, required: bool
    ) -> tuple[str | None, list[dict[str, Any]] | None]:
        """Validate ``selected_billing_cycle`` against the product; return it and its prices."""
        code = chk.string("selected_billing_cycle", required=required)
        if product is None:
            return code, None
        blueprint = self.blueprint_of(product)
        if blueprint is None:
            if code is not None:
                chk.fail(
                    "selected_billing_cycle",
                    "A one-time product has no billing cycles.",
                    "not_allowed",
                )
            return None, product.get("prices") or []
        if code is None:
            return None, None
        try:
            unit, freq = timeutil.parse_cycle(code)
        except ValueError as exc:
            chk.fail("selected_billing_cycle", str(exc), "invalid")
            return code, None
        for cycle in blueprint["billing_cycles"]:
            if cycle["cycle"] == unit and cycle["frequency"] == freq:
                return code, cycle["prices"]
        offered = ", ".join(f"{c['cycle']}-{c['frequency']}" for c in blueprint["billing_cycles"])
        chk.fail(
            "selected_billing_cycle",
            f"The product has no billing cycle {code}; it offers {offered}.",
            "unknown_cycle",
        )
        return code, None

    def _currency_in(
        self,
        chk: Checker,
        currency_id: int | None,
        product: dict[str, Any] | None,
        prices: list[dict[str, Any]] | None,
    ) -> None:
        if currency_id is None or product is None:
            return
        if str(currency_id) not in (product.get("selected_currencies") or []):
            chk.fail(
                "selected_currency",
                "The currency is not one of the product's selected_currencies.",
                "currency_not_offered",
            )
        elif prices is not None and not any(p["currency"] == currency_id for p in prices):
            chk.fail(
                "selected_currency",
                "The product has no price in this currency for the selected billing cycle.",
                "no_price",
            )

    def _subscription_currency(self, chk: Checker) -> tuple[str | None, int | None]:
        """``selected_currency`` of POST /subscriptions as (code, id). The interface types the
        field as a string and does not fix its content: a currency code (``"XOF"``) or a
        currency id written as a string (``"1"``) are both accepted; a JSON number is not a
        string and is refused (400 ``invalid_type``)."""
        value = chk.body.get("selected_currency")
        if value is None:
            chk.fail("selected_currency", "selected_currency is required.", "required")
            return None, None
        if not isinstance(value, str):
            chk.fail(
                "selected_currency",
                "selected_currency must be a string: a currency code "
                '("XOF") or a currency id written as a string ("1").',
                "invalid_type",
            )
            return None, None
        if value.isascii() and value.isdigit():
            number = int(value)
            currency_id: int | None = number
            code = self.config.currency_code(number)
        else:
            code, currency_id = value, self.config.currency_id(value)
        if code is None or currency_id is None:
            known = ", ".join(f"{c} ({i})" for i, c in self.config.currencies.items())
            chk.fail(
                "selected_currency",
                f"Unknown currency {value!r}; one of {known}.",
                "unknown_currency",
            )
            return None, None
        return code, currency_id

    def create_subscription(self, account: str, body: Any) -> Reply:
        chk = Checker(body)
        customer = self._reference(chk, "customer", "customer")
        product = self._reference(chk, "product", "product")
        self._sellable(chk, product)
        if product is not None and product["subscription_blueprint"] is None:
            chk.fail("product", "A one-time product cannot be subscribed to.", "not_recurring")
            product = None
        code, prices = self._cycle_prices(chk, product, required=True)
        currency, currency_id = self._subscription_currency(chk)
        self._currency_in(chk, currency_id, product, prices)
        trial_end = None
        if chk.body.get("trial_end_date") is not None:
            raw = chk.string("trial_end_date")
            if raw is not None:
                try:
                    trial_end = timeutil.parse(raw)
                except ValueError:
                    chk.fail(
                        "trial_end_date",
                        "trial_end_date must be an ISO 8601 timestamp.",
                        "invalid_timestamp",
                    )
        auto_renew = chk.body.get("auto_renew", True)
        if auto_renew is None:
            auto_renew = True
        if not isinstance(auto_renew, bool):
            chk.fail("auto_renew", "auto_renew must be a boolean.", "invalid_type")
        chk.check()  # raises unless every check passed: what follows is set
        assert customer is not None and product is not None
        assert code is not None and currency is not None
        doc = self.new_subscription(
            account, customer, product, code, currency, auto_renew, trial_end
        )
        return 200, {"data": [public(doc)]}

    def new_subscription(
        self,
        account: str,
        customer: dict[str, Any],
        product: dict[str, Any],
        cycle_code: str,
        currency_code: str,
        auto_renew: bool = True,
        trial_end: Any = None,
        phone: str | None = None,
    ) -> dict[str, Any]:
        """Create and store a subscription starting now (shared with checkout and seeding)."""
        now = self.clock.now()
        unit, freq = timeutil.parse_cycle(cycle_code)
        in_trial = trial_end is not None and trial_end > now
        # A trial's end is the first billing date; otherwise one cycle from now.
        end = trial_end if in_trial else timeutil.add_cycle(now, unit, freq)
        doc = self._meta(account)
        doc.update(
            {
                "status": "published",
                "product": product["id"],
                "customer": customer["id"],
                "cycle_start_date": timeutil.fmt(now),
                "cycle_end_date": timeutil.fmt(end),
                "next_billing_date": timeutil.fmt(end),
                "auto_renew": auto_renew,
                "discount_coupon": None,
                "trial_end_date": None if trial_end is None else timeutil.fmt(trial_end),
                "selected_billing_cycle": cycle_code,
                "selected_currency": currency_code,
                "_phone": phone,
            }
        )
        self.store.insert("subscription", doc, due=doc["next_billing_date"])
        return doc

    # -- checkout sessions -----------------------------------------------------------------
    def create_checkout_session(self, account: str, body: Any) -> Reply:
        chk = Checker(body)
        customer = self._reference(chk, "customer", "customer")
        product = self._reference(chk, "product", "product")
        self._sellable(chk, product)
        recurring = product is not None and product["subscription_blueprint"] is not None
        code, prices = self._cycle_prices(chk, product, required=recurring or product is None)
        currency_id = chk.body.get("selected_currency")
        if currency_id is None:
            chk.fail("selected_currency", "selected_currency is required.", "required")
        elif not is_int(currency_id):
            chk.fail(
                "selected_currency",
                "selected_currency must be an integer currency id.",
                "invalid_type",
            )
            currency_id = None
        elif currency_id not in self.config.currencies:
            chk.fail("selected_currency", f"Unknown currency id {currency_id}.", "unknown_currency")
            currency_id = None
        self._currency_in(chk, currency_id, product, prices)
        action = chk.string("action", required=False, default="new_subscription")
        accepted = (*ACTIONS, *self.config.change_actions)
        if action is not None and action not in accepted:
            chk.fail(
                "action",
                f"Unsupported action {action!r}; the sandbox accepts {', '.join(accepted)}.",
                "invalid_choice",
            )
        changes = {name: self._change_target(chk, name, action) for name in CHANGE_FIELDS}
        now = self.clock.now()
        expires = now + timedelta(seconds=self.config.checkout_expiry)
        if chk.body.get("expires_at") is not None:
            raw = chk.string("expires_at")
            if raw is not None:
                try:
                    expires = timeutil.parse(raw)
                except ValueError:
                    chk.fail(
                        "expires_at",
                        "expires_at must be an ISO 8601 timestamp.",
                        "invalid_timestamp",
                    )
                else:
                    if expires <= now:
                        chk.fail("expires_at", "expires_at must be in the future.", "in_the_past")
        chk.check()  # raises unless every check passed
        assert customer is not None and product is not None
        doc = self._meta(account)
        doc.update(
            {
                "status": "open",
                "customer": customer["id"],
                "product": product["id"],
                "expires_at": timeutil.fmt(expires),
                "action": action,
                **changes,
                "completed_at": None,
                "selected_billing_cycle": code,
                "selected_currency": currency_id,
            }
        )
        self.store.insert("checkout_session", doc, due=doc["expires_at"])
        return 200, {"data": public(doc)}

    def _change_target(self, chk: Checker, name: str, action: str | None) -> str | None:
        """``upgrade_to`` / ``downgrade_to``: null, or (with an accepted change action) the id of
        a subscription or a product."""
        value = chk.body.get(name)
        if value is None:
            return None
        if action in ACTIONS:
            chk.fail(name, f"{name} needs a change action, not {action}.", "not_allowed")
        elif not is_uuid(value):
            chk.fail(name, f"{name} must be a subscription or product id.", "invalid")
        elif self.store.kind_of(value) not in ("subscription", "product"):
            chk.fail(name, f"Unknown subscription or product {value}.", "not_found")
        return value if isinstance(value, str) else None

    # -- the guessed PATCH /subscriptions/{id} ----------------------------------------------
    def update_subscription(self, account: str, subscription_id: str, body: Any) -> Reply:
        """``auto_renew`` only, when ``patch_subscriptions`` is on; otherwise no such route."""
        if not self.config.patch_subscriptions:
            raise NotFound(f"No route /v1/api/billing/subscriptions/{subscription_id}.")
        doc = self.store.get("subscription", subscription_id)
        if doc is None:
            raise NotFound(f"Subscription {subscription_id} not found.")
        chk = Checker(body)
        for name in chk.body:
            if name != "auto_renew":
                chk.fail(name, f"{name} cannot be changed; only auto_renew.", "not_allowed")
        value = chk.body.get("auto_renew")
        if not isinstance(value, bool):
            chk.fail("auto_renew", "auto_renew must be a boolean.", "invalid_type")
        elif doc["status"] != "published":
            chk.fail("auto_renew", f"The subscription is {doc['status']}.", "invalid_state")
        chk.check()
        doc["auto_renew"] = value
        doc["date_updated"] = self.clock.now_str()
        doc["user_updated"] = account
        self.store.save("subscription", doc, due=doc["next_billing_date"])
        return 200, {"data": public(doc)}
