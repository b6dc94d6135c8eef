"""Getting "run this task now" to a worker without ever losing it.

The caller's transaction writes a ``Dispatch`` row; after commit the row is published by job
name (``send_task``), so neither ``transitions`` nor ``acceptance`` imports the Celery jobs.
Whatever was not published (broker down, process killed between commit and publish) is
published by the periodic sweeper, and so is a record whose message was published but never
consumed (a broker that lost it). Duplicated messages are harmless: the leg that consumes a
record marks it, and a leg takes a lease.

The message is sent right after commit, on the committing thread: one broker round trip, so a
leg can start as soon as a worker takes the message. Marking records published is not urgent
(the sweeper only looks at records older than a grace period), so a small per-process thread
marks them in one UPDATE a few times a second. When the broker fails, the process stops
trying for a moment and leaves its records to the sweeper: a dead broker costs one failed
connection attempt per pause, not one per receipt.

A new task's record needs no message while a worker process is draining the table
(``models.Drainer``, ``runtime.draining``): after commit, ``publish_on_commit`` with
``unless_drained`` hands the record to a drainer standing by (LISTEN/NOTIFY, PostgreSQL) or
leaves it to a fresh one that is busy (``db.backend().hand_off``, one statement). This is safe
because a drainer only stops after deleting its row and then looking once more: a record
committed before its row was read is seen by that last look. What a drainer cannot take is
handed on: at the end of its time it sends one message if records are still waiting
(``wake``), one whose record waited long asks for help (``wake`` again, any idle worker
answers), and one whose leg runs past its window publishes what was left to it
(``publish_left_behind``). The sweeper publishes unpublished records only while no drainer
is fresh, so a killed drainer's records go out after the grace period.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connections,
    transaction,
)
from django.db.models import F, Q
from django.utils import timezone

from tasks_app import celery_app, db, tracing
from tasks_app.models import TERMINAL_STATUSES, Dispatch, Task

log = logging.getLogger(__name__)

RUN_TASK_JOB = "run_task_job"
# The reason of a record whose leg only undoes the effects of a task that was cancelled while
# nothing ran (``transitions.request_cancel``).
COMPENSATE = "compensate"

# One immediate retry, on a fresh connection (a pooled one goes stale when the broker
# restarts); if that fails too, the record is the sweeper's.
_FAST_RETRY = {"max_retries": 1, "interval_start": 0, "interval_step": 0, "interval_max": 0}
# How long a process leaves its records to the sweeper after the broker failed.
BROKER_PAUSE_SECONDS = 2.0
_BATCH_SIZE = 100
# Published records are marked (one UPDATE) at most this often.
_MARK_EVERY_SECONDS = 0.25
# An idle marker thread closes its database connection after this long.
_IDLE_SECONDS = 1.0

Pending = tuple[int, str]  # (dispatch id, task id)

# A published record no leg consumed is published again after TASKDESK_DISPATCH_REPUBLISH_SECONDS,
# then after twice that, four times... (``attempts`` counts its publications), up to this many
# doublings: under a backlog, records waiting their turn in the queue are not published again
# on every sweep.
REPUBLISH_DOUBLINGS = 5


def enqueue(task: Task, *, reason: str) -> Dispatch:
    """Record that TASK needs a leg, and publish the record once the transaction commits."""
    record = Dispatch.objects.create(
        task=task, reason=reason, tenant_id=db.tenant_of(task), context=tracing.origin()
    )
    publish_on_commit(record.pk, task.pk)
    return record


RETRY_JOB = "dispatch_retry_job"


def publish_later(task_id: str, *, seconds: float) -> None:
    """Once the current transaction commits, ask a worker to dispatch TASK_ID's next leg in
    SECONDS (a step waiting to be retried). If the broker fails or loses the message, the
    sweeper dispatches the leg once it is due (``runtime.dispatch_due_retries``)."""

    def send() -> None:
        app = celery_app()

        try:
            app.send_task(
                RETRY_JOB,
                kwargs={"task_id": task_id},
                countdown=seconds,
                retry=True,
                retry_policy=_FAST_RETRY,
            )
        except Exception as exc:  # the sweeper dispatches it when due
            log.warning("retry of task %s not scheduled on the broker: %s", task_id, exc)

    transaction.on_commit(send)


def publish_on_commit(dispatch_id: int, task_id: str, *, unless_drained: bool = False) -> None:
    """Publish record DISPATCH_ID when the current transaction commits (at once outside a
    transaction). With UNLESS_DRAINED, first look (after the commit) for a worker process
    draining the table, and leave the record to it if there is one (module docstring)."""
    trace = tracing.carrier()  # the span of the caller, whenever the commit comes
    transaction.on_commit(lambda: _publish_traced(dispatch_id, task_id, trace, unless_drained))


def _publish_traced(
    dispatch_id: int, task_id: str, trace: dict[str, str], unless_drained: bool
) -> None:
    if unless_drained and _left_to_drainers(dispatch_id, task_id):
        return  # a draining worker takes it from the table
    with tracing.continued(trace, "publish", dispatch=dispatch_id, task_id=task_id):
        _publisher.publish((dispatch_id, task_id))


def _left_to_drainers(dispatch_id: int, task_id: str) -> bool:
    """Hand the record to a drainer standing by, or leave it to one draining; False when
    there is none (the record needs its message)."""
    if settings.TASKDESK_WAITING_LEGS_SECONDS <= 0:
        return False  # no worker drains: every record gets its message
    try:
        handed, drained = db.backend().hand_off(handoff_payload(dispatch_id, task_id))
    except DatabaseError as exc:  # publishing is always safe
        log.warning("draining workers not looked up (the database: %s)", exc)
        return False
    return handed or drained


def handoff_payload(dispatch_id: int, task_id: str) -> str:
    return f"{dispatch_id} {task_id}"


def parse_handoff(payload: str) -> Pending | None:
    """The (dispatch id, task id) of a hand-off notification, None if it is not one."""
    dispatch_id, _, task_id = payload.partition(" ")
    if not dispatch_id.isdigit() or not task_id:
        return None
    return int(dispatch_id), task_id


def wake(why: str) -> bool:
    """Send one message that runs no record of its own: the worker process that takes it
    runs waiting legs (records left to drainers). Return False if the broker failed (the
    sweeper publishes what is left once no drainer is fresh)."""
    app = celery_app()

    try:
        app.send_task(RUN_TASK_JOB, kwargs={}, retry=True, retry_policy=_FAST_RETRY,
                      argsrepr="()", kwargsrepr=f"{{}} ({why})")  # fmt: skip
    except Exception as exc:  # the records stay in the table for the sweeper
        log.warning("wake-up message not sent (%s): %s", why, exc)
        return False
    log.debug("wake-up message sent (%s)", why)
    return True


def publish_left_behind(*, limit: int = 1000) -> int:
    """Publish the records that were left to draining workers and are still waiting, unless
    some drainer is still fresh (it takes them): called by a drainer whose leg ran past its
    window. Return how many went out."""
    if db.backend().drained():
        return 0
    pending = list(
        Dispatch.objects.filter(published_at__isnull=True, consumed_at__isnull=True)
        .order_by("created_at")
        .values_list("pk", "task_id")[:limit]
    )
    sent = 0
    for start in range(0, len(pending), _BATCH_SIZE):
        batch = pending[start : start + _BATCH_SIZE]
        if not publish_many(batch):
            break
        sent += len(batch)
    return sent


def publish(dispatch_id: int, task_id: str) -> bool:
    """Send one record to the broker now and mark it published. Return False if the broker
    failed (the record stays for the sweeper)."""
    return publish_many([(dispatch_id, task_id)]) == 1


def publish_many(records: Sequence[Pending]) -> int:
    """Send RECORDS to the broker in one batch and mark them published. Return how many were
    sent: all of them, or 0 if the broker failed (their attempts are counted)."""
    if not records or not _send_or_count_failure(records):
        return 0
    _mark_published([dispatch_id for dispatch_id, _ in records])
    return len(records)


def _send_or_count_failure(records: Sequence[Pending]) -> bool:
    try:
        _send(records)
    except Exception as exc:  # any broker/transport failure: the sweeper retries
        log.warning("%s dispatch records not published: %s", len(records), exc)
        ids = [dispatch_id for dispatch_id, _ in records]
        Dispatch.objects.filter(pk__in=ids).update(attempts=F("attempts") + 1)
        return False
    return True


def _mark_published(ids: list[int]) -> None:
    Dispatch.objects.filter(pk__in=ids).update(
        published_at=timezone.now(), attempts=F("attempts") + 1
    )


def _send(records: Sequence[Pending]) -> None:
    app = celery_app()

    # A batch (one pipelined round trip for many records) costs a Redis client of its own;
    # a receipt's single record goes out without one.
    with (
        app.producer_or_acquire() as producer,
        producer.batch() if len(records) > 1 else contextlib.nullcontext(),
    ):
        for dispatch_id, task_id in records:
            app.send_task(
                RUN_TASK_JOB,
                kwargs={"task_id": task_id, "dispatch_id": dispatch_id},
                producer=producer,
                retry=True,
                retry_policy=_FAST_RETRY,
                # Celery would otherwise build both with saferepr on every message.
                argsrepr="()",
                headers=tracing.carrier(),
                kwargsrepr=f"{{'task_id': {task_id!r}, 'dispatch_id': {dispatch_id}}}",
            )


def republish_due(now: datetime) -> Q:
    """Published records whose wait for a leg is over: a record published ATTEMPTS times is
    published again once TASKDESK_DISPATCH_REPUBLISH_SECONDS x 2^(ATTEMPTS - 1) have passed
    since the last time (at most 2^REPUBLISH_DOUBLINGS times that)."""
    base = settings.TASKDESK_DISPATCH_REPUBLISH_SECONDS
    due = Q()
    for doublings in range(REPUBLISH_DOUBLINGS):
        since = now - timedelta(seconds=base * 2**doublings)
        attempts = Q(attempts__lte=1) if doublings == 0 else Q(attempts=doublings + 1)
        due |= attempts & Q(published_at__lte=since)
    longest = now - timedelta(seconds=base * 2**REPUBLISH_DOUBLINGS)
    return due | Q(attempts__gt=REPUBLISH_DOUBLINGS, published_at__lte=longest)


def publish_pending(*, limit: int = 5000) -> int:
    """Publish what the sweeper must: records still unpublished after the grace period, and
    records published long ago whose message no leg consumed (the broker lost it) while
    their task is still running, with backoff (``republish_due``). Return how many records
    went out."""
    now = timezone.now()
    unpublished = Dispatch.objects.filter(
        published_at__isnull=True,
        # A record a waiting leg already consumed needs no message (its mark was lost with
        # the web process that sent it, or the broker was down when it was written).
        consumed_at__isnull=True,
        created_at__lte=now - timedelta(seconds=settings.TASKDESK_DISPATCH_GRACE_SECONDS),
    ).order_by("created_at")
    lost = (
        Dispatch.objects.filter(
            republish_due(now),
            consumed_at__isnull=True,
            published_at__lte=now - timedelta(seconds=settings.TASKDESK_DISPATCH_REPUBLISH_SECONDS),
        )
        # A finished task needs no leg, unless it is one undoing a cancelled task's effects.
        .exclude(Q(task__status__in=TERMINAL_STATUSES) & ~Q(reason=COMPENSATE))
        .order_by("published_at")
    )
    sent = 0
    # Records left to a draining worker are its to take while it is fresh.
    drained = db.backend().drained()
    for records in (lost,) if drained else (unpublished, lost):
        pending = list(records.values_list("pk", "task_id")[: limit - sent])
        for start in range(0, len(pending), _BATCH_SIZE):
            batch = pending[start : start + _BATCH_SIZE]
            if not publish_many(batch):
                return sent  # the broker is still down; the next sweep tries again
            sent += len(batch)
    return sent


class _Publisher:
    """Sends committed records on the committing thread; a daemon thread per process marks
    them published.

    Nothing is lost if the process dies before a mark: the record is committed and
    unpublished, so the sweeper publishes it again after the grace period (a duplicate
    message, which the leg ignores).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pid: int | None = None
        self._sent: list[int] = []  # published, not yet marked
        self._failed: list[int] = []  # not published: attempts to count
        self._marking = 0  # taken by the marker thread, not yet written
        self._resting = True  # the marker thread is idle and holds no database connection
        self._paused_until = 0.0

    def publish(self, record: Pending) -> None:
        if time.monotonic() < self._paused_until:
            return  # the broker failed a moment ago: the sweeper publishes it
        try:
            _send([record])
        except Exception as exc:  # any broker/transport failure: the sweeper retries
            self._paused_until = time.monotonic() + BROKER_PAUSE_SECONDS
            log.warning("dispatch record %s not published: %s", record[0], exc)
            self._hand_over(failed=record[0])
        else:
            self._hand_over(sent=record[0])

    def _hand_over(self, *, sent: int | None = None, failed: int | None = None) -> None:
        with self._cond:
            if self._pid != os.getpid():  # first use in this process (also after a fork)
                self._sent, self._failed, self._marking = [], [], 0
                threading.Thread(target=self._run, name="dispatch-marker", daemon=True).start()
                self._pid = os.getpid()
            if sent is not None:
                self._sent.append(sent)
            if failed is not None:
                self._failed.append(failed)
            self._resting = False
            self._cond.notify_all()

    def wait(self, timeout: float, *, idle: bool) -> bool:
        """Wait until every record handed over is marked (and, with IDLE, until the thread
        has closed its database connection). Return False if TIMEOUT ran out first."""
        with self._cond:
            if self._pid != os.getpid():
                return True  # never used in this process
            if idle:
                return self._cond.wait_for(lambda: self._resting, timeout)
            return self._cond.wait_for(
                lambda: not self._sent and not self._failed and not self._marking, timeout
            )

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: self._sent or self._failed, _IDLE_SECONDS):
                    self._rest_locked()
                    self._cond.wait_for(lambda: self._sent or self._failed)
                sent, self._sent = self._sent[:_BATCH_SIZE], self._sent[_BATCH_SIZE:]
                failed, self._failed = self._failed, []
                self._marking = len(sent) + len(failed)
            self._mark(sent, failed)
            with self._cond:
                self._marking = 0
                self._cond.notify_all()
            time.sleep(_MARK_EVERY_SECONDS)

    def _rest_locked(self) -> None:
        # Give the database connection back rather than hold it open while idle.
        connections.close_all()
        self._resting = True
        self._cond.notify_all()

    def _mark(self, sent: list[int], failed: list[int]) -> None:
        try:
            close_old_connections()
            if sent:
                _mark_published(sent)
            if failed:
                Dispatch.objects.filter(pk__in=failed).update(attempts=F("attempts") + 1)
        except (OperationalError, InterfaceError) as exc:  # the database is down or restarting
            # Unmarked records are published again by the sweeper: harmless, and no bug.
            log.warning(
                "marking %s dispatch records failed: database unavailable: %s",
                len(sent) + len(failed),
                str(exc).strip().splitlines()[:1],
            )
        except Exception:  # unmarked records are published again by the sweeper: harmless
            log.exception("marking %s dispatch records failed", len(sent) + len(failed))


_publisher = _Publisher()


def _after_fork_in_child() -> None:
    global _publisher
    # A lock another thread held at the fork stays held forever in the child: start afresh.
    _publisher = _Publisher()


os.register_at_fork(after_in_child=_after_fork_in_child)


def wait_for_publisher(timeout: float = 5.0, *, idle: bool = False) -> bool:
    """Wait until this process has marked every record it published (or counted the failed
    attempt); with IDLE, also until the marker thread has closed its database connection.
    Return False if TIMEOUT ran out first."""
    return _publisher.wait(timeout, idle=idle)


# A process that exits normally gives its last marks a moment to be written.
atexit.register(wait_for_publisher, 2.0)
