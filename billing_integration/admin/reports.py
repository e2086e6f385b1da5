"""Admin: the reporting dashboard."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.text import slugify
from django.utils.translation import gettext

from .. import currencies
from ..models import Product, Report
from ..reporting.charts import bar_chart, line_chart
from ..reporting.csv import TABLES, table_csv
from ..reporting.report import Period, Table, build_report, display
from ..reporting.report import Report as ReportData
from .mirror import ModelAdmin, PageAdmin

MAX_MONTHS = 36


def report_time() -> datetime:
    """The instant reports end at (a function, so tests can pin it)."""
    return timezone.now()


def parse_filters(params: Any) -> Period:
    """A ``Period`` from GET parameters; bad values fall back to the defaults."""
    try:
        months = min(max(int(params.get("months") or 12), 1), MAX_MONTHS)
    except ValueError:
        months = 12
    try:
        pk = int(params.get("product") or 0)
    except ValueError:
        pk = 0
    # (a primary key past the database's integers is no product: the lookup matches none)
    product = Product.objects.filter(pk=pk).values_list("pk", flat=True).first() if pk else None
    currency = (params.get("currency") or "").strip().upper()[:8]
    if not currency.isprintable():  # a NUL, which PostgreSQL refuses in a query
        currency = ""
    return Period(months=months, product=product, currency=currency or None, now=report_time())


def table_context(table: Table) -> dict[str, Any]:
    return {
        "name": table.name,
        "title": table.title,
        "columns": table.columns,
        "rows": [
            [(display(row.get(c.key), c.kind, row.get("currency")), c.kind) for c in table.columns]
            for row in table.rows
        ],
    }


def charts(report: ReportData) -> list[dict[str, Any]]:
    """Per currency: MRR, new (and reactivated) vs cancellations, churn rate, payments
    completed vs failed."""
    out = []
    months = report.months
    for currency in report.currencies:
        names = {"currency": currency}

        def series(key: str, currency: str = currency) -> list[Any]:
            return [v for _, v in report.series(currency, key)]

        churn = [(v or 0) * 100 for v in series("churn_rate")]
        svgs = [
            line_chart(
                gettext("MRR (%(currency)s)") % names, months, {gettext("MRR"): series("mrr")}
            ),
            bar_chart(
                gettext("New subscriptions and cancellations (%(currency)s)") % names,
                months,
                {
                    gettext("new"): series("new"),
                    gettext("reactivated"): series("reactivated"),
                    gettext("cancellations"): series("cancellations"),
                },
            ),
            line_chart(
                gettext("Churn rate (%(currency)s)") % names,
                months,
                {gettext("churn %"): churn},
                unit="%",
            ),
            bar_chart(
                gettext("Payments (%(currency)s)") % names,
                months,
                {
                    gettext("completed"): series("payments_completed"),
                    gettext("failed"): series("payments_failed"),
                },
            ),
            bar_chart(
                gettext("Failed and refunded amounts (%(currency)s)") % names,
                months,
                {
                    gettext("failed"): series("failed_amount"),
                    gettext("refunded"): series("refunded_amount"),
                },
            ),
        ]
        out.append({"currency": currency, "totals": report.totals(currency), "svgs": svgs})
    return out


@admin.register(Report)
class ReportAdmin(PageAdmin, ModelAdmin):
    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        period = parse_filters(request.GET)
        export = request.GET.get("export")
        if export:
            if export not in TABLES:
                return HttpResponse(
                    gettext("Unknown table; choose from %(tables)s.")
                    % {"tables": ", ".join(TABLES)},
                    status=400,
                    content_type="text/plain",
                )
            # Every row of the exported table; the other tables keep the page's limits.
            limits = {"customers": "customer_limit", "at_risk": "at_risk_limit"}
            unlimited: dict[str, Any] = {limits[export]: None} if export in limits else {}
            report = build_report(period, **unlimited)
            response = HttpResponse(table_csv(report, export), content_type="text/csv")
            stamp = timezone.localtime(period.now).strftime("%Y%m%d")
            parts = [export, f"{period.months}m", slugify(period.currency or ""), period.product]
            filename = "-".join(str(part) for part in ["billing", *parts, stamp] if part)
            response["Content-Disposition"] = f'attachment; filename="{filename}.csv"'
            return response

        report = build_report(period)
        query = request.GET.copy()
        query.pop("export", None)
        context = {
            "title": gettext("Billing reports"),
            "period": period,
            "report": report,
            "charts": charts(report),
            "tables": [table_context(t) for t in report.tables().values()],
            "at_risk_total": report.at_risk_total,
            "at_risk_at": report.at_risk_at,
            "rollups": report.rollups,
            "products": list(Product.objects.order_by("name").values_list("pk", "name")),
            "currencies": sorted(set(currencies.known().values()) | set(report.currencies)),
            "month_choices": (1, 3, 6, 12, 24, 36),
            "query": query.urlencode(),
            **(extra_context or {}),
        }
        return self.page(request, "admin/billing_integration/report/dashboard.html", **context)
