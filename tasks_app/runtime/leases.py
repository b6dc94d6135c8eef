"""Leases: at most one live leg per task, and re-running the legs of dead workers.

The statements that write the lease columns are in ``tasks_app.db``; this module decides
when to run them. A leg claims its task with one compare-and-set UPDATE (the task must be
``working`` and either unleased or holding an expired lease), which also bumps ``leg``, the
lease generation: the leg's fencing token. While the tool runs, a background thread renews
the lease, so a long leg keeps it and a killed one loses it within
``TASKDESK_LEASE_SECONDS``. The periodic sweeper (``redispatch_expired_leases``) takes expired
leases away and dispatches a new leg; replay of the journal makes that re-run safe.

Every expiry is set and compared on the database's clock, never this process's. Every write
a leg makes checks its fence (owner, generation, unexpired) in the same statement or
transaction (``db.Backend.lock_leased``), so a leg frozen past its lease changes nothing when
it wakes.
The renewer measures, on this process's monotonic clock, how long it has gone without a
successful renewal; a leg it could not renew before its lease would have run out is told to
stop (``Lease.lost``) even while the database cannot be reached.
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

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from tasks_app import db, dispatch
from tasks_app.models import Actor, Dispatch, EventKind, Status, Task, event

log = logging.getLogger("tasks_app.runtime")


def new_owner() -> str:
    """A lease owner name that says where the leg runs: host, process, and a unique suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def _lease_seconds() -> float:
    return float(settings.TASKDESK_LEASE_SECONDS)


def claim(*, task_id: str, dispatch_id: int | None, owner: str) -> db.Claim | None:
    """Take the lease of TASK_ID for a new leg and record ``leg_started``.

    Return the claim, or None when this message must do nothing: its dispatch record was
    already consumed (a second delivery), the task is not ``working``, or another leg holds
    a live lease. A dispatch record is consumed even when the claim fails: its message has
    been answered, and must not look lost to the dispatch sweeper.
    """
    return db.backend().claim(
        task_id=task_id,
        dispatch_id=dispatch_id,
        owner=owner,
        now=timezone.now(),
        lease_seconds=_lease_seconds(),
    )


def claim_next(*, owner: str, drainer: str | None = None, thorough: bool = False) -> db.Next | None:
    """Take the oldest dispatch record no leg has consumed yet, and claim its task as
    ``claim`` does. Return None when there is no such record, else the record and the claim
    (None when its task was not claimable: the record is consumed either way).

    A worker that has just ended a leg calls this to run the next waiting task at once,
    without a broker round trip; that task's message, if one was sent, finds its record
    consumed and does nothing. With DRAINER (this process's name), the same statement
    refreshes the process's ``Drainer`` row for ``TASKDESK_DRAIN_WINDOW_SECONDS``.

    Where the look starts is ``_Floor``'s: THOROUGH looks leave nothing behind but records
    committed since the last full look under older ids.
    """
    return look(owner=owner, drainer=drainer, thorough=thorough).taken


def look(
    *,
    owner: str,
    drainer: str | None = None,
    thorough: bool = False,
    standby: float = 0.0,
    channel: str = "",
) -> db.Looked:
    """``claim_next``, saying also whether the look marked DRAINER standing by: with
    STANDBY > 0, a look that finds nothing marks it for STANDBY seconds on CHANNEL in the
    same statement (PostgreSQL; the caller LISTENs on CHANNEL first)."""
    floor = _floor.take(thorough)
    looked = db.backend().claim_next(
        owner=owner,
        now=timezone.now(),
        lease_seconds=_lease_seconds(),
        drainer=drainer,
        window=settings.TASKDESK_DRAIN_WINDOW_SECONDS,
        floor=floor,
        standby=standby,
        channel=channel,
    )
    _floor.saw(floor, looked)
    return looked


@contextmanager
def look_after_end(
    task_id: str, *, drainer: str, deadline: float, channel: str = "", min_standby: float = 0.0
) -> Iterator[db.LookAfterEnd]:
    """While the leg of TASK_ID runs, have the statement that ends it also look for the next
    waiting record as ``claim_next(drainer=DRAINER)`` would (PostgreSQL), unless the leg ends
    after DEADLINE (monotonic). The look's ``looked`` is what it found, or None when no such
    statement ran (the leg suspended, failed to end, or ended some other way): then look with
    ``claim_next``. With CHANNEL, a look that finds nothing marks DRAINER standing by on it
    until DEADLINE, if at least MIN_STANDBY seconds are left (as ``look`` does)."""
    after_end = db.LookAfterEnd(
        task_id=task_id,
        owner=new_owner(),
        drainer=drainer,
        window=settings.TASKDESK_DRAIN_WINDOW_SECONDS,
        lease_seconds=_lease_seconds(),
        floor=_floor.take(False),
        deadline=deadline,
        channel=channel,
        min_standby=min_standby,
    )
    token = db.look_after_end.set(after_end)
    try:
        yield after_end
    finally:
        db.look_after_end.reset(token)
        if after_end.looked is not None:
            _floor.saw(after_end.floor, after_end.looked)


