"""A leg's end: ``end_leased`` ends a leased, working task in a terminal status, writes its
fields, clears its lease, writes its event, closes its pending questions (through
``tasks_app.seams``: the elicitations app owns them) and its webhook messages. Only
``tasks_app.transitions`` calls it; it is the only writer of ``Task.status`` here.

On PostgreSQL the end is one statement, and a draining worker's next look rides along
(``LookAfterEnd``): one statement and one round trip per leg instead of two.
"""

from __future__ import annotations

import json
import time
from functools import lru_cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from psycopg.types.json import Jsonb

from tasks_app import outbox, seams
from tasks_app.db import claiming, prepared, rows
from tasks_app.db.clock import POSTGRESQL_NOW, SQLITE_NOW
from tasks_app.db.results import Ended, Ending, look_after_end
from tasks_app.models import Actor, Channel, EventKind, Status, Task

# --- statements (PostgreSQL) --------------------------------------------------------------

# The fields an end writes vary (``Ending.fields``): each set of them gets its statement,
# made once per process (``end_statement``) from these parts.
_ENDED_SET = """ended AS (
    UPDATE tasks_app_task SET status = %(to)s, updated_at = %(now)s, finished_at = %(now)s,
        lease_owner = '', lease_expires_at = NULL,
        stored_bytes = stored_bytes + %(grow)s::bigint"""
_ENDED_WHERE = f"""
    WHERE id = %(task_id)s AND status = %(working)s AND lease_owner = %(owner)s
        AND leg = %(leg)s AND lease_expires_at > {POSTGRESQL_NOW}
    RETURNING id, tool_name, created_at, client_id
)"""

_WRITTEN = f"""written AS (
    INSERT INTO tasks_app_taskevent {rows.EVENT_COLUMNS}
    SELECT task_id, kind, actor_type, actor, old_status, new_status, detail, %(now)s
    FROM (
        SELECT 1 AS n, id AS task_id, %(kind)s AS kind, %(worker)s AS actor_type,
            %(actor)s AS actor, %(working)s AS old_status, %(to)s AS new_status,
            %(detail)s::jsonb AS detail
        FROM ended
        UNION ALL
        SELECT 2, %(task_id)s, %(input_closed)s, %(system)s, '', '', '',
            jsonb_build_object('keys', (SELECT jsonb_agg(key ORDER BY key) FROM closed),
                               'reason', %(to)s)
        WHERE EXISTS (SELECT 1 FROM closed)
    ) AS rows
    ORDER BY n
)"""

# outbox.write_for_task: the client's webhook endpoints subscribed to the event (one probe of
# an empty partial index for a client without any).
_MESSAGED = """messaged AS (
    INSERT INTO tasks_app_outboxmessage (channel, kind, message_id, task_id, endpoint_id,
        recipient, detail, created_at, retry_from, due_at, attempts, last_error)
    SELECT %(webhook)s, %(hook_event)s, 'msg_' || replace(gen_random_uuid()::text, '-', ''),
        ended.id, hook.id, '', '{}'::jsonb, %(now)s, %(now)s, %(now)s, 0, ''
    FROM ended JOIN tasks_app_webhookendpoint AS hook ON hook.client_id = ended.client_id
    WHERE hook.enabled AND hook.events @> %(hook_events)s::jsonb
)"""


@lru_cache(maxsize=64)
def end_statement(names: tuple[str, ...], questions: str, look: bool) -> str:
    """The end of a leg that writes the fields NAMES, closing questions with QUESTIONS (the
    body of the CTE ``closed``: ``seams.PendingQuestions.closing_statement``); with LOOK, it
    looks for the next record as well (``claiming.NEXT_CTES_AFTER_END``). The two touch
    different task rows: the ended one is leased by this leg in the statement's snapshot,
    which a claim requires it not to be."""
    assignments = "".join(f', "{name}" = %({name})s' for name in names)
    ctes = ", ".join(
        (_ENDED_SET + assignments + _ENDED_WHERE, f"closed AS (\n    {questions}\n)", _WRITTEN,
         _MESSAGED)
    )  # fmt: skip
    if not look:
        return f"WITH {ctes}\nSELECT tool_name, created_at FROM ended"
    return (
        f"WITH {ctes}, {claiming.NEXT_CTES_AFTER_END}\n"
        "SELECT (SELECT tool_name FROM ended), (SELECT created_at FROM ended), "
        f"{claiming.NEXT_COLUMNS}"
    )


# --- SQLite -------------------------------------------------------------------------------
#
# SQLite has no data-modifying CTEs: the end is a few statements in one transaction, written
# out rather than made by the ORM, since every writer waits while it holds the write lock.


