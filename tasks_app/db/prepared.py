"""How a statement runs: every statement of ``tasks_app.db`` is a constant with named
parameters in Django's placeholder style (``%(name)s``; ``%%`` is a percent sign), and this
is the one way each driver gets it:

- PostgreSQL's hot path: ``fetch_prepared`` turns it into PostgreSQL's own placeholders
  (``$1``, ``$2``... with the names in that order, once per process: ``native_statement``)
  and runs it as a prepared statement on a psycopg cursor of Django's connection.
- Everything else: ``execute`` on Django's cursor, which binds the names itself (on SQLite,
  as sqlite3's ``:name``).
"""

from __future__ import annotations

import re
import time
import weakref
from functools import lru_cache
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg.types.datetime import TimestamptzLoader


def execute(sql: str, params: dict[str, Any]) -> tuple[int, list[tuple[Any, ...]]]:
    """Run SQL on Django's cursor (in the caller's transaction, if any): the number of rows it
    changed and the rows it returned."""
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall() if cursor.description is not None else []
        return int(cursor.rowcount), rows


def fetch_prepared(sql: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
    """PostgreSQL only: run SQL as a prepared statement (parsed and planned once per
    connection, which matters for the big statements of the hot paths) and return its first
    row. Errors become Django's database errors.

    Django's cursors bind parameters on the client, and its psycopg backend disables
    psycopg's own preparation; this runs a psycopg cursor on Django's connection instead.
    """
    db = connections[DEFAULT_DB_ALIAS]
    with db.wrap_database_errors:
        db.close_if_health_check_failed()  # as Django's own cursors do first
        db.ensure_connection()
        _replan_if_due(db.connection)
        text, names = native_statement(sql)
        cursor = _kept_cursor(db)
        cursor.execute(text, [params[name] for name in names], prepare=True)
        row: tuple[Any, ...] | None = cursor.fetchone()
    return row


def _kept_cursor(db: BaseDatabaseWrapper) -> psycopg.RawCursor[Any]:
    """The RawCursor ``fetch_prepared`` keeps for the life of DB's current connection.

    A cursor adapts with dumpers and loaders it makes on first use and keeps: a new cursor for
    every statement made them again each time (a JSON dumper per jsonb parameter, a timestamp
    loader per column), about 12 us of a ``tasks/get``'s CPU. The cursor is the connection's
    thread's, as Django's connection is; a new connection gets a new cursor.

    Its timestamps are read by psycopg's own loader, in C, instead of the Python subclass
    Django registers on the connection to give them its time zone: Django's connections run
    in UTC (``USE_TZ``), so both give the same moment in UTC, and a task row holds five.
    """
    kept: psycopg.RawCursor[Any] | None = getattr(db, "_kept_cursor", None)
    if kept is None or kept.connection is not db.connection or kept.closed:
        kept = psycopg.RawCursor(db.connection)
        kept.adapters.register_loader("timestamptz", TimestamptzLoader)
        db._kept_cursor = kept  # type: ignore[attr-defined]
    return kept


_NAMED = re.compile(r"%\((\w+)\)s|%%|%")


@lru_cache(maxsize=256)
def native_statement(sql: str) -> tuple[bytes, tuple[str, ...]]:
    """SQL's ``%(name)s`` placeholders as PostgreSQL's own (``$1``, ``$2``...), with the names
    in that order: converted once per process, where psycopg's cursors would convert them on
    every execution.

    psycopg caches its conversion only for a statement under 4 KiB and 50 parameters; a leg's
    end with the next look is over, and converting it cost a fifth of a drained leg's CPU. Its
    ``RawCursor`` takes the native placeholders as they are.
    """
    names: list[str] = []

    def native(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            if match.group(0) == "%":
                raise ValueError(f"a lone % in a statement: {sql[:80]!r}")
            return "%"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return _NAMED.sub(native, sql).encode(), tuple(names)


# A prepared statement's plan is chosen for the tables as they are then, and kept: one chosen
# when the task table was nearly empty (a fresh deployment) read it whole on every execution
# once it held thousands of rows (0.9 ms of PostgreSQL per tasks/get, where 0.1 ms does).
# PostgreSQL plans again after ANALYZE, which autovacuum runs only now and then (and never
# when it is off). So each connection drops its cached plans every PLAN_MAX_AGE_SECONDS
# (DISCARD PLANS keeps the statements prepared; the next executions are planned afresh).
PLAN_MAX_AGE_SECONDS = 10.0
_planned_at: weakref.WeakKeyDictionary[psycopg.Connection[Any], float] = weakref.WeakKeyDictionary()


def _replan_if_due(raw: psycopg.Connection[Any]) -> None:
    now = time.monotonic()
    since = _planned_at.get(raw)
    if since is None:
        _planned_at[raw] = now
    elif now - since >= PLAN_MAX_AGE_SECONDS:
        raw.execute("DISCARD PLANS")
        _planned_at[raw] = now
