"""Claiming a task for a leg, and the lease it holds: ``claim``, ``claim_next`` (fair across
tenants), ``over_share``, ``renew``, ``lock_leased``, ``release``, ``expired_leases`` and
``expire_lease``, for each backend.

This module and ``tasks_app.db.ending`` are the only writers of the lease columns
(``lease_owner``, ``lease_expires_at``, ``leg``). A claim sets ``lease_expires_at`` to the
database's time plus the lease length and bumps ``leg``, the lease generation: the leg's
fencing token. Every comparison with a lease expiry is made on the database's clock
(``tasks_app.db.clock``).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from tasks_app.db import drainers, prepared, rows
from tasks_app.db.clock import POSTGRESQL_NOW, SQLITE_NOW, postgresql_later, sqlite_later
from tasks_app.db.results import Claim, Looked, Next
from tasks_app.models import Actor, EffectState, EventKind, Status, Task

# --- statements ---------------------------------------------------------------------------


def _claimable(now: str) -> str:
    """Working and not leased by a live leg (by the database's clock NOW); or cancelled while
    nothing ran, with effects to undo (such a leg replays the journal to find their
    compensate hooks, then undoes them)."""
    return (
        f"(lease_owner = '' OR lease_expires_at < {now}) AND (status = %(working)s OR "
        f"(status = '{Status.CANCELLED.value}' AND EXISTS (SELECT 1 FROM tasks_app_effect e "
        f"WHERE e.task_id = tasks_app_task.id AND e.state = '{EffectState.CONFIRMED.value}' "
        "AND e.compensable)))"
    )


# Fair claiming across tenants. The candidates are the oldest waiting record of each tenant
# (one index lookup each: dispatch_waiting_tenant) and the oldest of none (records written
# before records had tenants); the next is the candidate whose tenant has the fewest legs
# running now, the oldest first among equals. So a tenant's backlog never starves another
# tenant: a tenant with nothing running goes first. Legs are counted only when there is a
# choice to make: counting reads the index entries of every lease taken lately (dead row
# versions included), which cost more than the rest of the claim.
def _fair_next(*, now: str, head_tail: str, head_record: str) -> str:
    def head(match: str) -> str:
        return (
            f"(SELECT d2.id FROM tasks_app_dispatch d2 WHERE {match} AND d2.consumed_at IS NULL"
            f"{head_tail})"
        )

    # Legs of the candidate's tenant running now: tasks holding a live lease (task_leased
    # holds only leased rows).
    running = (
        "SELECT count(*) FROM tasks_app_task rt JOIN tasks_app_client c ON c.id = rt.client_id "
        f"WHERE c.tenant_id = candidates.tenant_id AND rt.lease_expires_at > {now}"
    )
    return f"""
            WITH candidates AS MATERIALIZED (
                SELECT d.id, d.task_id, d.created_at, d.tenant_id
                FROM (SELECT {head("d2.tenant_id = tn.id")} AS id FROM tasks_app_tenant tn
                      UNION ALL SELECT {head("d2.tenant_id IS NULL")}) heads
                {head_record}
            )
            SELECT id, task_id, created_at, (SELECT min(id) FROM candidates) AS oldest
            FROM candidates
            ORDER BY CASE WHEN (SELECT count(*) FROM candidates) > 1 THEN ({running}) ELSE 0 END,
                id
            LIMIT 1"""


FAIR_NEXT_SQLITE = _fair_next(
    now=SQLITE_NOW,
    head_tail=" ORDER BY d2.id LIMIT 1",
    head_record="JOIN tasks_app_dispatch d ON d.id = heads.id",
)
# PostgreSQL: SKIP LOCKED lets two workers looking at once take different records; FLOOR
# (a hint, ``leases.claim_next``) skips the records below it. Each head record is a lateral
# lookup (LIMIT 1 keeps the planner from flattening it into a join), so each is one
# primary-key probe. As a plain join the planner, which cannot tell how few heads there are,
# hashed the whole dispatch table on every claim: a cost that grew with the table (4 ms per
# claim at 6,000 records under EXPLAIN ANALYZE; 0.45 ms, whatever the size).
FAIR_NEXT_POSTGRESQL = _fair_next(
    now=POSTGRESQL_NOW,
    head_tail=" AND d2.id >= %(floor)s ORDER BY d2.id LIMIT 1 FOR UPDATE SKIP LOCKED",
    head_record=(
        "CROSS JOIN LATERAL (SELECT id, task_id, tenant_id, created_at FROM tasks_app_dispatch "
        "WHERE id = heads.id LIMIT 1) d"
    ),
)

# SQLite: a claim is a few statements in one transaction.
CONSUME_SQLITE = (
    "UPDATE tasks_app_dispatch SET consumed_at = %(now)s "
    "WHERE id = %(dispatch)s AND task_id = %(task)s AND consumed_at IS NULL"
)
DISPATCH_CONTEXT_SQLITE = "SELECT context FROM tasks_app_dispatch WHERE id = %(dispatch)s"
CLAIM_TASK_SQLITE = f"""UPDATE tasks_app_task SET lease_owner = %(owner)s,
    lease_expires_at = {sqlite_later("lease")}, leg = leg + 1, updated_at = %(now)s
    WHERE id = %(task)s AND {_claimable(SQLITE_NOW)}
    RETURNING {rows.CLAIM_RETURNING}"""

# The claim's ``leg_started`` event, as PostgreSQL's ``started`` below writes it.
STARTED_EVENT_SQLITE = f"""INSERT INTO tasks_app_taskevent {rows.EVENT_COLUMNS}
    VALUES (%(task)s, '{EventKind.LEG_STARTED.value}', %(worker)s, %(owner)s, '', '',
        json_object('leg', %(leg)s, 'dispatch', %(dispatch)s), %(now)s)"""

# PostgreSQL: one statement. The CTE ``claimed`` takes the lease of the task TASK (SQL) of a
# statement whose CTE ``consumed`` holds the record; ``started`` writes ``leg_started``.
# The next leg's lease owner is the parameter named OWNER.


def _claimed_cte(*, task: str, owner: str, dispatch: str = "") -> str:
    return f"""claimed AS (
            UPDATE tasks_app_task SET lease_owner = %({owner})s,
                lease_expires_at = {postgresql_later("lease")},
                leg = leg + 1, updated_at = %(now)s
            WHERE id = {task} AND {_claimable(POSTGRESQL_NOW)}{dispatch}
            RETURNING id, {rows.CLAIM_RETURNING}
        )"""


def _started_cte(*, owner: str, dispatch: str, source: str) -> str:
    return f"""started AS (
            INSERT INTO tasks_app_taskevent {rows.EVENT_COLUMNS}
            SELECT claimed.id, '{EventKind.LEG_STARTED.value}', %(worker)s, %({owner})s, '', '',
                jsonb_build_object('leg', leg, 'dispatch', {dispatch}), %(now)s
            FROM {source}
        )"""


# A claim with a record consumes it first; one without (DISPATCH NULL) claims the task alone.
_CLAIMED_WITH_RECORD = _claimed_cte(
    task="%(task)s",
    owner="owner",
    dispatch=" AND (%(dispatch)s::bigint IS NULL OR EXISTS (SELECT 1 FROM consumed))",
)
_STARTED = _started_cte(owner="owner", dispatch="%(dispatch)s::bigint", source="claimed")
CLAIM_POSTGRESQL = f"""
        WITH consumed AS (
            UPDATE tasks_app_dispatch SET consumed_at = %(now)s
            WHERE id = %(dispatch)s AND task_id = %(task)s AND consumed_at IS NULL
            RETURNING id, context
        ), {_CLAIMED_WITH_RECORD}, {_STARTED}
        SELECT tool_name, arguments, leg, client_id, has_journal, status, lease_expires_at,
            cancel_requested_at, (SELECT context FROM consumed)
        FROM claimed
    """


def _next_ctes(owner: str) -> str:
    """The CTEs of a look for the next waiting record (``claim_next``), with the next leg's
    lease owner in the parameter named OWNER."""
    claimed = _claimed_cte(task="(SELECT task_id FROM consumed)", owner=owner)
    started = _started_cte(owner=owner, dispatch="consumed.id", source="claimed, consumed")
    return f"""next AS (
            {FAIR_NEXT_POSTGRESQL}
        ), drainer AS (
            {drainers.REFRESH_IN_LOOK_POSTGRESQL}
        ), consumed AS (
            UPDATE tasks_app_dispatch SET consumed_at = %(now)s
            WHERE id = (SELECT id FROM next)
            RETURNING id, task_id, context, created_at
        ), {claimed}, {started}"""


NEXT_CTES = _next_ctes("owner")
# A leg's end makes the same look in its own statement (``tasks_app.db.ending``): the ending
# leg's lease owner is ``owner`` there, the next leg's ``next_owner``.
NEXT_CTES_AFTER_END = _next_ctes("next_owner")

# What a look found (read by ``looked``).
NEXT_COLUMNS = """consumed.id, consumed.task_id, consumed.created_at, (SELECT oldest FROM next),
            CASE WHEN consumed.id IS NULL THEN (SELECT max(id) FROM tasks_app_dispatch) END,
            (SELECT standby FROM drainer),
            claimed.tool_name, claimed.arguments, claimed.leg, claimed.client_id,
            claimed.has_journal, claimed.status, claimed.lease_expires_at,
            claimed.cancel_requested_at, consumed.context
        FROM (SELECT 1) AS one LEFT JOIN consumed ON true LEFT JOIN claimed ON true"""

CLAIM_NEXT_POSTGRESQL = f"WITH {NEXT_CTES}\nSELECT {NEXT_COLUMNS}"


def _over_share_statements(now: str, busy: str) -> tuple[str, str]:
    running = (
        "SELECT c.tenant_id, count(*), max(rt.id) FROM tasks_app_task rt "
        "JOIN tasks_app_client c ON c.id = rt.client_id "
        f"WHERE rt.lease_expires_at > {now} GROUP BY c.tenant_id"
    )
    # Another tenant than the busy ones (BUSY: the ids of a JSON array) with a record waiting.
    waiting = (
        f"SELECT 1 FROM tasks_app_tenant tn WHERE tn.id NOT IN ({busy}) AND EXISTS ("
        "SELECT 1 FROM tasks_app_dispatch d WHERE d.tenant_id = tn.id "
        "AND d.consumed_at IS NULL) LIMIT 1"
    )
    return running, waiting


RUNNING_LEGS_SQLITE, OTHER_TENANT_WAITING_SQLITE = _over_share_statements(
    SQLITE_NOW, "SELECT value FROM json_each(%(busy)s)"
)
RUNNING_LEGS_POSTGRESQL, OTHER_TENANT_WAITING_POSTGRESQL = _over_share_statements(
    POSTGRESQL_NOW, "SELECT jsonb_array_elements_text(%(busy)s::jsonb)::bigint"
)


def _renew(now: str, later: str) -> str:
    return (
        f"UPDATE tasks_app_task SET lease_expires_at = {later} "
        "WHERE id = %(task_id)s AND lease_owner = %(owner)s AND leg = %(leg)s "
        f"AND status IN ('{Status.WORKING.value}', '{Status.CANCELLED.value}') "
        f"AND lease_expires_at > {now}"
    )


RENEW_SQLITE = _renew(SQLITE_NOW, sqlite_later("lease"))
RENEW_POSTGRESQL = _renew(POSTGRESQL_NOW, postgresql_later("lease"))

# The fence: the task's lease is still OWNER's, of generation LEG, and not expired by the
# database's clock. A leg's writes lock the task row with it (``lock_leased``), in the same
# transaction as the write; the end of a leg checks the same in its statement (``ending``).
_HOLDS = "id = %(task_id)s AND lease_owner = %(owner)s AND leg = %(leg)s AND lease_expires_at > "
HOLDS_SQLITE = _HOLDS + SQLITE_NOW
HOLDS_POSTGRESQL = _HOLDS + POSTGRESQL_NOW
# SQLite has no row locks: its IMMEDIATE transactions serialize writers.
LOCK_LEASED_SQLITE = f"SELECT {rows.TASK_COLUMNS} FROM tasks_app_task WHERE {HOLDS_SQLITE}"
LOCK_LEASED_POSTGRESQL = (
    f"SELECT {rows.TASK_COLUMNS} FROM tasks_app_task WHERE {HOLDS_POSTGRESQL} FOR UPDATE"
)

# Any lease when OWNER is NULL; any generation when LEG is NULL.
RELEASE = (
    "UPDATE tasks_app_task SET lease_owner = '', lease_expires_at = NULL, updated_at = %(now)s "
    "WHERE id = %(task_id)s AND lease_owner <> '' "
    "AND (%(owner)s IS NULL OR lease_owner = %(owner)s) AND (%(leg)s IS NULL OR leg = %(leg)s)"
)


def _expired(now: str) -> tuple[str, str]:
    expired = (
        "SELECT id, status, lease_owner, leg FROM tasks_app_task "
        f"WHERE status = %(status)s AND lease_expires_at < {now} "
        "ORDER BY lease_expires_at LIMIT %(limit)s"
    )
    expire = (
        "UPDATE tasks_app_task SET lease_owner = '', lease_expires_at = NULL, "
        "updated_at = %(now)s WHERE id = %(task_id)s AND status = %(status)s "
        f"AND lease_owner = %(owner)s AND lease_expires_at < {now}"
    )
    return expired, expire


EXPIRED_LEASES_SQLITE, EXPIRE_LEASE_SQLITE = _expired(SQLITE_NOW)
EXPIRED_LEASES_POSTGRESQL, EXPIRE_LEASE_POSTGRESQL = _expired(POSTGRESQL_NOW)

# --- SQLite -------------------------------------------------------------------------------


def _db_time(value: datetime) -> Any:
    return connections[DEFAULT_DB_ALIAS].ops.adapt_datetimefield_value(value)


def claim_sqlite(
    *, task_id: str, dispatch_id: int | None, owner: str, now: datetime, lease_seconds: float
) -> Claim | None:
    with transaction.atomic():
        return _claim_sqlite(task_id, dispatch_id, owner, now, lease_seconds)


def _claim_sqlite(
    task_id: str, dispatch_id: int | None, owner: str, now: datetime, lease_seconds: float
) -> Claim | None:
    db = connections[DEFAULT_DB_ALIAS]
    params = {
        "now": _db_time(now),
        "dispatch": dispatch_id,
        "task": task_id,
        "owner": owner,
        "lease": float(lease_seconds),
        "working": Status.WORKING.value,
        "worker": Actor.WORKER.value,
    }
    with db.cursor() as cursor:
        origin = None
        if dispatch_id is not None:
            cursor.execute(CONSUME_SQLITE, params)
            if cursor.rowcount != 1:
                return None
            cursor.execute(DISPATCH_CONTEXT_SQLITE, params)
            (origin,) = cursor.fetchone()
        cursor.execute(CLAIM_TASK_SQLITE, params)
        row = cursor.fetchone()
        if row is None:
            return None
        claim = rows.claimed(db, task_id, owner, (*row, origin))
        cursor.execute(STARTED_EVENT_SQLITE, {**params, "leg": claim.task.leg})
    return claim


def claim_next_sqlite(
    *,
    owner: str,
    now: datetime,
    lease_seconds: float,
    drainer: str | None = None,
    window: float = 0.0,
    floor: int = 0,
    standby: float = 0.0,
    channel: str = "",
) -> Looked:
    # FLOOR, STANDBY and CHANNEL are PostgreSQL's: SQLite looks at every record and cannot
    # stand by.
    with transaction.atomic():
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            if drainer is not None:
                cursor.execute(drainers.REFRESH_SQLITE, {"drainer": drainer, "window": window})
            cursor.execute(FAIR_NEXT_SQLITE, {})
            found = cursor.fetchone()
        if found is None:
            return Looked(None)
        dispatch_id, task_id, created_at, oldest = found
        claim = _claim_sqlite(task_id, dispatch_id, owner, now, lease_seconds)
        return Looked(Next(dispatch_id, claim, rows.as_datetime(created_at), oldest), oldest)


def _over_share(
    running_sql: str, waiting_sql: str, task_id: str, tenant_id: int, share: float
) -> bool:
    _, found = prepared.execute(running_sql, {})
    running = {tenant: (legs, newest) for tenant, legs, newest in found}
    legs, newest = running.get(tenant_id, (0, None))
    total = sum(n for n, _ in running.values())
    if newest != task_id or legs <= max(1, math.floor(share * total)):
        return False
    busy = [tenant for tenant, (n, _) in running.items() if tenant is not None and n >= legs - 1]
    _, waiting = prepared.execute(waiting_sql, {"busy": json_list(busy)})
    return bool(waiting)


def json_list(values: list[int]) -> str:
    return "[" + ", ".join(str(int(value)) for value in values) + "]"


def over_share_sqlite(*, task_id: str, tenant_id: int, share: float) -> bool:
    return _over_share(RUNNING_LEGS_SQLITE, OTHER_TENANT_WAITING_SQLITE, task_id, tenant_id, share)


def renew_sqlite(*, task_id: str, owner: str, leg: int, lease_seconds: float) -> bool:
    changed, _ = prepared.execute(
        RENEW_SQLITE,
        {"task_id": task_id, "owner": owner, "leg": leg, "lease": float(lease_seconds)},
    )
    return changed == 1


def lock_leased_sqlite(*, task_id: str, owner: str, leg: int) -> Task | None:
    return _lock_leased(LOCK_LEASED_SQLITE, task_id, owner, leg)


def _lock_leased(sql: str, task_id: str, owner: str, leg: int) -> Task | None:
    _, found = prepared.execute(sql, {"task_id": task_id, "owner": owner, "leg": leg})
    if not found:
        return None
    db = connections[DEFAULT_DB_ALIAS]
    return rows.task_from_row(db, rows.task_columns(), found[0])


def release(*, task_id: str, owner: str | None, now: datetime, leg: int | None = None) -> bool:
    changed, _ = prepared.execute(
        RELEASE, {"task_id": task_id, "owner": owner, "leg": leg, "now": _db_time(now)}
    )
    return changed > 0


def expired_leases_sqlite(*, status: str, limit: int) -> list[tuple[str, str, str, int]]:
    _, found = prepared.execute(EXPIRED_LEASES_SQLITE, {"status": status, "limit": limit})
    return [(task_id, state, owner, leg) for task_id, state, owner, leg in found]


def expire_lease_sqlite(*, task_id: str, status: str, owner: str, now: datetime) -> bool:
    return _expire(EXPIRE_LEASE_SQLITE, task_id, status, owner, now)


def _expire(sql: str, task_id: str, status: str, owner: str, now: datetime) -> bool:
    params = {"task_id": task_id, "status": status, "owner": owner, "now": _db_time(now)}
    changed, _ = prepared.execute(sql, params)
    return changed > 0


# --- PostgreSQL ---------------------------------------------------------------------------


def claim_params(owner: str, now: datetime, lease_seconds: float) -> dict[str, Any]:
    return {
        "now": now,
        "lease": float(lease_seconds),
        "owner": owner,
        "working": Status.WORKING.value,
        "worker": Actor.WORKER.value,
    }


def claim_postgresql(
    *, task_id: str, dispatch_id: int | None, owner: str, now: datetime, lease_seconds: float
) -> Claim | None:
    params = claim_params(owner, now, lease_seconds)
    params.update(task=task_id, dispatch=dispatch_id)
    row = prepared.fetch_prepared(CLAIM_POSTGRESQL, params)
    return None if row is None else rows.claimed(connections[DEFAULT_DB_ALIAS], task_id, owner, row)


def looked(owner: str, row: tuple[Any, ...]) -> Looked:
    """What a look found, from its columns (``NEXT_COLUMNS``)."""
    dispatch_id, task_id, created_at, oldest, newest, standing_by, *claim_row = row
    if dispatch_id is None:
        return Looked(None, None, newest, standing_by=bool(standing_by))
    db = connections[DEFAULT_DB_ALIAS]
    claim = None if claim_row[0] is None else rows.claimed(db, task_id, owner, tuple(claim_row))
    return Looked(Next(dispatch_id, claim, created_at, oldest), oldest)


def claim_next_postgresql(
    *,
    owner: str,
    now: datetime,
    lease_seconds: float,
    drainer: str | None = None,
    window: float = 0.0,
    floor: int = 0,
    standby: float = 0.0,
    channel: str = "",
) -> Looked:
    params = claim_params(owner, now, lease_seconds)
    params.update(
        drainer=drainer, window=float(window), floor=floor, standby=float(standby), channel=channel
    )
    row = prepared.fetch_prepared(CLAIM_NEXT_POSTGRESQL, params)
    assert row is not None  # always one row
    return looked(owner, row)


def over_share_postgresql(*, task_id: str, tenant_id: int, share: float) -> bool:
    return _over_share(
        RUNNING_LEGS_POSTGRESQL, OTHER_TENANT_WAITING_POSTGRESQL, task_id, tenant_id, share
    )


def renew_postgresql(*, task_id: str, owner: str, leg: int, lease_seconds: float) -> bool:
    changed, _ = prepared.execute(
        RENEW_POSTGRESQL,
        {"task_id": task_id, "owner": owner, "leg": leg, "lease": float(lease_seconds)},
    )
    return changed == 1


def lock_leased_postgresql(*, task_id: str, owner: str, leg: int) -> Task | None:
    return _lock_leased(LOCK_LEASED_POSTGRESQL, task_id, owner, leg)


def expired_leases_postgresql(*, status: str, limit: int) -> list[tuple[str, str, str, int]]:
    _, found = prepared.execute(EXPIRED_LEASES_POSTGRESQL, {"status": status, "limit": limit})
    return [(task_id, state, owner, leg) for task_id, state, owner, leg in found]


def expire_lease_postgresql(*, task_id: str, status: str, owner: str, now: datetime) -> bool:
    return _expire(EXPIRE_LEASE_POSTGRESQL, task_id, status, owner, now)
