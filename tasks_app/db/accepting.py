"""Accepting a call: ``insert_or_get`` inserts the new task with its ``accepted`` event, its
dispatch record and its journal, unless the client's idempotency key already names a task;
then it returns that one (with a ``duplicate_submission`` event when the fingerprints match).
New rows are inserted as ``working``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from psycopg.types.json import Jsonb

from tasks_app import tracing
from tasks_app.db import prepared, rows
from tasks_app.db.reads import tenant_of
from tasks_app.db.results import Accepted, Existing
from tasks_app.models import (
    Actor,
    Dispatch,
    EventKind,
    JournalEntry,
    OAuthGrant,
    Task,
    TaskOrigin,
    event,
)

# --- PostgreSQL's statement ---------------------------------------------------------------
#
# The statement inserts the task unless the (client, key) constraint already holds one
# (ON CONFLICT DO NOTHING), and in the same statement writes either the "accepted" event and
# the dispatch record of the new row, or the "duplicate_submission" event of the existing row
# when the fingerprints match.
#
# Every part sees the snapshot taken when the statement started. A row inserted by a
# concurrent transaction that commits after that is skipped by ON CONFLICT (which waits for
# it) but is invisible to old_task, so the statement returns nothing; it is then run again,
# with a fresh READ COMMITTED snapshot in which the winner is visible.
#
# A new row is the task as given: only its id comes back (NULL for the other columns, whose
# types the UNION takes from old_task), so nothing is read back and converted.
_VALUES = ", ".join(f"%({name})s" for name in rows.TASK_COLUMN_NAMES)
_INSERTED = ", ".join("new_task.id" if name == "id" else "NULL" for name in rows.TASK_COLUMN_NAMES)

_WRITES_POSTGRESQL = f"""
WITH new_task AS (
    INSERT INTO tasks_app_task ({rows.TASK_COLUMNS}) VALUES ({_VALUES})
    ON CONFLICT (client_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, client_id, status
), old_task AS (
    SELECT {rows.TASK_COLUMNS} FROM tasks_app_task
    WHERE client_id = %(client_id)s AND idempotency_key = %(idempotency_key)s
), accepted_event AS (
    INSERT INTO tasks_app_taskevent {rows.EVENT_COLUMNS}
    SELECT id, '{EventKind.ACCEPTED.value}', %(actor_type)s, %(actor)s, '', status,
        %(detail)s, %(created_at)s
    FROM new_task
), duplicate_event AS (
    INSERT INTO tasks_app_taskevent {rows.EVENT_COLUMNS}
    SELECT id, '{EventKind.DUPLICATE_SUBMISSION.value}', %(actor_type)s, %(actor)s, '', '',
        %(detail)s, %(now)s
    FROM old_task WHERE fingerprint = %(fingerprint)s
), outbox AS (
    INSERT INTO tasks_app_dispatch (task_id, reason, created_at, attempts, tenant_id, context)
    SELECT id, 'accepted', %(created_at)s, 0,
        (SELECT tenant_id FROM tasks_app_client WHERE id = new_task.client_id), %(origin)s
    FROM new_task
    RETURNING id
)"""
# A call made with an OAuth token writes the new task's TaskOrigin in the same statement. Its
# person is its grant's (the built-in server's tokens name both, an external issuer's
# neither), so a grant deleted since its token was verified leaves both empty rather than
# failing the call.
_ORIGIN_POSTGRESQL = """, origin AS (
    INSERT INTO tasks_app_taskorigin (task_id, app, person_id, person_name, grant_id)
    SELECT new_task.id, %(origin_app)s, origin_grant.person_id, %(origin_person_name)s,
        origin_grant.id
    FROM new_task LEFT JOIN tasks_app_oauthgrant origin_grant
        ON origin_grant.id = %(origin_grant_id)s
)"""
_RESULT_POSTGRESQL = f"""
SELECT {_INSERTED}, outbox.id FROM new_task, outbox
UNION ALL
SELECT old_task.*, NULL FROM old_task
"""
INSERT_OR_GET_POSTGRESQL = _WRITES_POSTGRESQL + _RESULT_POSTGRESQL
INSERT_OR_GET_WITH_ORIGIN_POSTGRESQL = _WRITES_POSTGRESQL + _ORIGIN_POSTGRESQL + _RESULT_POSTGRESQL


# --- SQLite's statements ------------------------------------------------------------------
#
# No data-modifying CTEs: a transaction of a few statements, written out rather than made by
# the ORM, since every other writer waits while it holds the write lock. The transaction
# holds that lock from its start (IMMEDIATE), so a key found taken names a committed task.
INSERT_TASK_SQLITE = f"""INSERT INTO tasks_app_task ({rows.TASK_COLUMNS}) VALUES ({_VALUES})
ON CONFLICT (client_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id"""
ACCEPTED_EVENT_SQLITE = f"""INSERT INTO tasks_app_taskevent {rows.EVENT_COLUMNS}
VALUES (%(id)s, '{EventKind.ACCEPTED.value}', %(actor_type)s, %(actor)s, '', %(status)s,
    %(detail)s, %(created_at)s)"""
DISPATCH_SQLITE = """INSERT INTO tasks_app_dispatch (task_id, reason, created_at, attempts,
    tenant_id, context)
VALUES (%(id)s, 'accepted', %(created_at)s, 0,
    (SELECT tenant_id FROM tasks_app_client WHERE id = %(client_id)s), %(origin)s)
RETURNING id"""
OLD_TASK_SQLITE = f"""SELECT {rows.TASK_COLUMNS} FROM tasks_app_task
WHERE client_id = %(client_id)s AND idempotency_key = %(idempotency_key)s"""
DUPLICATE_EVENT_SQLITE = f"""INSERT INTO tasks_app_taskevent {rows.EVENT_COLUMNS}
VALUES (%(old_id)s, '{EventKind.DUPLICATE_SUBMISSION.value}', %(actor_type)s, %(actor)s, '', '',
    %(detail)s, %(created_at)s)"""


def insert_or_get_sqlite(
    task: Task,
    *,
    actor: str,
    carrier: str | None,
    journal: list[dict[str, Any]],
    also: Callable[[Task], None] | None = None,
    origin: TaskOrigin | None = None,
) -> Accepted | Existing:
    if journal or also:  # rare (escalated synchronous calls, runs again): the ORM's form
        return insert_or_get_in_transaction(
            task, actor=actor, carrier=carrier, journal=journal, also=also, origin=origin
        )
    db = connections[DEFAULT_DB_ALIAS]
    columns = rows.task_columns()
    params = {c.name: c.value(task, db) for c in columns}
    params.update(
        actor_type=Actor.CLIENT.value,
        actor=actor,
        detail=json.dumps({"era": task.era, "carrier": carrier}),
        origin=json.dumps(tracing.origin()),
    )
    with transaction.atomic(durable=True), db.cursor() as cursor:
        cursor.execute(INSERT_TASK_SQLITE, params)
        if cursor.fetchone() is None:  # the client's key names a task
            cursor.execute(OLD_TASK_SQLITE, params)
            old = cursor.fetchone()
            assert old is not None  # the conflict's row, committed before this transaction
            winner = rows.task_from_row(db, columns, old)
            if winner.fingerprint == task.fingerprint:
                cursor.execute(DUPLICATE_EVENT_SQLITE, {**params, "old_id": winner.pk})
            return Existing(winner)
        cursor.execute(ACCEPTED_EVENT_SQLITE, params)
        cursor.execute(DISPATCH_SQLITE, params)
        (dispatch_id,) = cursor.fetchone()
        task._state.adding = False
        task._state.db = db.alias
        if origin is not None:
            _save_origin(origin, task)
    return Accepted(task, dispatch_id)


def insert_or_get_in_transaction(
    task: Task,
    *,
    actor: str,
    carrier: str | None,
    journal: list[dict[str, Any]],
    also: Callable[[Task], None] | None = None,
    origin: TaskOrigin | None = None,
) -> Accepted | Existing:
    """Insert TASK with its ``accepted`` event, its dispatch record and JOURNAL, unless the
    client's idempotency key already names a task; then return that one. ALSO, given the new
    task, writes what must be committed with it (a run again's effects and links); ORIGIN is
    its TaskOrigin. Commits before it returns (``durable``: never inside a caller's
    transaction). In a transaction: SQLite's IMMEDIATE transactions serialize writers."""
    for _attempt in range(3):
        with transaction.atomic(durable=True):
            try:
                # A savepoint, because on PostgreSQL a failed INSERT aborts the transaction.
                with transaction.atomic():
                    task.save(force_insert=True)
            except IntegrityError:
                if task.idempotency_key is None:
                    raise
                # The winner is committed and visible here: PostgreSQL reports the unique
                # violation only after the other transaction commits, and this statement
                # takes a fresh READ COMMITTED snapshot; on SQLite the IMMEDIATE transaction
                # holds the write lock, so every earlier writer has committed.
                winner = Task.objects.filter(
                    client_id=task.client_id, idempotency_key=task.idempotency_key
                ).first()
                if winner is None:
                    continue  # purged in between: try again
                if winner.fingerprint == task.fingerprint:
                    event(winner, EventKind.DUPLICATE_SUBMISSION, actor_type=Actor.CLIENT,
                          actor=actor, era=task.era, carrier=carrier)  # fmt: skip
                return Existing(winner)
            event(task, EventKind.ACCEPTED, actor_type=Actor.CLIENT, actor=actor,
                  new_status=task.status, era=task.era, carrier=carrier)  # fmt: skip
            # Published by the caller once this commits (``dispatch.publish_on_commit``).
            record = Dispatch.objects.create(
                task=task,
                reason="accepted",
                tenant_id=tenant_of(task),
                context=tracing.origin(),
            )
            JournalEntry.objects.bulk_create(
                JournalEntry(task=task, **{k: e[k] for k in ("seq", "kind", "name", "outcome")})
                for e in journal
            )
            if also is not None:
                also(task)
            if origin is not None:
                _save_origin(origin, task)
        return Accepted(task, record.pk)
    raise RuntimeError(f"could not accept or find task with key {task.idempotency_key!r}")


def _save_origin(origin: TaskOrigin, task: Task) -> None:
    """ORIGIN, the TaskOrigin of the new TASK, as the PostgreSQL statement writes it: its
    grant and the grant's person while the grant exists."""
    grants = OAuthGrant.objects.filter(pk=origin.grant_id) if origin.grant_id else None
    person = grants.values_list("person_id", flat=True).first() if grants is not None else None
    origin.task = task
    origin.grant_id = origin.grant_id if person is not None else None
    origin.person_id = person
    origin.save(force_insert=True)


def insert_or_get_postgresql(
    task: Task,
    *,
    actor: str,
    carrier: str | None,
    journal: list[dict[str, Any]],
    also: Callable[[Task], None] | None = None,
    origin: TaskOrigin | None = None,
) -> Accepted | Existing:
    if journal or also:  # rare (escalated synchronous calls, runs again): the transaction form
        return insert_or_get_in_transaction(
            task, actor=actor, carrier=carrier, journal=journal, also=also, origin=origin
        )
    db = connections[DEFAULT_DB_ALIAS]
    columns = rows.task_columns()
    params = {c.name: c.value(task, db) for c in columns}
    params.update(
        actor_type=Actor.CLIENT.value,
        actor=actor,
        detail=Jsonb({"era": task.era, "carrier": carrier}),
        now=task.created_at,
        origin=Jsonb(tracing.origin()),
    )
    statement = INSERT_OR_GET_POSTGRESQL
    if origin is not None:
        statement = INSERT_OR_GET_WITH_ORIGIN_POSTGRESQL
        params.update(origin_app=origin.app, origin_person_name=origin.person_name,
                      origin_grant_id=origin.grant_id)  # fmt: skip
    # Outside a transaction the statement commits by itself. Inside one, the receipt would
    # not be durable on return: a durable atomic block refuses that (except in a test case).
    for _attempt in range(3):
        if db.in_atomic_block:
            with transaction.atomic(durable=True):
                row = prepared.fetch_prepared(statement, params)
        else:
            row = prepared.fetch_prepared(statement, params)
        if row is None:
            continue  # lost a race to a transaction that committed meanwhile: look again
        if row[-1] is not None:  # inserted as given: the row is TASK, now saved
            task._state.adding = False
            task._state.db = db.alias
            return Accepted(task, row[-1])
        return Existing(rows.task_from_row(db, columns, row[:-1]))
    raise RuntimeError(f"could not accept or find task with key {task.idempotency_key!r}")
