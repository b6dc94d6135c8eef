from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0008_era2025_sessions"),
    ]

    operations = [
        migrations.AddField(
            model_name="dispatch",
            name="context",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
