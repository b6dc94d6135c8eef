"""Rows as the statements of ``tasks_app.db`` read and write them: the task table's columns,
a fetched row as a ``Task`` or a ``Claim``, and the tables' names."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field
from django.db.models.expressions import Col
from django.utils.dateparse import parse_datetime

from tasks_app.db.results import Claim
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
        if self.as_is and db.vendor == "postgresql":
            return value
        return self.field.get_db_prep_save(value, connection=db)


@cache
def task_columns() -> tuple[Column, ...]:
    db = connections[DEFAULT_DB_ALIAS]
    columns = []
    for field in Task._meta.concrete_fields:
        col = field.get_col(Task._meta.db_table)
        assert field.column is not None  # a concrete field has a column
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


# The task table's columns in their order, as SQL: what a statement reading a whole task selects.
TASK_COLUMN_NAMES = tuple(str(field.column) for field in Task._meta.concrete_fields)
TASK_COLUMNS = ", ".join(f'"{name}"' for name in TASK_COLUMN_NAMES)

# The columns a claim returns, in the order ``claimed`` reads them (after the task's id).
CLAIM_RETURNING = (
    "tool_name, arguments, leg, client_id, "
    "EXISTS (SELECT 1 FROM tasks_app_journalentry j WHERE j.task_id = tasks_app_task.id) "
    # The column itself, not "IS NOT NULL": SQLite 3.40 evaluates a null test in an
    # UPDATE's RETURNING wrongly here (true for a NULL).
    "AS has_journal, status, lease_expires_at, cancel_requested_at"
)

EVENT_COLUMNS = "(task_id, kind, actor_type, actor, old_status, new_status, detail, created_at)"

_ARGUMENTS = Task._meta.get_field("arguments")
assert isinstance(_ARGUMENTS, models.JSONField)
_ARGUMENTS_COL = _ARGUMENTS.get_col(Task._meta.db_table)


def claimed(db: BaseDatabaseWrapper, task_id: str, owner: str, row: tuple[Any, ...]) -> Claim:
    """A claim from the columns of ``CLAIM_RETURNING`` and the dispatch record's context."""
    tool_name, arguments, leg, client_id, has_journal, status, expires, cancel, origin = row
    task = Task(
        id=task_id,  # not pk=: Model.__init__ would first draw a new id as the default
        client_id=client_id,
        tool_name=tool_name,
        arguments=_ARGUMENTS.from_db_value(arguments, _ARGUMENTS_COL, db),
        status=status,
        leg=leg,
        lease_owner=owner,
        lease_expires_at=as_datetime(expires),
    )
    return Claim(
        task=task,
        has_journal=bool(has_journal),
        origin=_origin(origin),
        cancel_requested=cancel is not None,
    )


def as_datetime(value: Any) -> datetime | None:
    """A time as a driver returns it (SQLite: naive, or text, in UTC) as an aware datetime."""
    if value is None:
        return None
    parsed = value if isinstance(value, datetime) else parse_datetime(str(value))
    assert parsed is not None, value
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _origin(value: Any) -> dict[str, Any]:
    # jsonb arrives decoded from psycopg; SQLite's raw cursor hands back the JSON text.
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


def task_field(name: str) -> Field[Any, Any]:
    field = Task._meta.get_field(name)
    assert isinstance(field, Field)
    return field
