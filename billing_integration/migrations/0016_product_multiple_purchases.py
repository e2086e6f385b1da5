from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing_integration", "0015_product_plan_groups"),
    ]

    operations = [
        migrations.AddField(
            model_name="product",
            name="multiple_purchases",
            field=models.BooleanField(
                default=False,
                help_text="May be bought again while held. Kept here only.",
                verbose_name="multiple purchases",
            ),
        ),
    ]
