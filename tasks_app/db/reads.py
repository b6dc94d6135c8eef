"""Reads of the hot path: a client's task for every ``tasks/get``, a webhook batch's tasks,
and a task's tenant."""

from __future__ import annotations

from collections.abc import Collection

from django.db import DEFAULT_DB_ALIAS, connections

from tasks_app.db import prepared, rows
from tasks_app.models import Client, Task

TASK_FOR_CLIENT = (
    f"SELECT {rows.TASK_COLUMNS} FROM tasks_app_task "
    "WHERE id = %(task_id)s AND client_id = %(client_id)s"
)


def task_for_client_sqlite(client_id: int, task_id: str) -> Task | None:
    """Client CLIENT_ID's task TASK_ID, or None."""
    db = connections[DEFAULT_DB_ALIAS]
    with db.cursor() as cursor:
        cursor.execute(TASK_FOR_CLIENT, {"task_id": task_id, "client_id": client_id})
        row = cursor.fetchone()
    return None if row is None else rows.task_from_row(db, rows.task_columns(), row)


def task_for_client_postgresql(client_id: int, task_id: str) -> Task | None:
    # Every tasks/get: prepared, on a plain psycopg cursor (Django's cursor wrapper and
    # client-side binding cost more than the read).
    row = prepared.fetch_prepared(TASK_FOR_CLIENT, {"task_id": task_id, "client_id": client_id})
    if row is None:
        return None
    return rows.task_from_row(connections[DEFAULT_DB_ALIAS], rows.task_columns(), row)


def tasks_by_id(ids: Collection[str]) -> dict[str, Task]:
    """The tasks of IDS that exist, by id (what a batch of webhooks reports): one read, each
    row made a task as ``tasks/get``'s is, without the ORM's query building."""
    if not ids:
        return {}
    db = connections[DEFAULT_DB_ALIAS]
    marks = ", ".join(["%s"] * len(ids))
    with db.cursor() as cursor:
        cursor.execute(f"SELECT {rows.TASK_COLUMNS} FROM tasks_app_task WHERE id IN ({marks})",
                       list(ids))  # fmt: skip
        fetched = cursor.fetchall()
    columns = rows.task_columns()
    return {task.pk: task for task in (rows.task_from_row(db, columns, row) for row in fetched)}


def tenant_of(task: Task) -> int | None:
    """The tenant of TASK, for its dispatch records: from its loaded client, else one query."""
    client = task._state.fields_cache.get("client")
    if isinstance(client, Client):
        return client.tenant_id
    tenant: int | None = (
        Task.objects.filter(pk=task.pk).values_list("client__tenant_id", flat=True).first()
    )
    return tenant
