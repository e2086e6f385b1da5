"""The billing page in French (issue 16): labels from the app's French catalogue, money and
dates formatted for the active language (the example project's LocaleMiddleware picks it from
the request)."""

from __future__ import annotations

import uuid

import pytest
from django.utils import timezone, translation
from django.utils.formats import date_format

from billing_integration.checkout.services import ServiceUnavailable
from billing_integration.models import Product, Subscription
from tests.conftest import mark_pushed

from .conftest import invoice, payment, refund, subscription
from .test_account import URL, section, text

pytestmark = pytest.mark.django_db


def test_the_billing_page_in_french(client, demo, seeded) -> None:
    starter, pro = seeded["Starter"], seeded["Pro"]
    # Pro sold beside Starter (one plan at a time): its failed payment gets "Pay again"
    Product.objects.filter(pk=pro.pk).update(add_on=True)
    active = subscription(demo, starter, cycle="months-1", currency="XOF")
    lapsed = subscription(demo, pro, lapsed=True, cycle="years-1", currency="USD")
    # no longer renewing: "Pay again" is offered
    Subscription.objects.filter(pk=lapsed.pk).update(auto_renew=False)
    paid = payment(active, "completed", "5000.0000", "XOF", minutes_ago=5)
    payment(lapsed, "failed", "250", "USD", reason="insufficient_funds")
    invoice(active, "5000", "XOF")
    refund(paid, "1000")
    client.force_login(demo)
    answer = client.get(URL, headers={"accept-language": "fr"})
    assert answer.status_code == 200
    assert answer["Content-Language"] == "fr"
    html = answer.content.decode()

    subs = text(section(html, "billing-subscriptions"))
    # Babel's French money: a narrow no-break space between thousands, the code after.
    assert "Starter Actif 5 000 XOF Mensuel" in subs
    assert "Pro Échu 250,00 USD Annuel Choisir une formule" in subs
    next_billing = date_format(timezone.localtime(active.next_billing_date), "DATE_FORMAT")
    assert next_billing in subs and any(
        month in next_billing
        for month in (
            "janvier",
            "février",
            "mars",
            "avril",
            "mai",
            "juin",
            "juillet",
            "août",
            "septembre",
            "octobre",
            "novembre",
            "décembre",
        )
    )
    pays = text(section(html, "billing-payments"))
    assert "Fonds insuffisants Payer à nouveau" in pays
    assert "Formule Statut Prix Cycle de facturation Prochaine date de facturation" in subs
    assert "Pay again" not in html and "Monthly" not in html and "Active" not in subs


def test_the_same_page_in_english_by_default(client, demo, seeded) -> None:
    subscription(demo, seeded["Starter"], cycle="months-1", currency="XOF")
    client.force_login(demo)
    html = client.get(URL).content.decode()
    assert "Starter Active XOF 5,000 Monthly" in text(section(html, "billing-subscriptions"))


def test_checkout_errors_in_french(client, demo, seeded) -> None:
    """The service's error messages follow the request's language, placeholders filled."""
    client.force_login(demo)
    french = {"accept-language": "fr"}
    missing = client.post("/billing/checkout/", {"product": "no-such-product"}, headers=french)
    assert missing.status_code == 404
    assert "Ce produit n\u2019existe pas." in missing.content.decode()
    pro = seeded["Pro"]
    Product.objects.filter(pk=pro.pk).update(remote_id=uuid.uuid4())
    wrong = client.post(
        "/billing/checkout/", {"product": pro.pk, "cycle": "weeks-2"}, headers=french
    )
    assert wrong.status_code == 400
    assert (
        "Le cycle de facturation &#x27;weeks-2&#x27; n\u2019est pas proposé pour ce produit."
        in wrong.content.decode()
    )
    with translation.override("fr"):
        assert str(ServiceUnavailable().message).startswith(
            "Le service de paiement est momentanément indisponible."
        )


def test_the_example_sites_pages_in_french(client, demo, seeded) -> None:
    """The example project's language switch and its own strings (example_project/locale)."""
    client.force_login(demo)
    mark_pushed(*seeded.values())  # pushed: "S'abonner" buttons, not "Not available"
    html = client.get("/pricing/", headers={"accept-language": "fr"}).content.decode()
    assert '<html lang="fr">' in html and "<h1>Tarifs</h1>" in html
    assert 'action="/i18n/setlang/"' in html and '<option value="fr" selected>' in html
    assert "S\u2019abonner" in html and "Mensuel" in html and "5\u202f000\u00a0XOF" in html
    # the switch: set_language stores the choice, the next page follows it
    answer = client.post("/i18n/setlang/", {"language": "fr", "next": "/billing/account/"})
    assert answer.status_code == 302 and answer["Location"] == "/billing/account/"
    assert "Pas encore d\u2019abonnement." in client.get("/billing/account/").content.decode()


def test_the_example_projects_home_page_in_french(client, demo, seeded) -> None:
    """Its own text, title and cards, not only the navigation of base.html."""
    answer = client.get("/", headers={"accept-language": "fr"})
    assert answer.status_code == 200 and answer["Content-Language"] == "fr"
    html = answer.content.decode()
    page = text(html)
    assert "<title>Accueil · démo de facturation</title>" in html
    assert "Un petit SaaS qui montre billing_integration" in page
    assert "1. Choisissez une formule" in page and "La page des tarifs liste chaque produit" in page
    assert "0700000002 est refusé" in page and "s\u2019ouvre avec un abonnement actif" in page
    for english in ("A tiny SaaS", "Pick a plan", "Pay in the sandbox", "Test numbers", "opens"):
        assert english not in page, english
    subscription(demo, seeded["Starter"], cycle="months-1", currency="XOF")
    client.force_login(demo)
    member = text(client.get("/", headers={"accept-language": "fr"}).content.decode())
    assert "abonné Aller à l\u2019espace membres" in member and "Go to the members" not in member
