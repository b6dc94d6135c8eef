from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0014_waiting_by_tenant_only"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="client_answers",
            field=models.CharField(blank=True, max_length=20, null=True),
        ),
    ]
