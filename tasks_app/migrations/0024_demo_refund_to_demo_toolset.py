# DemoRefund moved to the demo toolset's own app (demo_toolset 0001), which keeps its table
# (db_table "tasks_app_demorefund"): only the migration state changes here, no SQL.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0023_era_choices_without_internal"),
        ("demo_toolset", "0001_demo_refund_from_tasks_app"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="DemoRefund")],
            database_operations=[],
        ),
    ]
