"""The integration's health; imports neither models nor Celery at import time (tasks import it)."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.cache.backends.dummy import DummyCache
from django.core.cache.backends.locmem import LocMemCache
from django.db import transaction
from django.db.models import Count, Exists, Max, Min, OuterRef, Q
from django.utils import timezone
from django.utils.translation import gettext as _

from .conf import billing_settings, shared_cache
from .exceptions import BillingError, without_user_info

logger = logging.getLogger("billing_integration.health")

OK, WARNING, FAIL = "ok", "warning", "fail"

#: The names the beat tasks record (``billing_integration.schedule.BEAT_SCHEDULE``).
PERIODIC_JOBS = ("drain_outbox", "process_pending_webhook_events", "sync_all")
#: The jobs beat runs every minute, each the only retry of a lost message (the hourly
#: ``sync_all`` is watched by the ``pull`` fact).
MINUTE_JOBS = ("drain_outbox", "process_pending_webhook_events")
#: Each full pull records ``pull:<resource>`` when it ends.
PULLED_RESOURCES = ("products", "customers", "subscriptions")

#: The facts, in report order (``--skip`` takes these names).
FACTS: tuple[str, ...] = ("token", "service", "broker", "workers", "beat", "outbox")
FACTS += ("outbox_failed",)
FACTS += ("events", "events_failed", "events_unrecognised", "notices")
FACTS += ("refused", "pull", "guesses", "plans")
#: Seconds back the ``events_unrecognised`` fact counts unrecognised events (a day).
UNRECOGNISED_WINDOW = 86400
#: Seconds back the ``notices`` fact looks (a day): older notices no longer warn.
NOTICES_WINDOW = 86400
#: A notice ``sending`` longer than this (its worker died while sending it) is stuck.
NOTICE_STUCK_AFTER = 3600
#: A notice still ``queued`` longer than this was not picked up by the sweep (every 5 minutes).
NOTICE_QUEUED_AFTER = 900

#: Cache backends whose content each process keeps to itself.
PROCESS_LOCAL_BACKENDS = (LocMemCache, DummyCache)
REFUSAL_REASONS = ("bad_signature", "stale_timestamp", "missing_headers", "too_large", "redirected")
#: Seconds of refusals the doctor counts (the last hour), in one counter per minute.
REFUSALS_WINDOW = 3600
_REFUSAL_BUCKET = 60


def record_run(name: str) -> None:
    """Record now as the last run of ``name``; never raises (in a savepoint, a failure logged)."""
    from .models.health import Heartbeat

    now = timezone.now()
    try:
        with transaction.atomic():
            if not Heartbeat.objects.filter(name=name).update(at=now):
                Heartbeat.objects.create(name=name, at=now)
    except Exception as exc:  # e.g. the table not migrated yet, or a concurrent first insert
        logger.warning("health: could not record the run of %s (%s)", name, exc)


def _refusal_key(reason: str, suffix: object) -> str:
    return f"billing_integration:refused:{reason}:{suffix}"


def record_refused(reason: str, now: float | None = None) -> None:
    """Count one refused delivery of ``reason`` in the shared cache; never raises. The time of
    the last one is kept beyond the hour (no expiry): a service that retries less often than
    hourly, or gave up, leaves refusals that no accepted delivery followed."""
    at = time.time() if now is None else now
    counter = _refusal_key(reason, int(at // _REFUSAL_BUCKET))
    try:
        cache = shared_cache()
        window = REFUSALS_WINDOW + _REFUSAL_BUCKET
        if not cache.add(counter, 1, timeout=window):
            cache.incr(counter)
            cache.touch(counter, window)  # the database cache's incr() sets its default timeout
        cache.set(_refusal_key(reason, "last"), at, timeout=None)
    except Exception as exc:  # the cache down, or the counter expired between add and incr
        logger.warning("health: could not count a refused delivery (%s)", _error(exc))


def refused_deliveries(now: float | None = None) -> dict[str, dict[str, Any]]:
    """``reason -> {"count": refusals in the last hour, "last": unix time or None}`` (the last
    may be older than the hour)."""
    at = time.time() if now is None else now
    current = int(at // _REFUSAL_BUCKET)
    minutes = range(current - REFUSALS_WINDOW // _REFUSAL_BUCKET + 1, current + 1)
    keys = {reason: [_refusal_key(reason, m) for m in minutes] for reason in REFUSAL_REASONS}
    lasts = {reason: _refusal_key(reason, "last") for reason in REFUSAL_REASONS}
    found = shared_cache().get_many([k for ks in keys.values() for k in ks] + list(lasts.values()))
    counts = {reason: sum(int(found.get(k) or 0) for k in ks) for reason, ks in keys.items()}
    return {r: {"count": counts[r], "last": found.get(last)} for r, last in lasts.items()}


def last_runs() -> dict[str, datetime]:
    """Every recorded ``name -> last run``."""
    from .models.health import Heartbeat

    return dict(Heartbeat.objects.values_list("name", "at"))


@dataclass
class Thresholds:
    """Limits beyond which a fact fails. An age of 0 switches its limit off."""

    max_beat_age: float = 300.0  # seconds since the newest periodic job run
    max_outbox_age: float = 600.0  # seconds the oldest pending outbox entry has waited
    max_failed_entries: int = 0
    max_event_lag: float = 300.0  # seconds the oldest unprocessed event has waited
    max_failed_events: int = 0
    max_pull_age: float = 3 * 3600.0  # seconds since each resource's last full pull
    timeout: float = 5.0  # seconds: the token request, the service read, the broker connection
    ping_timeout: float = 1.0  # seconds workers have to answer the ping


@dataclass
class Fact:
    """One line of the report: a ``key`` of ``FACTS``, a status, a summary and its data."""

    key: str
    status: str
    summary: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class HealthReport:
    facts: list[Fact]
    checked_at: datetime

    @property
    def healthy(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[Fact]:
        return [f for f in self.facts if f.status == FAIL]

    def as_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "checked_at": self.checked_at.isoformat(),
            "facts": [_jsonable(asdict(f)) for f in self.facts],
        }


def diagnose(
    thresholds: Thresholds | None = None,
    *,
    skip: tuple[str, ...] | list[str] = (),
    now: datetime | None = None,
) -> HealthReport:
    """Gather every fact not in ``skip``. Never raises."""
    limits = thresholds or Thresholds()
    now = now or timezone.now()
    probes: list[tuple[tuple[str, ...], Any]] = [  # (the facts it gives, the probe)
        (("token", "service"), lambda: _token_and_service(limits, skip)),
        (("broker", "workers"), lambda: _broker_and_workers(limits, skip)),
        (("beat",), lambda: [_beat(limits, now)]),
        (("outbox", "outbox_failed"), lambda: _outbox(limits, now)),
        (("events", "events_failed"), lambda: _events(limits, now)),
        (("events_unrecognised",), lambda: [_unrecognised(now)]),
        (("notices",), lambda: [_notices(now)]),
        (("refused",), lambda: [_refused(now)]),
        (("pull",), lambda: [_pull(limits, now)]),
        (("guesses",), lambda: [_guesses()]),
        (("plans",), lambda: [_plans()]),
    ]
    facts: list[Fact] = []
    for keys, probe in probes:
        if all(key in skip for key in keys):
            continue
        try:
            found = probe()
        except Exception as exc:  # one unreadable fact must not hide the others
            found = [_unchecked(keys[0], exc)]
        facts.extend(f for f in found if f.key not in skip)
    return HealthReport(facts=facts, checked_at=now)


def _token_and_service(limits: Thresholds, skip: Any) -> list[Fact]:
    """The token fact, then the service fact (which reads the API only if a token came)."""
    from .client import BillingClient, RetryPolicy

    try:
        client = BillingClient(
            retry=RetryPolicy(max_retries=0), timeout=(limits.timeout,) * 2, page_size=1
        )
    except BillingError as exc:
        text = _("token: not configured: %(error)s") % {"error": exc}
        return [Fact("token", FAIL, text, {"error": str(exc)}), _checked_service(None)]
    try:
        token = None if "token" in skip else _token(client)
        if "service" in skip:
            return [token] if token else []
        service = _checked_service(client if token is None or token.status == OK else None)
        return [token, service] if token else [service]
    finally:
        client.session.close()


def _token(client: Any) -> Fact:
    """Fetch a new token through the client, no retries, ``timeout`` per request."""
    url = without_user_info(client.token_url)
    started = time.perf_counter()
    try:
        lifetime = client.probe_token()
    except BillingError as exc:
        text = _("token: could not be fetched from %(url)s: %(error)s") % {"url": url, "error": exc}
        return Fact("token", FAIL, text, {"url": url, "error": str(exc)})
    elapsed = time.perf_counter() - started
    text = _("token: a new token was fetched from %(url)s in %(ms)d ms (expires in %(life)s)")
    values = {"url": url, "ms": round(elapsed * 1000), "life": duration(lifetime)}
    data = {"url": url, "seconds": round(elapsed, 3), "expires_in": lifetime}
    return Fact("token", OK, text % values, data)


def _checked_service(client: Any | None) -> Fact:
    """``_service``, its failure to be checked (the database down) a fact of its own: the
    token fact beside it is still reported."""
    try:
        return _service(client)
    except Exception as exc:
        return _unchecked("service", exc)


def _unchecked(key: str, exc: Exception) -> Fact:
    error = _error(exc)
    text = _("%(fact)s: could not be checked: %(error)s") % {"fact": key, "error": error}
    return Fact(key, FAIL, text, {"error": error})


#: The settings that name the service (``ServiceIdentity``'s fields).
SERVICE_KEYS = {"base_url": "BASE_URL", "realm": "REALM", "client_id": "CLIENT_ID"}


def _service(client: Any | None) -> Fact:
    """The service the mirror belongs to against the settings' (nothing is recorded here), then
    one read of the product list (one item, ``timeout`` per request) with the shared token, as
    pushes and pulls send it: ``BASE_URL``, which the token fact does not use."""
    from .client import API_PREFIX
    from .service import configured_service, holds_nothing, mismatch_message, recorded_service

    recorded = recorded_service()
    try:
        configured = configured_service(client)
    except BillingError:  # a setting is missing: the token fact names it
        return Fact("service", WARNING, _("service: not checked, the settings are incomplete"))
    if recorded is not None and recorded != configured and not holds_nothing():
        keys = ", ".join(
            f"BILLING['{key}']"
            for field, key in SERVICE_KEYS.items()
            if getattr(recorded, field) != getattr(configured, field)
        )
        text = _("service: the settings (%(keys)s) name another service than the mirror's. ")
        text = str(text % {"keys": keys}) + mismatch_message(recorded, configured)
        sides = {"recorded": recorded.as_dict(), "configured": configured.as_dict()}
        return Fact("service", FAIL, text, sides)
    if client is None:
        return Fact("service", WARNING, _("service: not read, no token (see token)"))
    url = without_user_info(f"{client.base_url}{API_PREFIX}/products")
    if client.known_down():  # a call now would wait for the shared back-off to end
        text = _("service: not read, every process is waiting a few seconds for it (found down)")
        return Fact("service", WARNING, text, {"url": url})
    started = time.perf_counter()
    try:  # no retry, no deadline: a failure here pauses no other process
        next(client.iter_pages("products"), None)
    except BillingError as exc:
        text = _(
            "service: %(url)s could not be read: %(error)s: check BILLING['BASE_URL'] (billing "
            "paths are {BASE_URL}/v1/api/billing/...) and that the client's account may read "
            "products"
        )
        return Fact("service", FAIL, text % {"url": url, "error": exc}, {"url": url})
    elapsed = time.perf_counter() - started
    values = {"url": url, "ms": round(elapsed * 1000)}
    data = {"url": url, "seconds": round(elapsed, 3), "recorded": recorded is not None}
    if recorded is None:
        text = _("service: %(url)s was read in %(ms)d ms; no push or pull has recorded it yet")
    else:
        text = _("service: %(url)s was read in %(ms)d ms; the mirror belongs to this service")
    return Fact("service", OK, text % values, data)


def celery_app() -> Any | None:
    """The host's Celery app, or None when only Celery's fallback app is loaded."""
    from celery import current_app

    app = current_app._get_current_object()
    if app.main == "default" and not app.set_as_current:
        return None
    return app


def _broker_and_workers(limits: Thresholds, skip: Any) -> list[Fact]:
    app = celery_app()
    if app is None:
        text = _(
            "broker: no Celery app is loaded in this process (see the README's installation steps)"
        )
        return [Fact("broker", FAIL, text)]
    if app.conf.task_always_eager:
        text = _("broker: not used, tasks run eagerly in the calling process (task_always_eager)")
        return [Fact("broker", WARNING, text, {"eager": True})]
    conn = app.connection_for_write(connect_timeout=limits.timeout)
    url = conn.as_uri()  # the password masked
    try:
        try:
            conn.ensure_connection(
                max_retries=1, interval_start=0, interval_step=0.2, timeout=limits.timeout
            )
        except Exception as exc:
            error = _error(exc)
            text = _("broker: %(url)s is unreachable: %(error)s") % {"url": url, "error": error}
            return [
                Fact("broker", FAIL, text, {"url": url, "error": error}),
                Fact("workers", WARNING, _("workers: not pinged, the broker is unreachable")),
            ]
        broker = Fact("broker", OK, _("broker: %(url)s is reachable") % {"url": url}, {"url": url})
        if "workers" in skip:
            return [broker]
        if "fanout" not in conn.transport.implements.exchange_type:
            text = _("workers: cannot ping workers with this broker (no broadcast)")
            return [broker, Fact("workers", WARNING, text, {"pingable": False})]
    finally:
        conn.release()
    replies = app.control.ping(timeout=limits.ping_timeout) or []
    names = sorted(name for reply in replies for name in reply)
    if not names:
        text = _("workers: no worker answered a ping within %(timeout)s")
        text %= {"timeout": duration(limits.ping_timeout)}
        return [broker, Fact("workers", FAIL, text, {"workers": []})]
    text = _("workers: %(count)d answered a ping (%(names)s)")
    text %= {"count": len(names), "names": ", ".join(names)}
    return [broker, Fact("workers", OK, text, {"workers": names})]


def _beat(limits: Thresholds, now: datetime) -> Fact:
    runs = last_runs()
    jobs = {name: runs[name] for name in PERIODIC_JOBS if name in runs}
    if not jobs:
        text = _(
            "beat: no periodic run recorded (is celery beat running "
            "with billing_integration's BEAT_SCHEDULE?)"
        )
        return Fact("beat", FAIL, text, {"last_runs": jobs})
    age = _age(now, max(jobs.values()))
    data: dict[str, Any] = {"last_runs": jobs, "age": age}
    each = ", ".join(f"{name} {duration(_age(now, at))}" for name, at in jobs.items())
    values = {"age": duration(age), "limit": duration(limits.max_beat_age), "each": each}
    if limits.max_beat_age and age > limits.max_beat_age:
        text = _("beat: the last periodic run was %(age)s ago, more than %(limit)s (%(each)s)")
        return Fact("beat", FAIL, text % values, data)
    if never := [name for name in MINUTE_JOBS if name not in jobs]:
        text = _(
            "beat: the last periodic run was %(age)s ago (%(each)s), but %(never)s never "
            "ran: is it in the beat schedule (billing_integration.schedule.BEAT_SCHEDULE)? "
            "Without it a lost push or event message is never sent again"
        )
        values["never"] = ", ".join(never)
        return Fact("beat", WARNING, text % values, {**data, "never_ran": never})
    text = _("beat: the last periodic run was %(age)s ago (%(each)s)")
    return Fact("beat", OK, text % values, data)


def _outbox(limits: Thresholds, now: datetime) -> list[Fact]:
    from .models.outbox import OutboxEntry

    entries = OutboxEntry.objects
    open_count = entries.open().count()
    oldest = entries.pending().order_by("created_at").values_list("created_at", flat=True).first()
    failed = entries.failed().count()
    age = _age(now, oldest) if oldest else None
    data = {"open": open_count, "oldest_pending": oldest, "oldest_pending_age": age}
    limit = duration(limits.max_outbox_age)
    values = {"open": open_count, "age": duration(age or 0), "limit": limit}
    if age is None:
        text = _("outbox: %(open)d open entries, none pending")
        backlog = Fact("outbox", OK, text % values, data)
    elif limits.max_outbox_age and age > limits.max_outbox_age:
        text = _(
            "outbox: %(open)d open entries, the oldest pending "
            "has waited %(age)s, more than %(limit)s"
        )
        backlog = Fact("outbox", FAIL, text % values, data)
    else:
        text = _("outbox: %(open)d open entries, the oldest pending has waited %(age)s")
        backlog = Fact("outbox", OK, text % values, data)
    text = _("failed entries: %(count)d in the outbox (admin: 'Retry failed push')")
    status = FAIL if failed > limits.max_failed_entries else OK
    return [backlog, Fact("outbox_failed", status, text % {"count": failed}, {"failed": failed})]


def _last_received() -> datetime | None:
    """When the newest stored delivery was received (an indexed lookup per state, no scan)."""
    from .models.events import EventState, WebhookEvent

    latest = [
        WebhookEvent.objects.filter(state=state).aggregate(at=Max("received_at"))["at"]
        for state in EventState.values
    ]
    return max((at for at in latest if at is not None), default=None)


def _events(limits: Thresholds, now: datetime) -> list[Fact]:
    from .models.events import EventState, WebhookEvent

    events = WebhookEvent.objects
    last = _last_received()
    waiting = events.filter(state=EventState.RECEIVED).order_by("received_at")
    oldest = waiting.values_list("received_at", flat=True).first()
    failed = events.filter(state=EventState.FAILED).count()
    lag = _age(now, oldest) if oldest else 0.0
    data: dict[str, Any] = {"last_received": last, "oldest_unprocessed": oldest, "lag": lag}
    received = _("none received yet")
    if last:
        received = _("the last was received %(age)s ago") % {"age": duration(_age(now, last))}
    values: dict[str, Any] = {"received": received, "lag": duration(lag)}
    values["limit"] = duration(limits.max_event_lag)
    if limits.max_event_lag and lag > limits.max_event_lag:
        text = _(
            "events: %(received)s; the oldest unprocessed has waited %(lag)s, more than %(limit)s"
        )
        flow = Fact("events", FAIL, text % values, data)
    elif unheard := _returns_unheard(limits, now, last):
        count, first = unheard
        text = _(
            "events: %(received)s, though %(count)d checkout(s) came back from the service's "
            "page since, the first %(age)s ago: its deliveries do not seem to reach this site. "
            "Check that the callback URL registered with the service is this site's "
            "%(path)s, and the web server's log (a 404 there: another path)"
        )
        values.update(count=count, age=duration(_age(now, first)), path=webhook_path())
        data.update(checkouts_unheard=count, callback_path=webhook_path())
        flow = Fact("events", WARNING, text % values, data)
    else:
        flow = Fact("events", OK, _("events: %(received)s; processing lag %(lag)s") % values, data)
    text = _("failed events: %(count)d (admin: Event deliveries, 'Replay')")
    status = FAIL if failed > limits.max_failed_events else OK
    return [flow, Fact("events_failed", status, text % {"count": failed}, {"failed": failed})]


def _returns_unheard(
    limits: Thresholds, now: datetime, last: datetime | None
) -> tuple[int, datetime] | None:
    """Checkout sessions a customer came back from (the return page) after the last delivery
    received, longer ago than ``max_event_lag``, and paid: the mirror holds a subscription of
    their customer and product made since the session (the return page's pull found it).
    (How many, the first return), or None. The service had a payment to tell of, and told
    nothing; a page left unpaid may have nothing to tell, and is not counted."""
    from .models.subscriptions import CheckoutSession, Subscription

    if not limits.max_event_lag:
        return None
    since = now - timedelta(seconds=limits.max_event_lag)
    paid = Subscription.objects.filter(
        customer=OuterRef("customer"),
        product=OuterRef("product"),
        created_at__gte=OuterRef("created_at"),
    )
    returned = CheckoutSession.objects.filter(Exists(paid), returned_at__lte=since)
    if last is not None:
        returned = returned.filter(returned_at__gt=last)
    found = returned.aggregate(n=Count("pk"), first=Min("returned_at"))
    return (found["n"], found["first"]) if found["n"] else None


def _unrecognised(now: datetime) -> Fact:
    """A warning when events of types the app does not understand came in the last day."""
    from .models.events import EventState, WebhookEvent

    since = now - timedelta(seconds=UNRECOGNISED_WINDOW)
    rows = (
        WebhookEvent.objects.filter(state=EventState.UNRECOGNISED, received_at__gte=since)
        .values("raw_type")
        .annotate(n=Count("pk"))
        .order_by("-n", "raw_type")
    )
    counts = {row["raw_type"] or "?": row["n"] for row in rows}
    total = sum(counts.values())
    data = {"count": total, "types": counts}
    if not total:
        return Fact("events_unrecognised", OK, _("unrecognised events: none in the last day"), data)
    text = _(
        "unrecognised events: %(count)d in the last day (%(types)s): map each type with "
        "BILLING['EVENT_TYPE_ALIASES'] or a handler, then replay them (admin: Event deliveries, "
        "'Unrecognised events')"
    )
    types = ", ".join(f"{name} {n}" for name, n in list(counts.items())[:10])
    return Fact("events_unrecognised", WARNING, text % {"count": total, "types": types}, data)


def _notices(now: datetime) -> Fact:
    """A warning when notice emails of the last day failed, are stuck ``sending`` or are still
    ``queued`` (a kind that is on) long after they were recorded: customers not told."""
    from .models.notices import Notice, NoticeState

    notices = billing_settings.NOTICES
    on = [k for k, v in notices.items() if v is True] if isinstance(notices, dict) else []
    recent = Notice.objects.filter(created_at__gte=now - timedelta(seconds=NOTICES_WINDOW))
    stuck = now - timedelta(seconds=NOTICE_STUCK_AFTER)
    waiting = now - timedelta(seconds=NOTICE_QUEUED_AFTER)
    data = recent.aggregate(  # one read of the day's notices
        failed=Count("pk", filter=Q(state=NoticeState.FAILED)),
        stuck=Count("pk", filter=Q(state=NoticeState.SENDING, created_at__lt=stuck)),
        queued=Count("pk", filter=Q(state=NoticeState.QUEUED, kind__in=on, created_at__lt=waiting)),
    )
    if not any(data.values()):
        return Fact("notices", OK, _("notices: none failed or stuck in the last day"), data)
    text = _(
        "notices: in the last day %(failed)d failed, %(stuck)d stuck sending (a worker died "
        "while sending: not sent again), %(queued)d still queued (is sweep_notices scheduled?) "
        "(admin: Notices, by state; the error says why)"
    )
    return Fact("notices", WARNING, text % data, data)


def _refused(now: datetime) -> Fact:
    """A failure when signature, timestamp or size refusals came after the last accepted delivery
    (in the last hour or before it: a service that gave up sends nothing more)."""
    refused = refused_deliveries(now.timestamp())
    total = sum(r["count"] for r in refused.values())
    reasons = [r for r in REFUSAL_REASONS if refused[r]["count"]]
    serious = [r for r in REFUSAL_REASONS if r != "missing_headers" and refused[r]["last"]]
    accepted = _last_received() if serious or total else None
    unanswered = [
        r for r in serious if accepted is None or accepted.timestamp() < refused[r]["last"]
    ]
    if not total and not unanswered:
        cache = shared_cache()
        if isinstance(cache, PROCESS_LOCAL_BACKENDS):  # the web server's count is not here
            text = _(
                "refused deliveries: none counted by this process; BILLING['CACHE'] "
                "(%(backend)s) is not shared between processes, so the web server's refusals "
                "(a wrong BILLING['WEBHOOK_SECRET'] refuses every delivery) are not seen: use a "
                "shared cache (Redis, Memcached, the database cache)"
            )
            values = {"backend": type(cache).__name__}
            return Fact("refused", WARNING, text % values, {"count": 0, "shared_cache": False})
        return Fact("refused", OK, _("refused deliveries: none in the last hour"), {"count": 0})
    labels = {
        "bad_signature": _("bad signature"),
        "stale_timestamp": _("stale timestamp"),
        "missing_headers": _("missing signature headers"),
        "too_large": _("body too large"),
        "redirected": _("redirected into a GET"),
    }
    hints = {
        "bad_signature": _(
            "check that BILLING['WEBHOOK_SECRET'] is the signing secret registered for this "
            "callback on the service (or BILLING['WEBHOOK_BASIC_AUTH'] its credentials)"
        ),
        "stale_timestamp": _(
            "check this server's clock (NTP) against the service's (5 minutes of skew are accepted)"
        ),
        "missing_headers": _(
            "check that the service signs its deliveries to this callback (a request without "
            "them may also be a scanner)"
        ),
        "too_large": _(
            "raise DATA_UPLOAD_MAX_MEMORY_SIZE above the size of the service's deliveries (a "
            "body over it is not read, nor stored)"
        ),
        "redirected": _(
            "register the callback URL with the service exactly as this site serves it "
            "(%(path)s: its trailing slash, https): a redirect turns the service's POST into a "
            "GET without its body"
        )
        % {"path": webhook_path()},
    }
    shown = [r for r in REFUSAL_REASONS if r in reasons or r in unanswered]
    last_at = max(refused[r]["last"] or 0.0 for r in shown)
    data: dict[str, Any] = {
        "count": total,
        "reasons": {r: refused[r]["count"] for r in reasons},
        "last_refused": datetime.fromtimestamp(last_at, tz=UTC) if last_at else None,
        "last_accepted": accepted,
    }
    values = {
        "count": total,
        "reasons": ", ".join(f"{labels[r]} {refused[r]['count']}" for r in reasons),
        "age": duration(max(0.0, now.timestamp() - last_at)) if last_at else "?",
        "hints": "; ".join(hints[r] for r in shown),
    }
    if unanswered and not total:
        text = _(
            "refused deliveries: none in the last hour, but the last (%(reasons)s) was "
            "%(age)s ago, none accepted since: %(hints)s"
        )
        values["reasons"] = ", ".join(str(labels[r]) for r in unanswered)
        return Fact("refused", FAIL, text % values, data)
    if unanswered:
        text = _(
            "refused deliveries: %(count)d in the last hour (%(reasons)s), the last "
            "%(age)s ago, none accepted since: %(hints)s"
        )
        return Fact("refused", FAIL, text % values, data)
    text = _(
        "refused deliveries: %(count)d in the last hour (%(reasons)s), the last %(age)s "
        "ago: %(hints)s"
    )
    return Fact("refused", WARNING, text % values, data)


def webhook_path() -> str:
    """The path the event callback is served at (``billing_integration:webhook``), or, when
    that name does not reverse (the view routed under a name of the host's, or not at all:
    W024), words for it."""
    from django.urls import reverse

    try:
        return reverse("billing_integration:webhook")
    except Exception:  # NoReverseMatch, or a URLconf that does not load: the facts still show
        return _("the path your URLconf routes the webhook view at")


def _pull(limits: Thresholds, now: datetime) -> Fact:
    runs = last_runs()
    pulls = {r: runs.get(f"pull:{r}") for r in PULLED_RESOURCES}
    data = {"last_pulls": pulls}
    ages = {r: _age(now, at) for r, at in pulls.items() if at is not None}
    each = ", ".join(f"{r} {duration(ages[r])} ago" if r in ages else f"{r} never" for r in pulls)
    if limits.max_pull_age and any(age > limits.max_pull_age for age in ages.values()):
        text = _("pull: the last successful pull is older than %(limit)s (%(each)s)")
        values = {"limit": duration(limits.max_pull_age), "each": each}
        return Fact("pull", FAIL, text % values, data)
    if len(ages) < len(pulls):
        text = _("pull: no successful pull recorded yet for some resources (%(each)s)")
        return Fact("pull", WARNING, text % {"each": each}, data)
    return Fact("pull", OK, _("pull: last successful pulls: %(each)s") % {"each": each}, data)


def _guesses() -> Fact:
    """The guesses of ``BILLING['GUESSES']`` the service refused (switched off, in a row)."""
    from .models.changes import ChangeRequest, ChangeState, SwitchedOffGuess

    off = list(SwitchedOffGuess.objects.order_by("name"))
    pending = ChangeRequest.objects.filter(state=ChangeState.PENDING).count()
    data = {"switched_off": {g.name: g.status for g in off}, "pending_requests": pending}
    if not off:
        text = _("guesses: none switched off; %(count)d change requests pending")
        return Fact("guesses", OK, text % {"count": pending}, data)
    each = ", ".join(f"{g.name} (HTTP {g.status} on {g.operation})" for g in off)
    text = _(
        "guesses: switched off: %(each)s; requests go to staff (%(count)d pending). Delete the "
        "row in the admin (Switched-off guesses) once the service accepts it"
    )
    return Fact("guesses", WARNING, text % {"each": each, "count": pending}, data)


def _plans() -> Fact:
    """A failure when a customer has two plans of one group renewing (charged twice)."""
    from .models.subscriptions import Subscription

    doubled = (
        Subscription.objects.active()
        .filter(auto_renew=True, customer__isnull=False, product__add_on=False)
        .filter(product__product_type="subscription")
        .values("customer", "product__plan_group")
        .annotate(n=Count("pk"))
        .filter(n__gt=1)
    )
    customers = sorted({row["customer"] for row in doubled})
    data = {"customers": customers}
    if not customers:
        return Fact("plans", OK, _("plans: no customer has two plans renewing"), data)
    text = _(
        "plans: %(count)d customer(s) with two plans of one group renewing: stop the older "
        "one's renewal on the service (staff were emailed)"
    )
    return Fact("plans", FAIL, text % {"count": len(customers)}, data)


def _age(now: datetime, then: datetime) -> float:
    return max(0.0, (now - then).total_seconds())


def duration(seconds: float) -> str:
    """``42 s``, ``12 min``, ``3.5 h``, ``2.0 d``."""
    if seconds < 120:
        whole = seconds >= 10 or seconds == int(seconds)
        return f"{seconds:.0f} s" if whole else f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _error(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) < 300 else text[:297] + "..."


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value
