"""Print the acceptance statement as pgbench runs it: ``python bench/statement.py``.

The statement is the one ``tasks_app.acceptance`` prepares on PostgreSQL, with the values of a
``slow_echo`` call by client ``bench`` written as literals, a new task id per transaction, and
the idempotency key ``pgbench-:key`` (``:key`` is set by the pgbench script).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


def main() -> None:
    import django

    django.setup()
    from django.db import connection
    from psycopg import sql as psql
    from psycopg.types.json import Jsonb

    from tasks_app import acceptance
    from tasks_app.db import accepting, rows
    from tasks_app.models import Actor, Client, Era
    from tasks_app.tools import get_tool

    tool = get_tool("slow_echo")
    assert tool is not None
    normalized = tool.normalize_arguments({"text": "bench", "seconds": 1})
    fingerprint = acceptance.fingerprint(tool, normalized)
    client = Client.objects.get(name="bench")
    task = acceptance.new_task(client, tool, normalized, fingerprint, "k", Era.MODERN)
    connection.ensure_connection()
    params = {c.name: c.value(task, connection) for c in rows.task_columns()}
    params.update(
        actor_type=Actor.CLIENT.value,
        actor=client.name,
        now=task.created_at,
        detail=Jsonb({"era": task.era, "carrier": "header"}),
        origin=Jsonb({}),  # the dispatch record's trace context (none here)
    )
    literals = {k: psql.Literal(v).as_string(connection.connection) for k, v in params.items()}
    literals["id"] = "md5(random()::text)"
    literals["idempotency_key"] = "'pgbench-' || :key"
    text = accepting.INSERT_OR_GET_POSTGRESQL
    for name, value in literals.items():
        text = text.replace(f"%({name})s", value)
    print(" ".join(text.split()) + ";")


if __name__ == "__main__":
    main()
