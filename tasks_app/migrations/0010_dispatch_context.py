from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0009_task_client_active"),
    ]

    operations = [
        migrations.AddField(
            model_name="dispatch",
            name="context",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
