"""Task rows read and written with SQL worked out once per process.

The MCP hot paths (accepting a call, ``tasks/get``) run one small query each, and building
that query through the ORM (filters, compiler, column list) cost more CPU than running it.
Here the column list, its converters and the SQL are prepared once; a fetched row goes
through the same converters Django's compiler would apply, so the result is an ordinary
``Task`` instance.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field
from django.db.models.expressions import Col

from tasks_app.models import Task

# Field types whose Python values psycopg takes as they are (Django's preparation of them is
# the identity on PostgreSQL); any other type goes through get_db_prep_save.
_AS_IS = (
    models.CharField,
    models.TextField,
    models.IntegerField,
    models.BooleanField,
    models.DateTimeField,
    models.ForeignKey,
)


@dataclass(frozen=True)
class Column:
    """One column of the task row, with what writing and reading it needs."""

    name: str
    field: Field[Any, Any]
    col: Col
    as_is: bool
    converters: tuple[Any, ...]

    def value(self, task: Task, db: BaseDatabaseWrapper) -> Any:
        value = getattr(task, self.field.attname)
        if value is None and getattr(self.field, "auto_now_add", False):
            value = self.field.pre_save(task, True)
        return value if self.as_is else self.field.get_db_prep_save(value, connection=db)


@cache
def task_columns() -> tuple[Column, ...]:
    db = connections[DEFAULT_DB_ALIAS]
    columns = []
    for field in Task._meta.concrete_fields:
        col = field.get_col(Task._meta.db_table)
        columns.append(
            Column(
                name=field.column,
                field=field,
                col=col,
                as_is=isinstance(field, _AS_IS),
                converters=tuple(db.ops.get_db_converters(col) + col.get_db_converters(db)),
            )
        )
    return tuple(columns)


def task_from_row(
    db: BaseDatabaseWrapper, columns: tuple[Column, ...], values: tuple[Any, ...]
) -> Task:
    # What Django's SQL compiler does with a fetched row: run each column's converters.
    converted = list(values)
    for i, column in enumerate(columns):
        for converter in column.converters:
            converted[i] = converter(converted[i], column.col, db)
    return Task.from_db(db.alias, [column.field.attname for column in columns], converted)


@cache
def _select_for_client_sql() -> str:
    q = connections[DEFAULT_DB_ALIAS].ops.quote_name
    names = ", ".join(q(column.name) for column in task_columns())
    return f"SELECT {names} FROM {q(Task._meta.db_table)} WHERE {q('id')} = %s AND {q('client_id')} = %s"


def task_for_client(client_id: int, task_id: str) -> Task | None:
    """Return client CLIENT_ID's task TASK_ID, or None."""
    db = connections[DEFAULT_DB_ALIAS]
    with db.cursor() as cursor:
        cursor.execute(_select_for_client_sql(), [task_id, client_id])
        row = cursor.fetchone()
    return None if row is None else task_from_row(db, task_columns(), row)


def fetch_prepared(sql: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
    """PostgreSQL only: run SQL as a prepared statement (parsed and planned once per
    connection, which matters for the big statements of the hot paths) and return its first
    row. Errors become Django's database errors."""
    db = connections[DEFAULT_DB_ALIAS]
    with db.wrap_database_errors:
        db.ensure_connection()
        with psycopg.Cursor(db.connection) as cursor:
            cursor.execute(sql, params, prepare=True)
            row: tuple[Any, ...] | None = cursor.fetchone()
    return row
