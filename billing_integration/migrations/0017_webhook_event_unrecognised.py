"""Events without a handler (or whose data lacks what one needs) are ``unrecognised`` (was
``ignored``): kept until mapped, shown in the admin, replayed after an alias."""

from typing import Any

from django.db import migrations, models


def ignored_to_unrecognised(apps: Any, schema_editor: Any) -> None:
    events = apps.get_model("billing_integration", "WebhookEvent")
    events.objects.filter(state="ignored").update(state="unrecognised")


def unrecognised_to_ignored(apps: Any, schema_editor: Any) -> None:
    events = apps.get_model("billing_integration", "WebhookEvent")
    events.objects.filter(state="unrecognised").update(state="ignored")


class Migration(migrations.Migration):
    dependencies = [
        ("billing_integration", "0016_product_multiple_purchases"),
    ]

    operations = [
        migrations.AlterField(
            model_name="webhookevent",
            name="state",
            field=models.CharField(
                choices=[
                    ("received", "Received"),
                    ("processed", "Processed"),
                    ("failed", "Failed"),
                    ("unrecognised", "Unrecognised (kept until mapped)"),
                    ("rejected", "Rejected (malformed body)"),
                ],
                default="received",
                max_length=16,
            ),
        ),
        migrations.RunPython(ignored_to_unrecognised, unrecognised_to_ignored),
    ]
