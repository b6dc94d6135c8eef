from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0006_event_kinds"),
    ]

    operations = [
        migrations.AddField(
            model_name="dispatch",
            name="context",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
