"""Stored subscription statuses normalised as the mapping now does (stripped, lower-cased), so
a row stored before the allow-list, say ``"Published "``, keeps the access its status means."""

from django.db import migrations
from django.db.models import F
from django.db.models.functions import Lower, Trim


def normalise(apps, schema_editor):
    Subscription = apps.get_model("billing_integration", "Subscription")
    (
        Subscription.objects.using(schema_editor.connection.alias)
        .annotate(normalised=Lower(Trim("status")))
        .exclude(status=F("normalised"))
        .update(status=Lower(Trim("status")))
    )


class Migration(migrations.Migration):
    dependencies = [
        ("billing_integration", "0007_service_binding"),
    ]

    operations = [migrations.RunPython(normalise, migrations.RunPython.noop)]
