"""On PostgreSQL, a request opened for a task, or one whose status changes (answered,
expired, closed), is notified on ``taskdesk_task_changes``: the set of a waiting task's
``inputRequests`` changed (``tasks_app.mcp.session_streams`` listens there)."""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION taskdesk_request_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('taskdesk_task_changes', NEW.task_id::text);
    RETURN NULL;
END
$$;
CREATE TRIGGER taskdesk_request_opened
    AFTER INSERT ON elicitations_inputrequest
    FOR EACH ROW EXECUTE FUNCTION taskdesk_request_notify();
CREATE TRIGGER taskdesk_request_status
    AFTER UPDATE OF status ON elicitations_inputrequest
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION taskdesk_request_notify();
"""

DROP = """
DROP TRIGGER IF EXISTS taskdesk_request_opened ON elicitations_inputrequest;
DROP TRIGGER IF EXISTS taskdesk_request_status ON elicitations_inputrequest;
DROP FUNCTION IF EXISTS taskdesk_request_notify();
"""


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("elicitations", "0002_default_deadlines"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
