"""Leases: at most one live leg per task, and re-running the legs of dead workers.

The statements that write the lease columns are in ``tasks_app.sql``; this module decides
when to run them. A leg claims its task with one compare-and-set UPDATE (the task must be
``working`` and either unleased or holding an expired lease), which also counts the leg. While the tool runs,
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
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from tasks_app import dispatch, sql
from tasks_app.models import Actor, EventKind, Status, Task, event

log = logging.getLogger("tasks_app.runtime")


def new_owner() -> str:
    """A lease owner name that says where the leg runs: host, process, and a unique suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def _lease_length() -> timedelta:
    return timedelta(seconds=settings.TASKDESK_LEASE_SECONDS)


def claim(*, task_id: str, dispatch_id: int | None, owner: str) -> sql.Claim | None:
    """Take the lease of TASK_ID for a new leg and record ``leg_started``.

    Return the claim, or None when this message must do nothing: its dispatch record was
    already consumed (a second delivery), the task is not ``working``, or another leg holds
    a live lease. A dispatch record is consumed even when the claim fails: its message has
    been answered, and must not look lost to the dispatch sweeper.
    """
    now = timezone.now()
    expires = now + _lease_length()
    return sql.hot_path().claim(
        task_id=task_id, dispatch_id=dispatch_id, owner=owner, now=now, expires=expires
    )


def claim_next(*, owner: str) -> tuple[int, sql.Claim | None] | None:
    """Take the oldest dispatch record no leg has consumed yet, and claim its task as
    ``claim`` does. Return None when there is no such record, else (its id, the claim or
    None when its task was not claimable: the record is consumed either way).

    A worker that has just ended a leg calls this to run the next waiting task at once,
    without a broker round trip; that task's message, when it arrives, finds its record
    consumed and does nothing.
    """
    now = timezone.now()
    expires = now + _lease_length()
    return sql.hot_path().claim_next(owner=owner, now=now, expires=expires)


def release(task_id: str, owner: str) -> bool:
    """Give up OWNER's lease (inside the caller's transaction). Return False if it was lost."""
    return sql.hot_path().release(task_id=task_id, owner=owner, now=timezone.now())


def renew(task_id: str, owner: str) -> bool:
    """Push OWNER's lease expiry forward. Return False if the lease is no longer OWNER's."""
    return sql.hot_path().renew(
        task_id=task_id, owner=owner, expires=timezone.now() + _lease_length()
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
    for state in (Status.WORKING, Status.CANCELLED):  # each query has its partial index
        stale += (
            Task.objects.filter(status=state, lease_expires_at__lt=now)
            .order_by("lease_expires_at")
            .values_list("pk", "status", "lease_owner", "leg")[: limit - len(stale)]
        )
    revived = 0
    for task_id, status, owner, leg in stale:
        with transaction.atomic():
            # Compare-and-set on the same owner: a leg that renewed in the meantime keeps it.
            if not sql.hot_path().expire_lease(task_id=task_id, status=status, owner=owner,
                                               now=now):  # fmt: skip
                continue
            task = Task(pk=task_id)
            event(task, EventKind.LEASE_EXPIRED, actor_type=Actor.SYSTEM, owner=owner, leg=leg)
            reason = "lease_expired" if status == Status.WORKING else dispatch.COMPENSATE
            dispatch.enqueue(task, reason=reason)
        log.info("lease expired task=%s leg=%s owner=%s: dispatched a new leg", task_id, leg, owner)
        revived += 1
    return revived
