"""The admin dashboard, CSV export, the terminal command and constant query counts."""

from __future__ import annotations

import csv
import io
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from billing_integration.admin import reports as admin_reports
from billing_integration.models import Customer, Payment, Subscription
from billing_integration.reporting.charts import bar_chart, line_chart
from billing_integration.reporting.report import Period, build_report
from billing_integration.reporting.rollups import refresh

from .conftest import NOW, build_world, dt

pytestmark = pytest.mark.django_db
URL = "admin:billing_integration_report_changelist"


@pytest.fixture
def pinned(monkeypatch):
    monkeypatch.setattr(admin_reports, "report_time", lambda: NOW)


@pytest.fixture
def staff(client, django_user_model):
    user = django_user_model.objects.create_superuser("boss", "boss@example.com", "pw")
    client.force_login(user)
    return client


def test_admin_index_links_to_the_dashboard(staff):
    response = staff.get(reverse("admin:index"))
    assert response.status_code == 200
    assert reverse(URL).encode() in response.content


def test_dashboard_renders_charts_and_numbers(staff, world, pinned):
    response = staff.get(reverse(URL))
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count('class="billing-chart"') == 10  # 5 charts for each of XOF and USD
    assert "MRR (XOF)" in html and "Payments (USD)" in html
    assert '<td class="num">XOF\xa014,500</td>' in html  # XOF MRR in the tables, no minor units
    assert '<strong class="kpi-mrr">XOF\xa014,500</strong>' in html  # ... and beside the charts
    # C3 back in June (S8) after S3 ended in March: one reactivated, in XOF
    assert '<strong class="kpi-reactivated">1</strong>' in html
    assert '<th scope="col">Reactivated</th>' in html
    assert "14500.00" not in html
    assert "25.0%" in html  # XOF churn of 2025-04
    assert 'id="table-at_risk"' in html and "Customers at risk (3)" in html
    for name in ("overview", "monthly", "monthly_by_product", "customers", "at_risk"):
        assert f"export={name}" in html


