"""Draining: the ``Drainer`` rows of the processes that take dispatch records from the table
without a message (``tasks_app.runtime.draining`` decides when). A worker's look for the next
record refreshes its row (``claim_next``), standing by marks it (PostgreSQL: LISTEN/NOTIFY),
``hand_off`` (a web process) clears the mark, and the sweeper forgets the rows of killed
processes."""

from __future__ import annotations

from tasks_app.db import prepared
from tasks_app.db.clock import POSTGRESQL_NOW, SQLITE_NOW, postgresql_later, sqlite_later

# --- statements ---------------------------------------------------------------------------

REFRESH_SQLITE = f"""INSERT INTO tasks_app_drainer (name, until, standby, channel)
    VALUES (%(drainer)s, {sqlite_later("window")}, false, '')
    ON CONFLICT (name) DO UPDATE SET until = excluded.until, standby = false"""

# The CTE ``drainer`` of a look (``claiming.NEXT_CTES``): the row of DRAINER (when not NULL)
# is fresh for WINDOW seconds, or, when STANDBY > 0 and the CTE ``next`` found nothing,
# stands by for STANDBY seconds on CHANNEL.
REFRESH_IN_LOOK_POSTGRESQL = """INSERT INTO tasks_app_drainer (name, until, standby, channel)
            SELECT %(drainer)s::text, statement_timestamp() + make_interval(
                    secs => CASE WHEN marks THEN %(standby)s ELSE %(window)s END),
                marks, %(channel)s
            FROM (SELECT %(standby)s::float8 > 0 AND NOT EXISTS (SELECT 1 FROM next) AS marks) m
            WHERE %(drainer)s::text IS NOT NULL
            ON CONFLICT (name) DO UPDATE SET until = excluded.until, standby = excluded.standby,
                channel = excluded.channel
            RETURNING standby"""

STAND_BY_POSTGRESQL = f"""INSERT INTO tasks_app_drainer (name, until, standby, channel)
            VALUES (%(name)s, {postgresql_later("seconds")}, true, %(channel)s)
            ON CONFLICT (name) DO UPDATE SET until = excluded.until, standby = true,
                channel = excluded.channel
            RETURNING 1"""

HAND_OFF_POSTGRESQL = """
        WITH picked AS (
            UPDATE tasks_app_drainer SET standby = false
            WHERE name = (
                SELECT name FROM tasks_app_drainer
                WHERE standby AND until > statement_timestamp()
                LIMIT 1 FOR UPDATE SKIP LOCKED
            )
            RETURNING channel
        ), notified AS (
            SELECT pg_notify(channel, %(payload)s) FROM picked
        )
        SELECT (SELECT count(*) FROM notified) > 0,
            EXISTS (SELECT 1 FROM tasks_app_drainer WHERE until > statement_timestamp())
        """

DRAINED_SQLITE = f"SELECT EXISTS (SELECT 1 FROM tasks_app_drainer WHERE until > {SQLITE_NOW})"
DRAINED_POSTGRESQL = (
    f"SELECT EXISTS (SELECT 1 FROM tasks_app_drainer WHERE until > {POSTGRESQL_NOW})"
)

WITHDRAW = "DELETE FROM tasks_app_drainer WHERE name = %(name)s"

# OLDER_THAN is negative: seconds before the database's time.
FORGET_SQLITE = f"DELETE FROM tasks_app_drainer WHERE until < {sqlite_later('older_than')}"
FORGET_POSTGRESQL = f"DELETE FROM tasks_app_drainer WHERE until < {postgresql_later('older_than')}"

# --- both ---------------------------------------------------------------------------------


def withdraw(drainer: str) -> None:
    """Delete DRAINER's row: that process takes no more records without a message."""
    prepared.execute(WITHDRAW, {"name": drainer})


# --- SQLite -------------------------------------------------------------------------------


def drained_sqlite() -> bool:
    _, found = prepared.execute(DRAINED_SQLITE, {})
    return bool(found[0][0])


def stand_by_sqlite(drainer: str, *, channel: str, seconds: float) -> None:
    raise NotImplementedError("standing by needs PostgreSQL's LISTEN/NOTIFY")


def hand_off_sqlite(payload: str) -> tuple[bool, bool]:
    # Nobody stands by without LISTEN/NOTIFY: only whether some drainer is fresh.
    return False, drained_sqlite()


def forget_drainers_sqlite(*, older_than: float) -> int:
    changed, _ = prepared.execute(FORGET_SQLITE, {"older_than": -float(older_than)})
    return changed


# --- PostgreSQL ---------------------------------------------------------------------------


def drained_postgresql() -> bool:
    row = prepared.fetch_prepared(DRAINED_POSTGRESQL, {})
    return bool(row and row[0])


def stand_by_postgresql(drainer: str, *, channel: str, seconds: float) -> None:
    prepared.fetch_prepared(
        STAND_BY_POSTGRESQL, {"name": drainer, "seconds": float(seconds), "channel": channel}
    )


def hand_off_postgresql(payload: str) -> tuple[bool, bool]:
    row = prepared.fetch_prepared(HAND_OFF_POSTGRESQL, {"payload": payload})
    assert row is not None
    return bool(row[0]), bool(row[1])


def forget_drainers_postgresql(*, older_than: float) -> int:
    changed, _ = prepared.execute(FORGET_POSTGRESQL, {"older_than": -float(older_than)})
    return changed
