"""``manage.py billing_service [show | relink | reset]``: show or change the mirror's service."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from django.utils.translation import gettext as _

from ... import service
from ...exceptions import BillingError
from ...outbox.tasks import enqueue_open

Options = dict[str, Any]


class Command(BaseCommand):
    help = "Show or change which billing service the local mirror belongs to."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = ("show", "relink", "reset")
        what = "show (default), relink (keep remote ids) or reset (clear them)"
        parser.add_argument("action", nargs="?", default="show", choices=actions, help=what)
        yes = ("--yes", "--noinput", "--no-input")
        no = "do not ask for confirmation"
        parser.add_argument(*yes, action="store_false", dest="interactive", help=no)
        force = "relink even if the configured service does not know the mirror's products"
        parser.add_argument("--force", action="store_true", help=force)
        parser.add_argument("--database", default=None, help="the database of the mirror")

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"]
        if using is not None and using not in connections:
            raise CommandError(f"No database {using!r} in DATABASES.")
        try:
            configured = service.configured_service()
        except BillingError as exc:
            raise CommandError(str(exc)) from exc
        recorded = service.recorded_service(using)
        getattr(self, f"do_{options['action']}")(recorded, configured, using, options)

    def do_show(self, recorded: Any, configured: Any, using: Any, options: Options) -> None:
        from ...models import Customer, OutboxEntry, Product, ServiceBinding

        alias = service.mirror_database(using)
        binding = ServiceBinding.objects.using(alias).first()
        if binding is None:
            self.stdout.write(_("recorded service:   none yet"))
        else:
            since = binding.recorded_at.isoformat(timespec="seconds")
            text = _("recorded service:   %(service)s, since %(when)s")
            self.stdout.write(text % {"service": recorded, "when": since})
        self.stdout.write(_("configured service: %(service)s") % {"service": configured})
        if recorded is None:
            self.stdout.write(_("The first push, pull or checkout records the configured service."))
        elif recorded == configured:
            self.stdout.write(self.style.SUCCESS(_("They match.")))
        else:
            text = _(
                "MISMATCH: pushes, pulls and checkouts are refused until `%(relink)s` "
                "(same service, remote ids kept) or `%(reset)s` (start afresh with the "
                "configured service)."
            )
            commands = {"relink": service.RELINK_COMMAND, "reset": service.RESET_COMMAND}
            self.stdout.write(self.style.ERROR(text % commands))
        text = _(
            "mirror: %(products)d products and %(customers)d customers with remote ids; "
            "%(pending)d outbox entries pending, %(failed)d failed (billing_sync "
            "--retry-failed once the cause is fixed; their errors are in the admin)"
        )
        pushed = {"remote_id__isnull": False}
        entries = OutboxEntry.objects.using(alias)
        values = {
            "products": Product.objects.using(alias).filter(**pushed).count(),
            "customers": Customer.objects.using(alias).filter(**pushed).count(),
            "pending": entries.pending().count(),
            "failed": entries.failed().count(),
        }
        self.stdout.write(text % values)
        text = _(
            "before: %(url)s (realm %(realm)r, client id %(client_id)r) until %(until)s "
            "(%(action)s)"
        )
        keys = ("realm", "client_id", "until", "action")
        for old in binding.history if binding is not None else []:
            self.stdout.write(text % {"url": old.get("base_url"), **{k: old.get(k) for k in keys}})

    def do_relink(self, recorded: Any, configured: Any, using: Any, options: Options) -> None:
        if recorded == configured:
            text = _("The mirror already belongs to %(service)s; nothing to do.")
            self.stdout.write(text % {"service": configured})
            return
        if recorded is not None and not options["force"]:
            try:
                unknown = service.products_unknown_at(using=using)
            except BillingError as exc:
                text = _(
                    "Could not ask %(service)s about the mirror's products: %(error)s. "
                    "Use --force to relink without that check."
                )
                raise CommandError(text % {"service": configured, "error": exc}) from exc
            if unknown:
                names = ", ".join(f"{p.name!r} ({p.remote_id})" for p in unknown)
                text = _(
                    "%(service)s does not know the mirror's products %(names)s: it looks "
                    "like another service, where the mirror's remote ids do not exist. Run "
                    "`%(reset)s` to start afresh with it, or relink with --force if you are "
                    "sure."
                )
                values = {"service": configured, "names": names, "reset": service.RESET_COMMAND}
                raise CommandError(text % values)
        self.confirm(
            options,
            _("Relink the mirror from %(recorded)s to %(configured)s, keeping every remote id?")
            % {"recorded": recorded or _("nothing"), "configured": configured},
        )
        service.relink(using=using)
        enqueue_open(service.mirror_database(using))
        text = _("The mirror now belongs to %(service)s. Pending outbox entries are pushed to it.")
        self.stdout.write(self.style.SUCCESS(text % {"service": configured}))

    def do_reset(self, recorded: Any, configured: Any, using: Any, options: Options) -> None:
        from ...models import Customer, OutboxEntry, Product, Subscription
        from ...models.outbox import OutboxState

        alias = service.mirror_database(using)
        question = _(
            "Reset the mirror for %(configured)s (now: %(recorded)s)? The remote ids of "
            "%(products)d products and %(customers)d customers are cleared and they are "
            "pushed to it anew; %(subscriptions)d subscriptions of the old service are "
            "detached (kept, no access, never pushed); %(entries)d outbox entries not sent "
            "yet are closed unsent. Checkout sessions, invoices, payments, refunds and the "
            "event log are kept."
        )
        subscriptions = Subscription.objects.using(alias).exclude(status=service.DETACHED)
        values = {
            "configured": configured,
            "recorded": recorded or _("nothing recorded"),
            "products": Product.objects.using(alias).count(),
            "customers": Customer.objects.using(alias).count(),
            "subscriptions": subscriptions.count(),
            "entries": OutboxEntry.objects.using(alias).exclude(state=OutboxState.DONE).count(),
        }
        self.confirm(options, question % values)
        try:
            counts = service.reset_mirror(using=using)
        except service.MirrorBusyError as exc:
            raise CommandError(str(exc)) from exc
        enqueue_open(service.mirror_database(using))
        text = _(
            "The mirror now belongs to %(service)s: %(products)d products and "
            "%(customers)d customers queued for a create there; %(subscriptions)d "
            "subscriptions detached; %(closed)d outbox entries closed unsent."
        )
        values = {"service": configured, "closed": counts.entries_closed, **asdict(counts)}
        self.stdout.write(self.style.SUCCESS(text % values))

    def confirm(self, options: Options, question: str) -> None:
        self.stdout.write(question)
        if not options["interactive"]:
            return
        try:
            answer = input(_("Type 'yes' to continue: "))
        except EOFError:  # no one to ask (a script without --yes): no answer is no
            answer = ""
        if answer.strip().lower() != "yes":
            raise CommandError(_("Cancelled; nothing changed."))
