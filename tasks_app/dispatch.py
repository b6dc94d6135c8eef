"""Getting "run this task now" to a worker without ever losing it.

The caller's transaction writes a ``Dispatch`` row; after commit the row is published by job
name (``send_task``), so neither ``transitions`` nor ``acceptance`` imports the Celery jobs.
Whatever was not published (broker down, process killed between commit and publish) is
published by the periodic sweeper, and so is a record whose message was published but never
consumed (a broker that lost it). Duplicated messages are harmless: the leg that consumes a
record marks it, and a leg takes a lease.

After commit, records go to a small per-process publisher thread instead of being sent on the
request path: a receipt never waits for the broker, however slow or down it is. Records that
arrive together share one broker round trip, and are marked published in one UPDATE.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections, connections, transaction
from django.db.models import F
from django.utils import timezone

from tasks_app.models import TERMINAL_STATUSES, Dispatch, Task

log = logging.getLogger(__name__)

RUN_TASK_JOB = "run_task_job"

# One immediate retry, on a fresh connection (a pooled one goes stale when the broker
# restarts); if that fails too, the record is the sweeper's.
_FAST_RETRY = {"max_retries": 1, "interval_start": 0, "interval_step": 0, "interval_max": 0}
# How long the publisher thread leaves records to the sweeper after the broker failed, so a
# dead broker costs one failed connection attempt per pause rather than one per record.
BROKER_PAUSE_SECONDS = 2.0
# While records keep coming (the last batch went out less than _BUSY_SECONDS ago), the
# publisher thread waits this long after the first record of a batch, so that records
# committed by concurrent requests share one broker round trip; an idle one sends at once.
_LINGER_SECONDS = 0.01
_BUSY_SECONDS = 0.05
_BATCH_SIZE = 100
# An idle publisher thread closes its database connection after this long.
_IDLE_SECONDS = 1.0
# Published records are marked (one UPDATE) at most this often.
_MARK_EVERY_SECONDS = 0.25

Pending = tuple[int, str]  # (dispatch id, task id)


def enqueue(task: Task, *, reason: str) -> Dispatch:
    """Record that TASK needs a leg, and publish the record once the transaction commits."""
    record = Dispatch.objects.create(task=task, reason=reason)
    publish_on_commit(record.pk, task.pk)
    return record


def publish_on_commit(dispatch_id: int, task_id: str) -> None:
    """Hand record DISPATCH_ID to the publisher thread when the current transaction commits
    (at once outside a transaction)."""
    transaction.on_commit(lambda: _publisher.submit((dispatch_id, task_id)))


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
    from config.celery import app

    with app.producer_or_acquire() as producer, producer.batch():
        for dispatch_id, task_id in records:
            app.send_task(
                RUN_TASK_JOB,
                kwargs={"task_id": task_id, "dispatch_id": dispatch_id},
                producer=producer,
                retry=True,
                retry_policy=_FAST_RETRY,
                # Celery would otherwise build both with saferepr on every message.
                argsrepr="()",
                kwargsrepr=f"{{'task_id': {task_id!r}, 'dispatch_id': {dispatch_id}}}",
            )


def publish_pending(*, limit: int = 5000) -> int:
    """Publish what the sweeper must: records still unpublished after the grace period, and
    records published long ago whose message no leg consumed (the broker lost it) while
    their task is still running. Return how many records went out."""
    now = timezone.now()
    unpublished = Dispatch.objects.filter(
        published_at__isnull=True,
        created_at__lte=now - timedelta(seconds=settings.TASKDESK_DISPATCH_GRACE_SECONDS),
    ).order_by("created_at")
    lost = (
        Dispatch.objects.filter(
            consumed_at__isnull=True,
            published_at__lte=now - timedelta(seconds=settings.TASKDESK_DISPATCH_REPUBLISH_SECONDS),
        )
        .exclude(task__status__in=TERMINAL_STATUSES)
        .order_by("published_at")
    )
    sent = 0
    for records in (unpublished, lost):
        pending = list(records.values_list("pk", "task_id")[: limit - sent])
        for start in range(0, len(pending), _BATCH_SIZE):
            batch = pending[start : start + _BATCH_SIZE]
            if not publish_many(batch):
                return sent  # the broker is still down; the next sweep tries again
            sent += len(batch)
    return sent


class _Publisher:
    """A daemon thread per process that publishes committed records in small batches.

    Records are marked published in one UPDATE every ``_MARK_EVERY_SECONDS`` rather than
    after each batch: the sweeper only looks at records older than the grace period, so a
    late mark costs nothing, and at worst (the process dies first) a message is sent twice.
    Nothing is lost if the process dies with records still queued here: they are committed
    and unpublished, so the sweeper publishes them after the grace period.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Pending] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._pid: int | None = None
        self._pending = 0  # submitted, and not yet marked or left to the sweeper
        self._resting = True  # idle, holding no database connection
        self._paused_until = 0.0
        self._last_batch = 0.0

    def submit(self, record: Pending) -> None:
        with self._cond:
            if self._pid != os.getpid():  # first use in this process (also after a fork)
                self._queue, self._pending = queue.SimpleQueue(), 0
                threading.Thread(target=self._run, name="dispatch-publisher", daemon=True).start()
                self._pid = os.getpid()
            self._pending += 1
            self._resting = False
        self._queue.put(record)

    def wait(self, timeout: float, *, idle: bool) -> bool:
        """Wait until everything submitted was handled (and, with IDLE, until the thread has
        closed its database connection). Return False if TIMEOUT ran out first."""
        with self._cond:
            if self._pid != os.getpid():
                return True  # never used in this process
            done = (lambda: self._resting) if idle else (lambda: self._pending == 0)
            return self._cond.wait_for(done, timeout)

    def _run(self) -> None:
        sent: list[int] = []  # published, not yet marked
        marked_at = time.monotonic()
        while True:
            wait = _IDLE_SECONDS
            if sent:
                wait = max(0.0, marked_at + _MARK_EVERY_SECONDS - time.monotonic())
            batch = self._take_batch(timeout=wait)
            if batch:
                sent += self._publish(batch)
            if sent and (not batch or time.monotonic() - marked_at >= _MARK_EVERY_SECONDS):
                self._mark(sent)
                sent, marked_at = [], time.monotonic()
            elif not batch and not sent:
                self._rest()  # a whole idle period went by

    def _rest(self) -> None:
        # Give the database connection back rather than hold it open while idle.
        connections.close_all()
        with self._cond:
            if self._pending == 0:
                self._resting = True
                self._cond.notify_all()

    def _take_batch(self, timeout: float) -> list[Pending]:
        try:
            batch = [self._queue.get(timeout=timeout)]
        except queue.Empty:
            return []
        now = time.monotonic()
        if now - self._last_batch < _BUSY_SECONDS:
            time.sleep(_LINGER_SECONDS)
        self._last_batch = now
        while len(batch) < _BATCH_SIZE:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _publish(self, batch: list[Pending]) -> list[int]:
        """Send BATCH; return the ids sent (none when the broker failed or is paused)."""
        ids: list[int] = []
        try:
            if time.monotonic() >= self._paused_until:  # else: the sweeper's
                close_old_connections()
                if _send_or_count_failure(batch):
                    ids = [dispatch_id for dispatch_id, _ in batch]
                else:
                    self._paused_until = time.monotonic() + BROKER_PAUSE_SECONDS
        except Exception:  # the database failed: the records stay unpublished for the sweeper
            log.exception("publishing %s dispatch records failed", len(batch))
        if not ids:
            self._handled(len(batch))
        return ids

    def _mark(self, ids: list[int]) -> None:
        try:
            close_old_connections()
            _mark_published(ids)
        except Exception:  # unmarked records are published again by the sweeper: harmless
            log.exception("marking %s dispatch records published failed", len(ids))
        self._handled(len(ids))

    def _handled(self, count: int) -> None:
        with self._cond:
            self._pending -= count
            self._cond.notify_all()


_publisher = _Publisher()


def wait_for_publisher(timeout: float = 5.0, *, idle: bool = False) -> bool:
    """Wait until this process has published every record it committed (or left it to the
    sweeper); with IDLE, also until the publisher thread has closed its database connection.
    Return False if TIMEOUT ran out first."""
    return _publisher.wait(timeout, idle=idle)


# A process that exits normally gives its last records a moment to go out.
atexit.register(wait_for_publisher, 2.0)
