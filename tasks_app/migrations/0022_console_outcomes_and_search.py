# The console's outcomes, search and sorting: Task.is_error (a completed task whose result is
# a tool error), set for the tasks already stored; two small partial indexes of tool errors;
# the tool name carried in the status index; and, on PostgreSQL only, the pg_trgm extension
# with trigram indexes for the substring search of idempotency keys and status messages, and
# an index of finished tasks by duration.

from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations, models
from django.db.models import DurationField, ExpressionWrapper, F, Q


# The search's icontains is UPPER(column) LIKE UPPER(pattern) on PostgreSQL: the trigram
# indexes are on the same expression. Written as SQL: Django builds an operator class on an
# expression only with django.contrib.postgres installed, whose connection hooks the project
# does not need (and which held up the task-change notifications' LISTEN connection).
TRIGRAM_INDEXES = {
    "task_key_trgm": "idempotency_key",
    "task_message_trgm": "status_message",
}


def duration_index():
    # The list's sort key (tasks_app.listing), finished tasks only (a running task has none).
    return models.Index(
        ExpressionWrapper(F("finished_at") - F("created_at"), output_field=DurationField()).desc(),
        F("id").desc(),
        condition=Q(finished_at__isnull=False),
        name="task_duration",
    )


def add_postgresql_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return  # SQLite: a plain LIKE and a sort, fine at its sizes
    task = apps.get_model("tasks_app", "Task")
    for name, column in TRIGRAM_INDEXES.items():
        schema_editor.execute(
            f'CREATE INDEX "{name}" ON "tasks_app_task" USING gin ((UPPER("{column}")) gin_trgm_ops)'
        )
    schema_editor.add_index(task, duration_index())


def remove_postgresql_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    task = apps.get_model("tasks_app", "Task")
    for name in TRIGRAM_INDEXES:
        schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')
    schema_editor.remove_index(task, duration_index())


def mark_tool_errors(apps, schema_editor):
    task = apps.get_model("tasks_app", "Task")
    task.objects.filter(status="completed", result__isError=True).update(is_error=True)


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0021_task_status_notify"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="is_error",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.RunPython(mark_tool_errors, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                condition=models.Q(("is_error", True)),
                fields=["-created_at", "-id"],
                include=("client", "tool_name"),
                name="task_tool_error",
            ),
        ),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                condition=models.Q(("is_error", True)),
                fields=["finished_at"],
                include=("client", "tool_name"),
                name="task_tool_error_finished",
            ),
        ),
        # The count per status within a tool filter, from the index alone.
        migrations.RemoveIndex(
            model_name="task",
            name="task_status_recent",
        ),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                fields=["status", "-created_at", "-id"],
                include=("client", "tool_name"),
                name="task_status_recent",
            ),
        ),
        # Does nothing on other databases (Django's CreateExtension checks).
        TrigramExtension(),
        migrations.RunPython(add_postgresql_indexes, remove_postgresql_indexes),
    ]
