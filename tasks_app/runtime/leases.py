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
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from functools import cache

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from tasks_app import dispatch
from tasks_app.models import Actor, Dispatch, JournalEntry, Status, Task, event

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
    a live lease.
    """
    now = timezone.now()
    ops = connection.ops
    with transaction.atomic(), connection.cursor() as cursor:
        if dispatch_id is not None:
            # Consumed even when the claim below fails: a record whose message found the task
            # busy or finished has been answered, and must not look lost to the sweeper.
            cursor.execute(
                _sql().consume, [ops.adapt_datetimefield_value(now), dispatch_id, task_id]
            )
            if cursor.rowcount != 1:
                return None
        expires = now + _lease_length()
        cursor.execute(
            _sql().claim,
            [
                owner,
                ops.adapt_datetimefield_value(expires),
                ops.adapt_datetimefield_value(now),
                task_id,
                Status.WORKING.value,
                ops.adapt_datetimefield_value(now),
            ],
        )
        row = cursor.fetchone()
        if row is None:
            return None
        tool_name, arguments, leg, client_id, has_journal = row
        task = Task(
            pk=task_id,
            client_id=client_id,
            tool_name=tool_name,
            arguments=_ARGUMENTS.from_db_value(arguments, None, connection),
            status=Status.WORKING,
            leg=leg,
            lease_owner=owner,
            lease_expires_at=expires,
        )
        event(task, "leg_started", actor_type=Actor.WORKER, actor=owner, leg=leg,
              dispatch=dispatch_id)  # fmt: skip
    return Claim(task=task, has_journal=bool(has_journal))


_ARGUMENTS = Task._meta.get_field("arguments")


@dataclass(frozen=True)
class _Statements:
    consume: str
    claim: str


@cache
def _sql() -> _Statements:
    # Every leg runs these two, so they are single statements rather than ORM round trips:
    # the claim is one compare-and-set UPDATE that also returns what the leg needs (both
    # PostgreSQL and SQLite >= 3.35 support RETURNING, with a subquery).
    q = connection.ops.quote_name
    task, journal = q(Task._meta.db_table), q(JournalEntry._meta.db_table)
    consume = (
        f"UPDATE {q(Dispatch._meta.db_table)} SET consumed_at = %s "
        "WHERE id = %s AND task_id = %s AND consumed_at IS NULL"
    )
    claim = (
        f"UPDATE {task} SET lease_owner = %s, lease_expires_at = %s, leg = leg + 1, "
        "updated_at = %s WHERE id = %s AND status = %s "
        "AND (lease_owner = '' OR lease_expires_at < %s) "
        f"RETURNING tool_name, arguments, leg, client_id, "
        f"EXISTS (SELECT 1 FROM {journal} j WHERE j.task_id = {task}.id)"
    )
    return _Statements(consume=consume, claim=claim)


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
        Task.objects.filter(pk=task_id, lease_owner=owner, status=Status.WORKING).update(
            lease_expires_at=timezone.now() + _lease_length()
        )
    )


class Lease:
    """The lease a running leg holds; ``lost`` is set once another leg took the task over."""

    def __init__(self, task_id: str, owner: str) -> None:
        self.task_id = task_id
        self.owner = owner
        self.lost = threading.Event()
        self._stop = threading.Event()

    def _beat(self) -> None:
        # A third of the lease between renewals: two renewals may fail (a slow database)
        # before the lease runs out.
        interval = max(settings.TASKDESK_LEASE_SECONDS / 3, 0.2)
        try:
            while not self._stop.wait(interval):
                try:
                    renewed = renew(self.task_id, self.owner)
                except DatabaseError as exc:
                    log.warning("lease renewal failed task=%s error=%s", self.task_id, exc)
                    continue
                if not renewed:
                    log.warning("lease lost task=%s owner=%s", self.task_id, self.owner)
                    self.lost.set()
                    return
        finally:
            connection.close()  # this thread's own connection


@contextmanager
def held(task_id: str, owner: str) -> Iterator[Lease]:
    """Renew the lease from a background thread for as long as the block runs."""
    lease = Lease(task_id, owner)
    thread = threading.Thread(target=lease._beat, name=f"lease-{task_id[:12]}", daemon=True)
    thread.start()
    try:
        yield lease
    finally:
        lease._stop.set()
        thread.join(timeout=5)


# --- the sweeper ------------------------------------------------------------------------


def redispatch_expired_leases(*, limit: int = 500) -> int:
    """Dispatch a new leg for every working task whose leg stopped renewing its lease (a
    killed worker). Return how many tasks were re-dispatched.

    (Messages lost before any leg received them are the dispatch sweeper's: their records
    stay unconsumed and ``dispatch.publish_pending`` publishes them again.)
    """
    now = timezone.now()
    stale = list(
        Task.objects.filter(status=Status.WORKING, lease_expires_at__lt=now)
        .order_by("lease_expires_at")
        .values_list("pk", "lease_owner", "leg")[:limit]
    )
    revived = 0
    for task_id, owner, leg in stale:
        with transaction.atomic():
            # Compare-and-set on the same owner: a leg that renewed in the meantime keeps it.
            taken = Task.objects.filter(
                pk=task_id, status=Status.WORKING, lease_owner=owner, lease_expires_at__lt=now
            ).update(lease_owner="", lease_expires_at=None, updated_at=now)
            if not taken:
                continue
            task = Task(pk=task_id)
            event(task, "lease_expired", actor_type=Actor.SYSTEM, owner=owner, leg=leg)
            dispatch.enqueue(task, reason="lease_expired")
        log.info("lease expired task=%s leg=%s owner=%s: dispatched a new leg", task_id, leg, owner)
        revived += 1
    return revived
