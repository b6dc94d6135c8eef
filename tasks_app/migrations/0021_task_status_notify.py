"""On PostgreSQL, a change of a task's status is notified on ``taskdesk_task_changes`` (the
channel ``tasks_app.mcp.session_streams`` listens on), whichever process or statement makes
it: the watchers of the open streams wake at once instead of at their next tick. Only a
status change notifies (not a checkpoint or a status line), once per row."""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION taskdesk_task_status_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('taskdesk_task_changes', NEW.client_id::text);
    RETURN NULL;
END
$$;
CREATE TRIGGER taskdesk_task_status_notify
    AFTER UPDATE OF status ON tasks_app_task
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION taskdesk_task_status_notify();
"""

DROP = """
DROP TRIGGER IF EXISTS taskdesk_task_status_notify ON tasks_app_task;
DROP FUNCTION IF EXISTS taskdesk_task_status_notify();
"""


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0020_webhooks_outbox"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