def test_dashboard_filters(staff, world, pinned):
    response = staff.get(
        reverse(URL), {"currency": "usd", "months": "3", "product": str(world.p1.pk)}
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert html.count('class="billing-chart"') == 5
    assert "MRR (XOF)" not in html and "MRR (USD)" in html
    assert "2025-04" in html and "2025-03" not in html
    # nonsense parameters fall back to the defaults
    response = staff.get(reverse(URL), {"months": "lots", "product": "x"})
    assert response.status_code == 200 and response.content.decode().count('billing-chart"') == 10


@pytest.mark.parametrize(
    "params",
    [
        {"product": "9" * 30},  # past the largest primary key the database reads
        {"currency": "US\x00D"},  # PostgreSQL refuses a NUL in a query
    ],
)
def test_dashboard_filters_out_of_range_fall_back_to_the_defaults(staff, world, pinned, params):
    response = staff.get(reverse(URL), params)
    assert response.status_code == 200 and response.content.decode().count('billing-chart"') == 10


def test_dashboard_needs_the_view_permission(client, django_user_model, world):
    user = django_user_model.objects.create_user("clerk", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get(reverse(URL)).status_code == 403
    client.logout()
    assert client.get(reverse(URL)).status_code == 302  # to the admin login


def test_csv_export(staff, world, pinned):
    response = staff.get(reverse(URL), {"export": "monthly", "currency": "XOF"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [r["month"] for r in rows][:2] == ["2024-07", "2024-08"]
    april = next(r for r in rows if r["month"] == "2025-04")
    assert april["churn_rate"] == "0.2500" and april["mrr"] == "14500.00"
    assert april["refunded_amount"] == "5000.00"

    response = staff.get(reverse(URL), {"export": "at_risk"})
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [r["identifier"] for r in rows] == ["c3", "c4", "c5"]
    assert staff.get(reverse(URL), {"export": "nope"}).status_code == 400


def test_an_export_lifts_the_row_limit_of_its_own_table_only(staff, world, pinned, monkeypatch):
    from billing_integration.reporting import metrics

    asked: list[tuple[str, int | None]] = []
    for name in ("customer_summary", "customers_at_risk"):
        real = getattr(metrics, name)

        def spy(period, *, limit, _real=real, _name=name):
            asked.append((_name, limit))
            return _real(period, limit=limit)

        monkeypatch.setattr(metrics, name, spy)
    staff.get(reverse(URL), {"export": "customers"})
    staff.get(reverse(URL), {"export": "monthly"})
    staff.get(reverse(URL), {"export": "at_risk"})
    assert asked == [
        ("customer_summary", None),
        ("customers_at_risk", 50),  # every customer
        ("customer_summary", 25),
        ("customers_at_risk", 50),  # the page's limits
        ("customer_summary", 25),
        ("customers_at_risk", None),
    ]


def test_csv_neutralises_formulas(world):
    from billing_integration.reporting.csv import table_csv

    Customer.objects.filter(identifier="c5").update(identifier="=HYPERLINK(1)")
    text = table_csv(build_report(Period(now=NOW)), "at_risk")
    assert "'=HYPERLINK(1)" in text


@pytest.mark.parametrize("lead", ["\t", "\r"])
def test_csv_neutralises_formulas_after_a_tab_or_carriage_return(world, lead):
    from billing_integration.reporting.csv import table_csv

    Customer.objects.filter(identifier="c5").update(identifier=lead + "=HYPERLINK(1)")
    text = table_csv(build_report(Period(now=NOW)), "at_risk")
    cells = [cell for row in csv.reader(io.StringIO(text)) for cell in row]
    assert "'" + lead + "=HYPERLINK(1)" in cells


def test_charts_escape_text():
    svg = bar_chart("<b>&", ["2025-01"], {"x<y": [3]})
    assert "<b>" not in svg and "&lt;b&gt;&amp;" in svg and "x&lt;y" in svg
    svg = line_chart("MRR", ["2025-01", "2025-02"], {"MRR": [Decimal("10"), None]})
    assert svg.count("<circle") == 2 and "<polyline" in svg


def test_command_prints_the_tables(world):
    out = io.StringIO()
    call_command("billing_report", "--at", NOW.isoformat(), stdout=out)
    text = out.getvalue()
    assert "Billing report, last 12 months (2024-07 .. 2025-06)" in text
    assert "Customers at risk: 3" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("All products") and "XOF" in ln)
    assert "14,500.00" in line  # MRR
    assert line.split()[3:5] == ["4", "1"]  # active, in trial


def test_command_filters_and_csv(world):
    out = io.StringIO()
    call_command(
        "billing_report",
        "--at",
        NOW.isoformat(),
        "--product",
        "Team",
        "--currency",
        "USD",
        "--csv",
        "overview",
        stdout=out,
    )
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert {(r["product"], r["currency"]) for r in rows} == {
        ("Team", "USD"),
        ("All products", "USD"),
    }
    assert rows[0]["failed_amount"] == "30.00"
    with pytest.raises(CommandError):
        call_command("billing_report", "--product", "Nope")
    with pytest.raises(CommandError):  # a name, not a pk: "²".isdigit() but int() refuses it
        call_command("billing_report", "--product", "²")
    with pytest.raises(CommandError):
        call_command("billing_report", "--months", "0")


@pytest.mark.parametrize(
    "args",
    [
        ["--customers", "-5"],  # a negative slice of a queryset
        ["--at", "2025-13-01T00:00:00"],  # well formed, not a date
        ["--at", "2025-02-30T10:00:00"],
        ["--product", "9" * 5000],  # past Python's 4,300 digits
    ],
)
def test_command_refuses_bad_values_with_a_clear_error(db, args):
    with pytest.raises(CommandError):
        call_command("billing_report", *args, stdout=io.StringIO())


def add_bulk(n_subs: int, n_payments: int) -> None:
    """More of the same data: subscriptions on both products, payments of every state."""
    world_customer = Customer.objects.create(identifier=f"bulk-{uuid.uuid4()}")
    template = list(Subscription.objects.all())
    subs = []
    for i in range(n_subs):
        s = template[i % len(template)]
        subs.append(
            Subscription(
                product_id=s.product_id,
                customer=world_customer,
                remote_id=uuid.uuid4(),
                selected_billing_cycle=s.selected_billing_cycle,
                selected_currency=s.selected_currency,
                status=s.status,
                remote_created=dt(2024, 1 + i % 12, 1 + i % 27),
                remote_updated=s.remote_updated,
                cycle_end_date=s.cycle_end_date,
                trial_end_date=s.trial_end_date,
                last_payment_status=s.last_payment_status,
            )
        )
    subs = Subscription.objects.bulk_create(subs)
    Payment.objects.bulk_create(
        Payment(
            remote_id=uuid.uuid4(),
            status=("completed", "failed", "canceled")[i % 3],
            amount=Decimal(100 + i),
            currency=("XOF", "USD")[i % 2],
            customer=world_customer,
            product_id=subs[i % len(subs)].product_id,
            subscription=subs[i % len(subs)],
            remote_created=NOW - timedelta(days=i % 400),
        )
        for i in range(n_payments)
    )


def test_the_number_of_queries_does_not_grow_with_the_data():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def counts() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as full:
            report = build_report(Period(now=NOW))
        assert report.overview
        with CaptureQueriesContext(connection) as filtered:
            build_report(Period(now=NOW, currency="XOF", months=24))
        return len(full), len(filtered)

    build_world()
    small = counts()
    add_bulk(300, 900)
    assert counts() == small


@pytest.mark.parametrize("refreshed", [False, True])
@pytest.mark.parametrize("extra", [0, 300])
def test_dashboard_query_count(staff, pinned, extra, refreshed, django_assert_max_num_queries):
    build_world()
    if extra:
        add_bulk(extra, extra * 3)
    if refreshed:
        refresh(NOW)
    # the report: 12 queries from the mirror, 15 with the rollups (docs/reporting.md); + the
    # product list of the filter + session and user
    with django_assert_max_num_queries(18 if refreshed else 15):
        response = staff.get(reverse(URL))
    assert response.status_code == 200
    assert response.context["rollups"]["used"] is refreshed
    assert ("last verified" in response.content.decode()) is refreshed
    # the current month as of the refresh, and what is dated after it
    assert ("the current month as of" in response.content.decode()) is refreshed


def test_the_customers_at_risk_are_those_of_the_last_refresh(staff, pinned):
    """The page, its other exports and ``billing_report`` read the customers at risk from the
    rollups and say as of when; a change waits for the next refresh. The ``at_risk`` export
    (every customer) and a report of an instant before the refresh read the mirror."""
    from billing_integration.models import Invoice

    world = build_world()
    refresh(NOW - timedelta(hours=1))
    Invoice.objects.create(  # c1 is at risk from now on
        remote_id=uuid.uuid4(),
        status="open",
        amount=Decimal(5000),
        currency="XOF",
        customer=world.customers["c1"],
        product=world.p1,
    )
    response = staff.get(reverse(URL))
    html = response.content.decode()
    assert response.context["at_risk_at"] == NOW - timedelta(hours=1)
    assert "Customers at risk (3)" in html
    assert "As of 2025-06-15 11:00, the last refresh of the rollups." in html
    assert [r["identifier"] for r in response.context["report"].at_risk] == ["c3", "c4", "c5"]
    rows = list(csv.DictReader(io.StringIO(staff.get(reverse(URL), {"export": "at_risk"}).text)))
    assert [r["identifier"] for r in rows] == ["c1", "c3", "c4", "c5"]  # from the mirror
    out = io.StringIO()
    call_command("billing_report", "--at", NOW.isoformat(), stdout=out)
    assert "Customers at risk: 3 (as of 2025-06-15 11:00, the last refresh)" in out.getvalue()
    out = io.StringIO()
    call_command("billing_report", "--at", (NOW - timedelta(hours=2)).isoformat(), stdout=out)
    assert "Customers at risk: 4\n" in out.getvalue()  # before the refresh: from the mirror
    earlier = build_report(Period(now=NOW - timedelta(hours=2)))
    assert earlier.at_risk_at is None and earlier.at_risk_total == 4

    refresh(NOW)
    response = staff.get(reverse(URL), {"product": str(world.p1.pk), "currency": "xof"})
    html = response.content.decode()
    assert "Customers at risk (1)" in html and "As of 2025-06-15 12:00" in html
    assert [r["reasons"] for r in response.context["report"].at_risk] == ["unpaid invoice"]


def test_the_reactivated_label_is_translated():
    from django.utils import translation

    with translation.override("fr"):
        assert (translation.gettext("Reactivated"), translation.gettext("reactivated")) == (
            "Réactivés",
            "réactivés",
        )


def test_command_prints_no_escape_sequence_from_a_name(world):
    """A name a customer chose cannot drive the terminal of whoever runs ``billing_report``."""
    Customer.objects.update(first_name="\x1b]0;owned\x07Eve\x1b[2J", last_name="\u202eevil")
    out = io.StringIO()
    call_command("billing_report", "--at", NOW.isoformat(), stdout=out)
    text = out.getvalue()
    assert "?]0;owned?Eve?[2J ?evil" in text  # the at-risk table's names
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
