"""Which billing service the mirror belongs to; ``ensure_service()`` refuses any other."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.db import IntegrityError, router, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext as _

from .conf import billing_settings
from .exceptions import BillingError, BillingServiceMismatchError

logger = logging.getLogger("billing_integration.service")

SHOW_COMMAND = "python manage.py billing_service"
RELINK_COMMAND = "python manage.py billing_service relink"
RESET_COMMAND = "python manage.py billing_service reset"
_COMMANDS = {"relink": RELINK_COMMAND, "reset": RESET_COMMAND, "show": SHOW_COMMAND}
#: The status given to the old service's subscriptions by a reset (grants no access).
DETACHED = "detached"
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class ServiceIdentity:
    """What names a service account: normalised base URL, realm, client id (never a secret)."""

    base_url: str
    realm: str
    client_id: str

    def __str__(self) -> str:
        text = _("%(url)s (realm %(realm)r, client id %(client_id)r)")
        return text % {"url": self.base_url, **self.as_dict()}

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def normalise_url(url: Any) -> str:
    """``scheme://host[:port]/path`` lower-cased scheme and host, the scheme's default port
    dropped, no trailing slash; user info, query and fragment never kept."""
    parts = urlsplit(str(url or "").strip())
    scheme = parts.scheme.lower()
    netloc = parts.netloc.rpartition("@")[2].lower()
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError:  # not a number: keep what was written (the client fails on it anyway)
        port = None
    else:
        if host:
            host = f"[{host}]" if ":" in host else host
            netloc = host if port in (None, _DEFAULT_PORTS.get(scheme)) else f"{host}:{port}"
    return f"{scheme}://{netloc}{parts.path.rstrip('/')}"


def configured_service(client: Any = None) -> ServiceIdentity:
    """The service ``client`` (a ``BillingClient``) talks to, else the one of the settings."""
    try:
        base_url, realm, client_id = client.base_url, client.realm, client.client_id
    except AttributeError:  # no client, or a wrapper that uses the settings
        conf = billing_settings
        base_url, realm, client_id = conf.BASE_URL, conf.REALM, conf.CLIENT_ID
    return ServiceIdentity(normalise_url(base_url), str(realm), str(client_id))


def _binding_model() -> Any:
    from .models.service import ServiceBinding

    return ServiceBinding


def mirror_database(using: str | None = None) -> str:
    """The database alias of the mirror (the binding's router choice) unless ``using``."""
    return using or router.db_for_write(_binding_model())


def recorded_service(using: str | None = None) -> ServiceIdentity | None:
    """The service the mirror in database ``using`` belongs to; None before the first use."""
    fields = ("base_url", "realm", "client_id")
    row = _binding_model().objects.using(mirror_database(using)).values_list(*fields).first()
    return ServiceIdentity(*row) if row is not None else None


def ensure_service(*, client: Any = None, using: str | None = None) -> ServiceIdentity:
    """Record the service called if none is; ``BillingServiceMismatchError`` if another is."""
    configured = configured_service(client)
    alias = mirror_database(using)
    recorded = recorded_service(alias) or _record_first(configured, alias)
    if recorded == configured:
        return configured
    if holds_nothing(alias):  # a service that never answered (a typo): nothing to protect
        with transaction.atomic(using=alias):
            _bind(configured, alias, "unused")
        logger.warning("billing mirror held nothing of %s: now bound to %s", recorded, configured)
        return configured
    message = mismatch_message(recorded, configured)
    raise BillingServiceMismatchError(message, recorded=recorded, configured=configured)


def holds_nothing(using: str | None = None) -> bool:
    """Whether the mirror in ``using`` holds nothing of any service: no row with a remote id,
    no push being sent or in doubt (its answer lost: it may have created the object there)."""
    from django.apps import apps

    from .models import OutboxEntry
    from .models.base import RemoteObject
    from .models.outbox import OutboxState

    alias = mirror_database(using)
    entries = OutboxEntry.objects.using(alias)
    if entries.filter(Q(in_doubt=True) | Q(state=OutboxState.IN_PROGRESS)).exists():
        return False
    return not any(
        model._default_manager.using(alias).filter(remote_id__isnull=False).exists()
        for model in apps.get_app_config("billing_integration").get_models()
        if issubclass(model, RemoteObject)
    )


def mismatch_message(recorded: ServiceIdentity, configured: ServiceIdentity) -> str:
    """What is wrong, and the ways out, when the mirror belongs to another service."""
    return _(
        "The billing mirror in this database belongs to the service at %(recorded)s, but "
        "settings.BILLING points at %(configured)s; nothing was sent. If it is the same "
        "service (a new address, new credentials of the same account), run `%(relink)s`; to "
        "start afresh with the configured service (remote ids cleared, everything pushed to "
        "it again), run `%(reset)s`. `%(show)s` shows both."
    ) % {"recorded": recorded, "configured": configured, **_COMMANDS}


def _record_first(configured: ServiceIdentity, alias: str) -> ServiceIdentity:
    rows = _binding_model().objects.using(alias)
    for _attempt in range(3):
        try:
            with transaction.atomic(using=alias):
                rows.create(**configured.as_dict(), recorded_at=timezone.now())
        except IntegrityError:  # another process recorded one first: that one counts
            if (recorded := recorded_service(alias)) is not None:
                return recorded
            continue  # gone again meanwhile: try once more
        logger.info("billing mirror bound to the service at %s", configured)
        return configured
    raise BillingError("Could not record which billing service the mirror belongs to.")


class MirrorBusyError(BillingError):
    """A reset was asked while a worker holds outbox entries (its lease has not expired)."""


def _bind(configured: ServiceIdentity, alias: str, action: str) -> ServiceIdentity | None:
    """Record ``configured`` (the previous one to ``history``); returns the previous one."""
    model = _binding_model()
    now = timezone.now()
    row = model.objects.using(alias).select_for_update().first()
    if row is None:
        model.objects.using(alias).create(**configured.as_dict(), recorded_at=now)
        return None
    previous = ServiceIdentity(row.base_url, row.realm, row.client_id)
    was = {"recorded_at": row.recorded_at.isoformat(), "until": now.isoformat(), "action": action}
    row.history = [*(row.history or []), {**previous.as_dict(), **was}]
    for key, value in configured.as_dict().items():
        setattr(row, key, value)
    row.recorded_at = now
    row.save()
    return previous


def relink(*, using: str | None = None) -> ServiceIdentity | None:
    """Record the configured service as the mirror's, keeping remote ids; returns the previous."""
    configured = configured_service()
    alias = mirror_database(using)
    with transaction.atomic(using=alias):
        previous = _bind(configured, alias, "relink")
    logger.warning("billing mirror relinked from %s to %s", previous, configured)
    return previous


def products_unknown_at(
    client: Any = None, *, sample: int = 3, using: str | None = None
) -> list[Any]:
    """Of up to ``sample`` pushed products, those the service answers 404 for."""
    from .client import get_client
    from .exceptions import BillingNotFoundError
    from .models.products import Product

    client = client or get_client()
    unknown = []
    products = Product.objects.using(mirror_database(using)).filter(remote_id__isnull=False)
    for product in products.order_by("pk")[:sample]:
        try:
            client.get_product(str(product.remote_id))
        except BillingNotFoundError:
            unknown.append(product)
    return unknown


@dataclass
class ResetCounts:
    products: int = 0  # remote ids cleared, queued for a create at the new service
    customers: int = 0  # likewise
    subscriptions: int = 0  # detached (kept, grant no access, never pushed)
    entries_closed: int = 0  # outbox entries meant for the old service, closed unsent
    entries_created: int = 0  # new create entries for the new service


def reset_mirror(*, using: str | None = None) -> ResetCounts:
    """Start afresh with the configured service (see ``ResetCounts``); may raise MirrorBusyError."""
    from django.contrib.contenttypes.models import ContentType

    from .models import Customer, OutboxEntry, Product, Subscription
    from .models.base import SyncState
    from .models.outbox import LEASE, OutboxOperation, OutboxState

    configured = configured_service()
    alias = mirror_database(using)
    now = timezone.now()
    counts = ResetCounts()
    note = _("Not sent: the mirror was reset for the service at %(service)s on %(when)s.")
    note %= {"service": configured, "when": now.isoformat(timespec="seconds")}
    cleared: dict[str, Any] = dict.fromkeys(("remote_id", "remote_created", "remote_updated"))
    cleared |= dict.fromkeys(("remote_user_created", "remote_user_updated", "remote_data"))
    cleared |= dict.fromkeys(("last_attempt_at", "last_synced_at"))
    cleared |= {"sync_error": "", "updated_at": now, "sync_state": SyncState.PENDING}
    with transaction.atomic(using=alias):
        pushing = OutboxEntry.objects.using(alias).filter(state=OutboxState.IN_PROGRESS)
        # Held by a worker: in progress and the lease not expired.
        if busy := pushing.filter(started_at__gt=timezone.now() - timedelta(seconds=LEASE)).count():
            text = _(
                "%(count)d outbox entries are being pushed by a worker right now; stop the "
                "workers (or wait 5 minutes) and run the reset again."
            )
            raise MirrorBusyError(text % {"count": busy})
        unsent = OutboxEntry.objects.using(alias).exclude(state=OutboxState.DONE)
        done: dict[str, Any] = {"state": OutboxState.DONE, "completed_at": now, "updated_at": now}
        done |= {"last_error": note, "started_at": None, "next_attempt_at": None}
        counts.entries_closed = unsent.update(**done, in_doubt=False)
        subscriptions = Subscription.objects.using(alias).exclude(status=DETACHED)
        subscriptions.filter(remote_id__isnull=True).update(sync_state=SyncState.FAILED)
        detach = {"status": DETACHED, "remote_updated": now, "sync_error": note, "updated_at": now}
        counts.subscriptions = subscriptions.update(**detach)
        entries, create = [], OutboxOperation.CREATE
        for model in (Product, Customer):
            rows = model._default_manager.using(alias)
            pks = list(rows.order_by("pk").values_list("pk", flat=True))
            # a product's cycles: the new service has confirmed none
            rows.update(**cleared, **({"confirmed_cycles": {}} if model is Product else {}))
            ct = ContentType.objects.db_manager(alias).get_for_model(model)
            entries += [OutboxEntry(content_type=ct, object_id=pk, operation=create) for pk in pks]
            setattr(counts, f"{model._meta.model_name}s", len(pks))  # products, customers
        OutboxEntry.objects.using(alias).bulk_create(entries, batch_size=1000)
        counts.entries_created = len(entries)
        previous = _bind(configured, alias, "reset")
    logger.warning("billing mirror reset: was %s, now %s (%s)", previous, configured, counts)
    return counts