class _Floor:
    """Where this process's look for the next dispatch record starts (PostgreSQL).

    A look walks the waiting index from its start, which fills with the entries of consumed
    records until the table is vacuumed (80 pages after 50,000 tasks with autovacuum off),
    so it starts at an id below which nothing was waiting:

    - a look starts at ``hint``: the oldest record waiting at the last look, or, when nothing
      was, past the newest record then;
    - a thorough look (before a drainer stops) starts at ``low``, what a full look found;
    - a full look starts at the beginning, at least every ``FULL_EVERY`` seconds.

    Only a record whose transaction committed after a look, under an id lower than that
    look's bound, is passed over: the next thorough look takes it if it is above ``low``,
    the next full look in any case.
    """

    FULL_EVERY = 5.0

    def __init__(self) -> None:
        self.hint = 0
        self.low = 0
        self.full_at = float("-inf")

    def take(self, thorough: bool) -> int:
        if time.monotonic() - self.full_at > self.FULL_EVERY:
            return 0
        return self.low if thorough else self.hint

    def saw(self, floor: int, looked: db.Looked) -> None:
        if looked.oldest is not None:
            bound = looked.oldest
        elif looked.newest is not None:
            bound = looked.newest + 1
        else:  # no hint from this database (SQLite)
            return
        self.hint = bound
        if floor == 0:
            self.low, self.full_at = bound, time.monotonic()


_floor = _Floor()


def forget_stale_drainers() -> int:
    """Delete the drainer rows of processes gone for a minute (killed while draining)."""
    return db.backend().forget_drainers(older_than=60.0)


def waiting() -> bool:
    """Whether any dispatch record is waiting for a leg (not consumed yet)."""
    return Dispatch.objects.filter(consumed_at__isnull=True).exists()


def over_share(task_id: str, tenant_id: int | None) -> bool:
    """Whether the leg of TASK_ID should give its worker to another tenant's waiting task
    (``TASKDESK_TENANT_LEG_SHARE``; ``db.Backend.over_share``). Never for a task of no
    tenant, nor with the share at 1 (off)."""
    share = float(settings.TASKDESK_TENANT_LEG_SHARE)
    if tenant_id is None or share >= 1:
        return False
    return db.backend().over_share(task_id=task_id, tenant_id=tenant_id, share=share)


def release(task_id: str, owner: str, leg: int) -> bool:
    """Give up OWNER's lease of generation LEG (inside the caller's transaction, which has
    checked the fence with ``lock``). Return False if it was lost."""
    return db.backend().release(task_id=task_id, owner=owner, leg=leg, now=timezone.now())


def lock(task_id: str, owner: str, leg: int) -> Task | None:
    """Lock the task row if OWNER's lease of generation LEG is still live by the database's
    clock (inside the caller's transaction); None if the lease is lost."""
    return db.backend().lock_leased(task_id=task_id, owner=owner, leg=leg)


def renew(task_id: str, owner: str, leg: int) -> bool:
    """Push OWNER's lease expiry forward. Return False if the lease is no longer OWNER's or
    has already expired by the database's clock."""
    return db.backend().renew(task_id=task_id, owner=owner, leg=leg, lease_seconds=_lease_seconds())


class Lease:
    """The lease a running leg holds; ``lost`` is set once the leg must stop: another leg
    took the task over, or the renewer could not renew it before it ran out."""

    def __init__(
        self, task_id: str, owner: str, leg: int, since: float, *, drained: bool = False
    ) -> None:
        self.task_id = task_id
        self.owner = owner
        self.leg = leg
        self.lost = threading.Event()
        self.due = time.monotonic() + _renew_interval()
        # When the lease runs out at the earliest, on this process's monotonic clock: the
        # database set its expiry one lease length after it received the claim (or the last
        # renewal), which was after SINCE, when the statement was sent.
        self.runs_out = since + _lease_seconds()
        # A leg a drainer took (``runtime.draining``): once it outlasts the drainer's
        # window, records left to this process go out as messages (``dispatch``).
        self.lapses_at = (
            since + settings.TASKDESK_DRAIN_WINDOW_SECONDS + _LAPSE_MARGIN if drained else None
        )


