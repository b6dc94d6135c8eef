"""Leases: at most one live leg per task, and re-running the legs of dead workers.

A leg claims its task with one compare-and-set UPDATE (the task must be ``working`` and
either unleased or holding an expired lease), which also counts the leg. While the tool runs,
a background thread renews the lease, so a long leg keeps it and a killed one loses it within
``TASKDESK_LEASE_SECONDS``. The periodic sweeper (``redispatch_expired_leases``) takes expired
leases away and dispatches a new leg; replay of the journal makes that re-run safe.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from tasks_app import dispatch, rows
from tasks_app.models import (
    Actor,
    Dispatch,
    Effect,
    EffectState,
    JournalEntry,
    Status,
    Task,
    TaskEvent,
    event,
)

log = logging.getLogger("tasks_app.runtime")


def new_owner() -> str:
    """A lease owner name that says where the leg runs: host, process, and a unique suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def _lease_length() -> timedelta:
    return timedelta(seconds=settings.TASKDESK_LEASE_SECONDS)


@dataclass(frozen=True)
class Claim:
    """What a leg needs of its task, read in the claiming statement itself."""

    task: Task
    has_journal: bool


def claim(*, task_id: str, dispatch_id: int | None, owner: str) -> Claim | None:
    """Take the lease of TASK_ID for a new leg and record ``leg_started``.

    Return the claim, or None when this message must do nothing: its dispatch record was
    already consumed (a second delivery), the task is not ``working``, or another leg holds
    a live lease. A dispatch record is consumed even when the claim fails: its message has
    been answered, and must not look lost to the dispatch sweeper.
    """
    now = timezone.now()
    expires = now + _lease_length()
    if connection.vendor == "postgresql":
        # A single statement is atomic by itself: no transaction block, no extra round trips.
        row = _claim_postgresql(task_id, dispatch_id, owner, now, expires)
    else:
        with transaction.atomic(), connection.cursor() as cursor:
            row = _claim_portable(cursor, task_id, dispatch_id, owner, now, expires)
    if row is None:
        return None
    return _claim_from_row(task_id, owner, expires, row)


def _claim_from_row(task_id: str, owner: str, expires: datetime, row: tuple[Any, ...]) -> Claim:
    tool_name, arguments, leg, client_id, has_journal, status = row
    task = Task(
        pk=task_id,
        client_id=client_id,
        tool_name=tool_name,
        arguments=_ARGUMENTS.from_db_value(arguments, None, connection),
        status=status,
        leg=leg,
        lease_owner=owner,
        lease_expires_at=expires,
    )
    return Claim(task=task, has_journal=bool(has_journal))


def claim_next(*, owner: str) -> tuple[int, Claim | None] | None:
    """Take the oldest dispatch record no leg has consumed yet, and claim its task as
    ``claim`` does. Return None when there is no such record, else (its id, the claim or
    None when its task was not claimable: the record is consumed either way).

    A worker that has just ended a leg calls this to run the next waiting task at once,
    without a broker round trip; that task's message, when it arrives, finds its record
    consumed and does nothing.
    """
    now = timezone.now()
    expires = now + _lease_length()
    if connection.vendor == "postgresql":
        row = rows.fetch_prepared(
            _sql().claim_next_postgresql, _claim_params(owner=owner, now=now, expires=expires)
        )
        if row is None:
            return None
        dispatch_id, task_id, *claimed = row
    else:
        with transaction.atomic():
            record = (
                Dispatch.objects.filter(consumed_at__isnull=True)
                .order_by("pk")
                .values_list("pk", "task_id")
                .first()
            )
            if record is None:
                return None
            dispatch_id, task_id = record
            with connection.cursor() as cursor:
                claimed = _claim_portable(cursor, task_id, dispatch_id, owner, now, expires)
    if claimed is None or claimed[0] is None:
        return dispatch_id, None
    return dispatch_id, _claim_from_row(task_id, owner, expires, tuple(claimed))


def _claim_portable(
    cursor: CursorWrapper,
    task_id: str,
    dispatch_id: int | None,
    owner: str,
    now: datetime,
    expires: datetime,
) -> tuple[Any, ...] | None:
    at = connection.ops.adapt_datetimefield_value
    if dispatch_id is not None:
        cursor.execute(_sql().consume, [at(now), dispatch_id, task_id])
        if cursor.rowcount != 1:
            return None
    cursor.execute(
        _sql().claim, [owner, at(expires), at(now), task_id, at(now), Status.WORKING.value]
    )
    row: tuple[Any, ...] | None = cursor.fetchone()
    if row is not None:
        event(Task(pk=task_id), "leg_started", actor_type=Actor.WORKER, actor=owner, leg=row[2],
              dispatch=dispatch_id)  # fmt: skip
    return row


