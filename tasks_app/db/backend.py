"""The hot-path operations as one ``Backend`` protocol, implemented twice: ``SQLite`` (any
database Django supports; SQLite in practice) and ``PostgreSQL``. ``backend()`` chooses, once,
for this process's database; no other module asks which database it runs on.

Neither implementation derives from the other. Each operation is a plain function of the
module of its concern (``accepting``, ``claiming``, ``drainers``, ``ending``, ``reads``),
named after its backend where the backends differ and shared where they do not; the classes
only name which function is which operation, so a call costs no more than the function's.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import cache
from typing import Any, Protocol

from django.db import DEFAULT_DB_ALIAS, connections

from tasks_app.db import accepting, claiming, drainers, ending, reads
from tasks_app.db.results import Accepted, Claim, Ended, Ending, Existing, Looked
from tasks_app.models import Task, TaskOrigin


class Backend(Protocol):
    """What the hot path runs. The parity test (tests/tasks_app/db/test_parity.py) runs every
    member on both implementations."""

    # Standing by (waiting for a record handed over) needs PostgreSQL's LISTEN/NOTIFY.
    can_stand_by: bool

    # --- accepting ------------------------------------------------------------------------
    def insert_or_get(
        self,
        task: Task,
        *,
        actor: str,
        carrier: str | None,
        journal: list[dict[str, Any]],
        also: Callable[[Task], None] | None = None,
        origin: TaskOrigin | None = None,
    ) -> Accepted | Existing:
        """Insert TASK with its ``accepted`` event, its dispatch record and JOURNAL, unless
        the client's idempotency key already names a task; then return that one. ALSO writes
        what must be committed with a new task; ORIGIN (unsaved, without its task) is the new
        task's ``TaskOrigin``. Committed when it returns (never inside a caller's
        transaction)."""
        ...

    # --- claiming and leases --------------------------------------------------------------
    def claim(
        self, *, task_id: str, dispatch_id: int | None, owner: str, now: datetime,
        lease_seconds: float,
    ) -> Claim | None:  # fmt: skip
        """Consume dispatch record DISPATCH_ID (a second delivery finds it consumed and gets
        None) and take TASK_ID's lease for a new leg, until the database's time plus
        LEASE_SECONDS, writing ``leg_started``. None when the record was consumed already or
        the task is not claimable. NOW (the worker's time) only stamps the rows."""
        ...

    def claim_next(
        self, *, owner: str, now: datetime, lease_seconds: float, drainer: str | None = None,
        window: float = 0.0, floor: int = 0, standby: float = 0.0, channel: str = "",
    ) -> Looked:  # fmt: skip
        """Consume the next dispatch record no leg consumed (fair across tenants) and claim
        its task as ``claim`` does; ``taken`` is None when there is no such record. With
        DRAINER, first write that process's ``Drainer`` row: it looks for the next record
        within WINDOW seconds of the database's time (whether or not one was found here).
        FLOOR: look only at records from that id up (a hint PostgreSQL uses,
        ``leases.claim_next``). STANDBY > 0 (where ``can_stand_by``): when nothing is
        waiting, the row says instead that the process stands by for STANDBY seconds on
        CHANNEL, which it LISTENs on already (``stand_by``, made in the same statement)."""
        ...

    def over_share(self, *, task_id: str, tenant_id: int, share: float) -> bool:
        """Whether the leg of TASK_ID (of tenant TENANT_ID) should give its worker back: its
        tenant holds more than SHARE of the running legs (and more than one), this is the
        one leg of that tenant chosen to go (the greatest task id, so that legs go one at a
        time), and another tenant that holds at least two legs fewer has a record waiting.
        The fair claim then gives the freed worker to the waiting tenant with the fewest
        legs; the "two fewer" keeps two tenants from trading a leg back and forth."""
        ...

    def renew(self, *, task_id: str, owner: str, leg: int, lease_seconds: float) -> bool:
        """Push the expiry of OWNER's lease (generation LEG) to the database's time plus
        LEASE_SECONDS. False if the lease is no longer OWNER's, or has already expired by the
        database's clock: a lease is never revived."""
        ...

    def lock_leased(self, *, task_id: str, owner: str, leg: int) -> Task | None:
        """Lock TASK_ID's row if OWNER still holds its lease of generation LEG, unexpired by
        the database's clock, in the caller's transaction; None if not. The writes a leg
        makes in the same transaction are then fenced: no other leg can claim the task until
        it commits."""
        ...

    def release(
        self, *, task_id: str, owner: str | None, now: datetime, leg: int | None = None
    ) -> bool:
        """Give up OWNER's lease of generation LEG (any lease when OWNER is None), in the
        caller's transaction. False if OWNER's lease was lost (or there was none)."""
        ...

    def expired_leases(self, *, status: str, limit: int) -> list[tuple[str, str, str, int]]:
        """(id, status, lease owner, leg) of tasks in STATUS whose lease expired by the
        database's clock, the longest expired first."""
        ...

    def expire_lease(self, *, task_id: str, status: str, owner: str, now: datetime) -> bool:
        """Take away OWNER's lease of TASK_ID if it expired by the database's clock
        (compare-and-set: a leg that renewed in the meantime keeps it). In the caller's
        transaction."""
        ...

    # --- draining -------------------------------------------------------------------------
    def drained(self) -> bool:
        """Whether some process's ``Drainer`` row is fresh by the database's clock: it will
        take a record committed now from the table, without a message."""
        ...

    def stand_by(self, drainer: str, *, channel: str, seconds: float) -> None:
        """Mark DRAINER as standing by until the database's time plus SECONDS, listening on
        CHANNEL (the caller LISTENs on it first). Only where ``can_stand_by``."""
        ...

    def hand_off(self, payload: str) -> tuple[bool, bool]:
        """Hand a new record (PAYLOAD: "dispatch_id task_id") to a drainer standing by, if
        one is; return (handed over, some drainer is fresh). Without standing by, only the
        second."""
        ...

    def withdraw(self, drainer: str) -> None:
        """Delete DRAINER's row: that process takes no more records without a message."""
        ...

    def forget_drainers(self, *, older_than: float) -> int:
        """Delete the rows of drainers stale for OLDER_THAN seconds (killed processes)."""
        ...

    # --- a leg's end ----------------------------------------------------------------------
    def end_leased(self, ending: Ending) -> Ended | None:
        """End leased, working task ENDING.task_id in ENDING.status: write its fields, clear
        the lease, write the event and close its pending questions. None, having written
        nothing, if ENDING.owner no longer holds the lease (generation ENDING.leg, unexpired
        by the database's clock) of a working task."""
        ...

    # --- reads ----------------------------------------------------------------------------
    def task_for_client(self, client_id: int, task_id: str) -> Task | None:
        """Client CLIENT_ID's task TASK_ID, or None."""
        ...


class SQLite:
    """Each operation as a short sequence of statements in a transaction (SQLite's IMMEDIATE
    transactions serialize writers)."""

    can_stand_by = False
    insert_or_get = staticmethod(accepting.insert_or_get_sqlite)
    claim = staticmethod(claiming.claim_sqlite)
    claim_next = staticmethod(claiming.claim_next_sqlite)
    over_share = staticmethod(claiming.over_share_sqlite)
    renew = staticmethod(claiming.renew_sqlite)
    lock_leased = staticmethod(claiming.lock_leased_sqlite)
    release = staticmethod(claiming.release)
    expired_leases = staticmethod(claiming.expired_leases_sqlite)
    expire_lease = staticmethod(claiming.expire_lease_sqlite)
    drained = staticmethod(drainers.drained_sqlite)
    stand_by = staticmethod(drainers.stand_by_sqlite)
    hand_off = staticmethod(drainers.hand_off_sqlite)
    withdraw = staticmethod(drainers.withdraw)
    forget_drainers = staticmethod(drainers.forget_drainers_sqlite)
    end_leased = staticmethod(ending.end_leased_sqlite)
    task_for_client = staticmethod(reads.task_for_client_sqlite)


class PostgreSQL:
    """Each hot-path operation one statement (data-modifying CTEs), atomic by itself and so
    run outside any transaction block, in one round trip, and prepared on the server
    (``prepared.fetch_prepared``). They use what only PostgreSQL has: ``ON CONFLICT ... DO
    NOTHING`` with a partial unique index, ``FOR UPDATE SKIP LOCKED``, data-modifying CTEs,
    ``jsonb`` and LISTEN/NOTIFY. The operations a leg makes in its own transaction (renew,
    lock, release, expiry) run on Django's cursor."""

    can_stand_by = True
    insert_or_get = staticmethod(accepting.insert_or_get_postgresql)
    claim = staticmethod(claiming.claim_postgresql)
    claim_next = staticmethod(claiming.claim_next_postgresql)
    over_share = staticmethod(claiming.over_share_postgresql)
    renew = staticmethod(claiming.renew_postgresql)
    lock_leased = staticmethod(claiming.lock_leased_postgresql)
    release = staticmethod(claiming.release)
    expired_leases = staticmethod(claiming.expired_leases_postgresql)
    expire_lease = staticmethod(claiming.expire_lease_postgresql)
    drained = staticmethod(drainers.drained_postgresql)
    stand_by = staticmethod(drainers.stand_by_postgresql)
    hand_off = staticmethod(drainers.hand_off_postgresql)
    withdraw = staticmethod(drainers.withdraw)
    forget_drainers = staticmethod(drainers.forget_drainers_postgresql)
    end_leased = staticmethod(ending.end_leased_postgresql)
    task_for_client = staticmethod(reads.task_for_client_postgresql)


@cache
def backend() -> Backend:
    """The ``Backend`` for this process's database: the one place that asks which it is."""
    if connections[DEFAULT_DB_ALIAS].vendor == "postgresql":
        return PostgreSQL()
    return SQLite()


# Both implement the protocol (checked by mypy).
_IMPLEMENTATIONS: tuple[type[Backend], ...] = (SQLite, PostgreSQL)