# How long after its window a drainer's leg counts as having outlasted it: the database's
# clock and this process's differ by the round trip of the claim.
_LAPSE_MARGIN = 0.05


def _renew_interval() -> float:
    # A third of the lease between renewals: two renewals may fail (a slow database) before
    # the lease runs out.
    return max(settings.TASKDESK_LEASE_SECONDS / 3, 0.2)


# How often the renewer looks at its legs, at most: a drainer's leg that outlasts its window
# hands its records on within this long.
_LAPSE_TICK = 0.25


class _Renewer:
    """One thread per process renews the leases of the legs running in it. (A thread per
    leg cost more than a no-op leg's own work.) It ends, closing its database connection,
    at the first tick with no leg running; the next leg starts another (at most one a tick)."""

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
            time.sleep(min(_renew_interval() / 4, _LAPSE_TICK))
            now = time.monotonic()
            with self._lock:
                due = [lease for lease in self._leases.values() if lease.due <= now]
                lapsed = [
                    lease
                    for lease in self._leases.values()
                    if lease.lapses_at is not None and lease.lapses_at <= now
                ]
                for lease in lapsed:
                    lease.lapses_at = None
            for lease in due:
                self._renew(lease)
            if lapsed:
                self._hand_on(lapsed[0])
            with self._lock:
                if not self._leases:  # decided under the lock: add() starts the next one
                    self._thread = None
                    break
        connection.close()  # this thread's own connection

    def _renew(self, lease: Lease) -> None:
        sent = time.monotonic()
        if sent >= lease.runs_out:
            self._give_up(lease, "it could not be renewed before it ran out")
            return
        try:
            renewed = renew(lease.task_id, lease.owner, lease.leg)
        except DatabaseError as exc:
            log.warning("lease renewal failed task=%s error=%s", lease.task_id, exc)
            connection.close()
            if time.monotonic() >= lease.runs_out:
                self._give_up(lease, "it could not be renewed before it ran out")
            else:
                lease.due = time.monotonic() + min(_renew_interval(), 0.5)
            return
        lease.due = time.monotonic() + _renew_interval()
        if renewed:
            lease.runs_out = sent + _lease_seconds()
        if not renewed:
            self._give_up(lease, "another leg holds it, or it expired")

    def _hand_on(self, lease: Lease) -> None:
        """A drainer's leg outlasted its window: publish the records left to this process
        (unless another drainer is fresh and takes them)."""
        try:
            sent = dispatch.publish_left_behind()
        except DatabaseError as exc:  # the sweeper publishes them once no drainer is fresh
            log.warning("records left to a draining leg not published: %s", exc)
            connection.close()
            return
        if sent:
            log.info("leg of task=%s outlasted its drain window: %s records published",
                     lease.task_id, sent)  # fmt: skip

    def _give_up(self, lease: Lease, why: str) -> None:
        log.warning(
            "lease lost task=%s leg=%s owner=%s: %s", lease.task_id, lease.leg, lease.owner, why
        )
        lease.lost.set()
        self.remove(lease)


_renewer = _Renewer()


def _after_fork_in_child() -> None:
    global _renewer
    _renewer = _Renewer()  # the parent's thread and lock state do not survive a fork


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextmanager
def held(
    task_id: str, owner: str, leg: int, *, since: float, drained: bool = False
) -> Iterator[Lease]:
    """Keep renewing the lease for as long as the block runs (its claim was sent at
    monotonic time SINCE; DRAINED: by a drainer, see ``Lease.lapses_at``)."""
    lease = Lease(task_id, owner, leg, since, drained=drained)
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
        stale += db.backend().expired_leases(status=state, limit=limit - len(stale))
    revived = 0
    for task_id, status, owner, leg in stale:
        with transaction.atomic():
            # Compare-and-set on the same owner: a leg that renewed in the meantime keeps it.
            if not db.backend().expire_lease(task_id=task_id, status=status, owner=owner,
                                               now=now):  # fmt: skip
                continue
            task = Task(id=task_id)
            event(task, EventKind.LEASE_EXPIRED, actor_type=Actor.SYSTEM, owner=owner, leg=leg)
            reason = "lease_expired" if status == Status.WORKING else dispatch.COMPENSATE
            dispatch.enqueue(task, reason=reason)
        log.info("lease expired task=%s leg=%s owner=%s: dispatched a new leg", task_id, leg, owner)
        revived += 1
    return revived