def _claim_postgresql(
    task_id: str,
    dispatch_id: int | None,
    owner: str,
    now: datetime,
    expires: datetime,
) -> tuple[Any, ...] | None:
    # One round trip: consume the record, claim the task and write the leg_started event,
    # as data-modifying CTEs of a single statement.
    params = _claim_params(owner=owner, now=now, expires=expires)
    return rows.fetch_prepared(
        _sql().claim_postgresql, {**params, "task": task_id, "dispatch": dispatch_id}
    )


def _claim_params(*, owner: str, now: datetime, expires: datetime) -> dict[str, Any]:
    return {
        "now": now,
        "expires": expires,
        "owner": owner,
        "working": Status.WORKING.value,
        "worker": Actor.WORKER.value,
    }


_ARGUMENTS = Task._meta.get_field("arguments")


@dataclass(frozen=True)
class _Statements:
    consume: str
    claim: str
    claim_postgresql: str
    claim_next_postgresql: str


@cache
def _sql() -> _Statements:
    # Every leg runs these, so they are single statements rather than ORM round trips: the
    # claim is one compare-and-set UPDATE that also returns what the leg needs (PostgreSQL
    # and SQLite >= 3.35 both support RETURNING, with a subquery).
    q = connection.ops.quote_name
    task, journal = q(Task._meta.db_table), q(JournalEntry._meta.db_table)
    dispatch_table, events = q(Dispatch._meta.db_table), q(TaskEvent._meta.db_table)
    effect = q(Effect._meta.db_table)
    # Working and not leased by a live leg; or cancelled while nothing ran, with effects to
    # undo (such a leg replays the journal to find their compensate hooks, then undoes them).
    claimable = (
        "(lease_owner = '' OR lease_expires_at < {now}) AND (status = {working} OR "
        f"(status = '{Status.CANCELLED.value}' AND EXISTS (SELECT 1 FROM {effect} e "
        f"WHERE e.task_id = {task}.id AND e.state = '{EffectState.CONFIRMED.value}' "
        "AND e.compensable)))"
    )
    returning = (
        "tool_name, arguments, leg, client_id, "
        f"EXISTS (SELECT 1 FROM {journal} j WHERE j.task_id = {task}.id) AS has_journal, status"
    )
    consume = (
        f"UPDATE {dispatch_table} SET consumed_at = %s "
        "WHERE id = %s AND task_id = %s AND consumed_at IS NULL"
    )
    claim = (
        f"UPDATE {task} SET lease_owner = %s, lease_expires_at = %s, leg = leg + 1, "
        f"updated_at = %s WHERE id = %s AND {claimable.format(now='%s', working='%s')} "
        f"RETURNING {returning}"
    )
    claim_postgresql = f"""
        WITH consumed AS (
            UPDATE {dispatch_table} SET consumed_at = %(now)s
            WHERE id = %(dispatch)s AND task_id = %(task)s AND consumed_at IS NULL
            RETURNING id
        ), claimed AS (
            UPDATE {task} SET lease_owner = %(owner)s, lease_expires_at = %(expires)s,
                leg = leg + 1, updated_at = %(now)s
            WHERE id = %(task)s
              AND {claimable.format(working="%(working)s", now="%(now)s")}
              AND (%(dispatch)s::bigint IS NULL OR EXISTS (SELECT 1 FROM consumed))
            RETURNING id, {returning}
        ), started AS (
            INSERT INTO {events}
                (task_id, kind, actor_type, actor, old_status, new_status, detail, created_at)
            SELECT id, 'leg_started', %(worker)s, %(owner)s, '', '',
                jsonb_build_object('leg', leg, 'dispatch', %(dispatch)s::bigint), %(now)s
            FROM claimed
        )
        SELECT tool_name, arguments, leg, client_id, has_journal, status FROM claimed
    """
    # The same, for the oldest record no leg consumed; SKIP LOCKED lets two workers doing
    # this at once take different records.
    claim_next_postgresql = f"""
        WITH next AS (
            SELECT id FROM {dispatch_table} WHERE consumed_at IS NULL
            ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED
        ), consumed AS (
            UPDATE {dispatch_table} SET consumed_at = %(now)s
            WHERE id = (SELECT id FROM next)
            RETURNING id, task_id
        ), claimed AS (
            UPDATE {task} SET lease_owner = %(owner)s, lease_expires_at = %(expires)s,
                leg = leg + 1, updated_at = %(now)s
            WHERE id = (SELECT task_id FROM consumed)
              AND {claimable.format(working="%(working)s", now="%(now)s")}
            RETURNING id, {returning}
        ), started AS (
            INSERT INTO {events}
                (task_id, kind, actor_type, actor, old_status, new_status, detail, created_at)
            SELECT claimed.id, 'leg_started', %(worker)s, %(owner)s, '', '',
                jsonb_build_object('leg', leg, 'dispatch', consumed.id), %(now)s
            FROM claimed, consumed
        )
        SELECT consumed.id, consumed.task_id,
            claimed.tool_name, claimed.arguments, claimed.leg, claimed.client_id,
            claimed.has_journal, claimed.status
        FROM consumed LEFT JOIN claimed ON true
    """
    return _Statements(
        consume=consume,
        claim=claim,
        claim_postgresql=claim_postgresql,
        claim_next_postgresql=claim_next_postgresql,
    )


