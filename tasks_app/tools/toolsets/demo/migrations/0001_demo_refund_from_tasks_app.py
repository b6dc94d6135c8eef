# DemoRefund, which tasks_app created (0001, 0018), now belongs to the demo toolset. The table
# stays where it is and keeps its rows: this only takes the model into this app's state.

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("tasks_app", "0023_era_choices_without_internal"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="DemoRefund",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("downstream_key", models.CharField(max_length=300, unique=True)),
                        ("payment_id", models.CharField(max_length=200)),
                        ("amount_cents", models.BigIntegerField()),
                        ("reason", models.TextField(blank=True)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("refused_calls", models.PositiveIntegerField(default=0)),
                    ],
                    options={"db_table": "tasks_app_demorefund"},
                ),
            ],
            database_operations=[],
        ),
    ]