@lru_cache(maxsize=64)
def end_statement_sqlite(names: tuple[str, ...]) -> str:
    """The UPDATE that ends a leg writing the fields NAMES (as ``end_statement``'s ``ended``)."""
    assignments = "".join(f', "{name}" = %({name})s' for name in names)
    return f"""UPDATE tasks_app_task SET status = %(to)s, updated_at = %(now)s,
    finished_at = %(now)s, lease_owner = '', lease_expires_at = NULL,
    stored_bytes = stored_bytes + %(grow)s{assignments}
WHERE id = %(task_id)s AND status = %(working)s AND lease_owner = %(owner)s AND leg = %(leg)s
    AND lease_expires_at > {SQLITE_NOW}
RETURNING tool_name, created_at, client_id"""


ENDED_EVENT_SQLITE = f"""INSERT INTO tasks_app_taskevent {rows.EVENT_COLUMNS}
VALUES (%(task_id)s, %(kind)s, %(worker)s, %(actor)s, %(working)s, %(to)s, %(detail)s, %(now)s)"""

# outbox.write_for_task, as the PostgreSQL statement's ``messaged``.
MESSAGED_SQLITE = """INSERT INTO tasks_app_outboxmessage (channel, kind, message_id, task_id,
    endpoint_id, recipient, detail, created_at, retry_from, due_at, attempts, last_error)
SELECT %(webhook)s, %(hook_event)s, 'msg_' || lower(hex(randomblob(16))), %(task_id)s, hook.id,
    '', '{}', %(now)s, %(now)s, %(now)s, 0, ''
FROM tasks_app_webhookendpoint AS hook
WHERE hook.client_id = %(client_id)s AND hook.enabled
    AND EXISTS (SELECT 1 FROM json_each(hook.events) WHERE value = %(hook_event)s)"""


def end_leased_sqlite(ending: Ending) -> Ended | None:
    """End leased, working task ENDING.task_id in ENDING.status: write its fields, clear the
    lease, write the event and close its pending questions. None, having written nothing, if
    ENDING.owner no longer holds the lease (generation ENDING.leg, unexpired by the
    database's clock) of a working task."""
    e = ending
    db = connections[DEFAULT_DB_ALIAS]
    params = _params(e, db)
    params.update(detail=json.dumps(e.detail), now=db.ops.adapt_datetimefield_value(e.now))
    statement = end_statement_sqlite(tuple(sorted(e.fields)))
    with transaction.atomic(), db.cursor() as cursor:
        cursor.execute(statement, params)
        ended = cursor.fetchone()
        if ended is None:
            return None
        tool_name, created_at, params["client_id"] = ended
        cursor.execute(ENDED_EVENT_SQLITE, params)
        seams.pending_questions().close(Task(id=e.task_id), reason=e.status)
        cursor.execute(MESSAGED_SQLITE, params)
    created = rows.as_datetime(created_at)
    assert created is not None  # never null
    return Ended(tool_name=tool_name, created_at=created)


# --- PostgreSQL ---------------------------------------------------------------------------


def end_leased_postgresql(ending: Ending) -> Ended | None:
    # One statement, so one round trip and atomic without a transaction block.
    e = ending
    db = connections[DEFAULT_DB_ALIAS]
    params = _params(e, db)
    questions = seams.pending_questions().closing_statement()
    params.update(
        questions.params,
        detail=Jsonb(e.detail),
        now=e.now,
        system=Actor.SYSTEM.value,
        input_closed=EventKind.INPUT_CLOSED.value,
        hook_events=Jsonb([params["hook_event"]]),
    )
    names = tuple(sorted(e.fields))
    look = look_after_end.get()
    if (
        look is None
        or look.looked is not None
        or look.task_id != e.task_id
        or db.in_atomic_block  # the look's claim would wait for the block's commit
        or time.monotonic() >= look.deadline
    ):
        row = prepared.fetch_prepared(end_statement(names, questions.sql, False), params)
        return None if row is None else Ended(tool_name=row[0], created_at=row[1])
    params.update(
        next_owner=look.owner,
        lease=float(look.lease_seconds),
        drainer=look.drainer,
        window=float(look.window),
        floor=look.floor,
        standby=look.standby_seconds(),
        channel=look.channel,
    )
    look.sent = time.monotonic()
    row = prepared.fetch_prepared(end_statement(names, questions.sql, True), params)
    assert row is not None  # always one row
    look.looked = claiming.looked(look.owner, row[2:])
    return None if row[0] is None else Ended(tool_name=row[0], created_at=row[1])


def _params(e: Ending, db: Any) -> dict[str, Any]:
    """The parameters both backends' statements of the end of E take (on DB's connection)."""
    params: dict[str, Any] = {
        name: rows.task_field(name).get_db_prep_save(value, connection=db)
        for name, value in e.fields.items()
    }
    params.update(
        task_id=e.task_id,
        to=e.status.value,
        grow=e.grow,
        owner=e.owner,
        leg=e.leg,
        kind=e.kind.value,
        actor=e.actor,
        working=Status.WORKING.value,
        worker=Actor.WORKER.value,
        webhook=Channel.WEBHOOK.value,
        hook_event=outbox.WEBHOOK_EVENT_OF[e.kind].value,
    )
    return params