def release(task_id: str, owner: str) -> bool:
    """Give up OWNER's lease (inside the caller's transaction). Return False if it was lost."""
    return bool(
        Task.objects.filter(pk=task_id, lease_owner=owner).update(
            lease_owner="", lease_expires_at=None, updated_at=timezone.now()
        )
    )


def renew(task_id: str, owner: str) -> bool:
    """Push OWNER's lease expiry forward. Return False if the lease is no longer OWNER's."""
    return bool(
        Task.objects.filter(
            pk=task_id, lease_owner=owner, status__in=[Status.WORKING, Status.CANCELLED]
        ).update(lease_expires_at=timezone.now() + _lease_length())
    )


class Lease:
    """The lease a running leg holds; ``lost`` is set once another leg took the task over."""

    def __init__(self, task_id: str, owner: str) -> None:
        self.task_id = task_id
        self.owner = owner
        self.lost = threading.Event()
        self.due = time.monotonic() + _renew_interval()


def _renew_interval() -> float:
    # A third of the lease between renewals: two renewals may fail (a slow database) before
    # the lease runs out.
    return max(settings.TASKDESK_LEASE_SECONDS / 3, 0.2)


class _Renewer:
    """One thread per process renews the leases of the legs running in it. (A thread per
    leg cost more than a no-op leg's own work.) Its database connection is closed whenever
    no leg is running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: dict[int, Lease] = {}
        self._thread: threading.Thread | None = None

    def add(self, lease: Lease) -> None:
        with self._lock:
            self._leases[id(lease)] = lease
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lease-renewer", daemon=True)
                self._thread.start()

    def remove(self, lease: Lease) -> None:
        with self._lock:
            self._leases.pop(id(lease), None)

    def _run(self) -> None:
        while True:
            time.sleep(min(_renew_interval() / 4, 0.5))
            with self._lock:
                due = [lease for lease in self._leases.values() if lease.due <= time.monotonic()]
            for lease in due:
                self._renew(lease)
            with self._lock:
                idle = not self._leases
            if idle:
                connection.close()  # this thread's own connection

    def _renew(self, lease: Lease) -> None:
        try:
            renewed = renew(lease.task_id, lease.owner)
        except DatabaseError as exc:
            log.warning("lease renewal failed task=%s error=%s", lease.task_id, exc)
            connection.close()
            return
        lease.due = time.monotonic() + _renew_interval()
        if not renewed:
            log.warning("lease lost task=%s owner=%s", lease.task_id, lease.owner)
            lease.lost.set()
            self.remove(lease)


_renewer = _Renewer()


def _after_fork_in_child() -> None:
    global _renewer
    _renewer = _Renewer()  # the parent's thread and lock state do not survive a fork


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextmanager
def held(task_id: str, owner: str) -> Iterator[Lease]:
    """Keep renewing the lease for as long as the block runs."""
    lease = Lease(task_id, owner)
    _renewer.add(lease)
    try:
        yield lease
    finally:
        _renewer.remove(lease)


# --- the sweeper ------------------------------------------------------------------------


def redispatch_expired_leases(*, limit: int = 500) -> int:
    """Dispatch a new leg for every task whose leg stopped renewing its lease (a killed
    worker): a working task, or a cancelled one whose leg was undoing its effects. Return
    how many tasks were re-dispatched.

    (Messages lost before any leg received them are the dispatch sweeper's: their records
    stay unconsumed and ``dispatch.publish_pending`` publishes them again.)
    """
    now = timezone.now()
    stale: list[tuple[str, str, str, int]] = []
    for status in (Status.WORKING, Status.CANCELLED):  # each query has its partial index
        stale += (
            Task.objects.filter(status=status, lease_expires_at__lt=now)
            .order_by("lease_expires_at")
            .values_list("pk", "status", "lease_owner", "leg")[: limit - len(stale)]
        )
    revived = 0
    for task_id, status, owner, leg in stale:
        with transaction.atomic():
            # Compare-and-set on the same owner: a leg that renewed in the meantime keeps it.
            taken = Task.objects.filter(
                pk=task_id, status=status, lease_owner=owner, lease_expires_at__lt=now
            ).update(lease_owner="", lease_expires_at=None, updated_at=now)
            if not taken:
                continue
            task = Task(pk=task_id)
            event(task, "lease_expired", actor_type=Actor.SYSTEM, owner=owner, leg=leg)
            reason = "lease_expired" if status == Status.WORKING else dispatch.COMPENSATE
            dispatch.enqueue(task, reason=reason)
        log.info("lease expired task=%s leg=%s owner=%s: dispatched a new leg", task_id, leg, owner)
        revived += 1
    return revived
