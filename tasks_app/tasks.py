"""Celery jobs. They take ids, re-read the database and call runtime/transitions.

Every job has an explicit name so that moving a module never strands queued messages. Legs
(``run_task_job``) go to the default queue; the control jobs (``settings.CONTROL_JOBS``:
sweeper, heartbeat, purge, and the question deadlines of ``elicitations.tasks``) to the
control queue, which the ``control`` worker process consumes.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from typing import Any

from celery import Task, shared_task
from celery.signals import task_prerun, worker_init, worker_ready, worker_shutdown
from django.conf import settings
from django.db import DatabaseError, connections
from django.utils import timezone

log = logging.getLogger(__name__)


# How long a leg's message waits before it is tried again when the database could not be
# reached (an outage, a restart): the leg runs as soon as the database is back.
DATABASE_RETRY_SECONDS = 1.0


@task_prerun.connect
def _drop_broken_connections(**kwargs: Any) -> None:
    """Before every job: close this process's database connections that failed and no longer
    work (the database restarted, or went away), so that the job opens a fresh one.

    Celery's Django fixup keeps connections across jobs (``CELERY_DB_REUSE_MAX``) and then
    checks none of them; this checks only connections that have seen an error, so a healthy
    one costs nothing.
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and conn.errors_occurred:
            if conn.is_usable():
                conn.errors_occurred = False
            else:
                log.info("dropping a broken database connection (%s)", conn.alias)
                conn.close()


@shared_task(
    bind=True, name="run_task_job", acks_late=True, reject_on_worker_lost=True, max_retries=None
)
def run_task_job(
    self: Task,  # type: ignore[type-arg]
    task_id: str | None = None,
    dispatch_id: int | None = None,
) -> None:
    """Run one leg of task TASK_ID (a no-op if another leg holds its lease), then waiting
    legs; without TASK_ID (a wake-up message, ``dispatch.wake``) only the waiting legs.

    If the database cannot be reached, the message is sent again to run in
    ``DATABASE_RETRY_SECONDS`` (on a fresh connection), for as long as the outage lasts: a
    message is never dropped because the database was away when it arrived. (A leg that was
    running when the database went away loses its lease and is re-run by the sweeper.)
    """
    from tasks_app import runtime

    try:
        if task_id is not None:
            runtime.run_leg(task_id=task_id, dispatch_id=dispatch_id)
        if settings.TASKDESK_WAITING_LEGS_SECONDS > 0:
            runtime.run_waiting_legs(seconds=settings.TASKDESK_WAITING_LEGS_SECONDS)
    except DatabaseError as exc:
        log.warning("leg of task %s waits for the database: %s", task_id or "(waiting)", exc)
        connections.close_all()
        raise self.retry(exc=exc, countdown=DATABASE_RETRY_SECONDS) from None


@shared_task(name="dispatch_retry_job")
def dispatch_retry_job(task_id: str) -> int:
    """Dispatch the next leg of TASK_ID, whose step waited to be retried (sent with a
    countdown by the leg that scheduled the retry)."""
    from tasks_app import runtime

    return runtime.dispatch_due_retries(task_id=task_id)


@worker_init.connect
def _leg_job_time_limits(**kwargs: Any) -> None:
    """Set Celery's time limits of ``run_task_job`` from the enabled tools, once the worker
    has loaded them (before it takes a job): hard ``runtime.job_time_limit()``, soft 30 s
    earlier. A leg's own time limit (``legs.leg_time_limit``) stops it long before either."""
    from tasks_app import runtime

    hard = math.ceil(runtime.job_time_limit())
    run_task_job.time_limit = hard
    run_task_job.soft_time_limit = hard - 30


@shared_task(name="sweep_job")
def sweep_job() -> None:
    """Publish dispatch records left unpublished (or published but never consumed),
    re-dispatch tasks whose lease expired, dispatch retries that are due, and queue again the
    bulk actions whose job stopped."""
    from tasks_app import bulk, dispatch, runtime

    sent = dispatch.publish_pending()
    revived = runtime.redispatch_expired_leases() + runtime.dispatch_due_retries()
    bulk.revive_stalled()
    runtime.forget_stale_drainers()
    if sent or revived:
        log.info("sweep: published %s dispatch records, re-dispatched %s tasks", sent, revived)


@shared_task(name="heartbeat_job")
def heartbeat_job() -> str:
    """Record that beat scheduled a job and a control worker ran it (the ``beat`` heartbeat
    of /healthz). The row is named after the host, and a worker's own row after
    its node (``NAME@HOST``), so the two never share a row."""
    from tasks_app.models import WorkerHeartbeat

    hostname = socket.gethostname()
    _beat(hostname, WorkerHeartbeat.BEAT)
    return hostname


def _beat(hostname: str, queues: str, detail: dict[str, Any] | None = None) -> None:
    from tasks_app.models import WorkerHeartbeat

    fields: dict[str, Any] = {"seen_at": timezone.now(), "queues": queues}
    if detail is not None:
        fields["detail"] = detail
    WorkerHeartbeat.objects.update_or_create(hostname=hostname, defaults=fields)


# Every worker's own heartbeat: a thread of its main process writes the worker's row every
# TASKDESK_HEARTBEAT_SECONDS, whatever its pool is running. A message on the leg queue would
# wait behind long legs and make a busy worker look dead; heartbeat_job alone shows only that
# beat and the control worker run, not that any worker takes legs. The control worker's own
# row, in turn, stays fresh while beat is down: only heartbeat_job's row shows that.
_stop_heartbeat = threading.Event()
# The pool's processes are forked from the worker's main process, where the heartbeat thread
# writes to the database. A fork in the middle of a write would hand the child the database
# library's locks as they were (SQLite's are process-wide), held by a thread the child does
# not have: its first query would wait forever, and the legs sent to it with it. A fork waits
# for the write in progress; the write waits for the fork.
_database_in_use = threading.Lock()
os.register_at_fork(
    before=_database_in_use.acquire,
    after_in_parent=_database_in_use.release,
    after_in_child=_database_in_use.release,
)


@worker_ready.connect
def _serve_metrics(sender: Any = None, **kwargs: Any) -> None:
    """TASKDESK_WORKER_METRICS_PORT set: this worker node serves its own /metrics."""
    from tasks_app import metrics

    port = settings.TASKDESK_WORKER_METRICS_PORT
    if port:
        try:
            metrics.serve_worker_metrics(settings.TASKDESK_WORKER_METRICS_HOST, port)
        except OSError as exc:
            log.error("worker metrics not served on port %s: %s", port, exc)
        else:
            log.info("worker metrics at http://%s:%s/metrics",
                     settings.TASKDESK_WORKER_METRICS_HOST, port)  # fmt: skip


@worker_ready.connect
def _start_heartbeat(sender: Any = None, **kwargs: Any) -> None:
    # SENDER is the worker's consumer: its node name, its queues and its pool.
    hostname = str(sender.hostname)
    queues = ",".join(sorted(sender.app.amqp.queues.consume_from))
    _stop_heartbeat.clear()
    threading.Thread(
        target=_heartbeats,
        args=(hostname, queues, PoolDetail(sender.pool)),
        name="heartbeat",
        daemon=True,
    ).start()


@worker_shutdown.connect
def _stop_heartbeats(**kwargs: Any) -> None:
    _stop_heartbeat.set()


def _heartbeats(hostname: str, queues: str, pool: PoolDetail) -> None:
    """Write the worker's row every TASKDESK_HEARTBEAT_SECONDS, and at once when its pool's
    processes change (a child replaced after a crash or its task limit): /workers/ places a
    leg on its node by the process id in the leg's lease owner, so a new child's first leg
    is placed within POOL_LOOK_SECONDS rather than at the next heartbeat."""
    from django.db import connection

    every = settings.TASKDESK_HEARTBEAT_SECONDS
    due = 0.0
    sent: list[int] | None = None  # the pool's processes as last written (or tried)
    while True:
        detail = pool.detail()
        if time.monotonic() >= due or detail["pids"] != sent:
            due, sent = time.monotonic() + every, detail["pids"]
            try:
                with _database_in_use:
                    _beat(hostname, queues, detail)
            except DatabaseError as exc:
                log.warning("worker heartbeat not written (the database: %s)", exc)
                with _database_in_use:
                    connection.close()  # a fresh connection next time
        if _stop_heartbeat.wait(min(POOL_LOOK_SECONDS, max(0.0, due - time.monotonic()))):
            with _database_in_use:
                connection.close()
            return


# How often the heartbeat thread looks at its pool's process ids (in memory, no query).
POOL_LOOK_SECONDS = 0.5


class PoolDetail:
    """What a worker's heartbeat row says of the worker (``WorkerHeartbeat.detail``): its host
    as a lease owner names it (``runtime.leases.new_owner``), its main process, its pool's
    kind, size and processes, the pool processes replaced lately, and when it started.

    Read from the pool on every look: a prefork pool replaces a child that died or reached
    its task limit. A pool without processes of its own (solo, threads, eventlet, gevent)
    runs its legs in the main process, so that is its one process.
    """

    # Replaced pool processes kept, newest first: a leg ended by one in the last minute is
    # still placed on its node, and a leg whose process died shows there until its lease
    # runs out.
    FORMER_KEPT = 32

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.started_at = timezone.now().isoformat()
        self.pids: list[int] = []
        self.former: list[int] = []

    def detail(self) -> dict[str, Any]:
        try:
            info = dict(self.pool.info)
        except Exception:  # a pool still starting or already stopping: no figures yet
            info = {}
        kind = str(info.get("implementation", "")).split(":")[0].rsplit(".", 1)[-1]
        pids = sorted(int(pid) for pid in info.get("processes") or () if pid) or [os.getpid()]
        gone = [pid for pid in self.pids if pid not in pids]
        former = dict.fromkeys(pid for pid in [*gone, *self.former] if pid not in pids)
        self.former = list(former)[: self.FORMER_KEPT]
        self.pids = pids
        concurrency = info.get("max-concurrency")
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pool": kind,
            "concurrency": concurrency if isinstance(concurrency, int) else None,
            "pids": pids,
            "former_pids": self.former,
            "started_at": self.started_at,
        }


@shared_task(name="purge_expired_job")
def purge_expired_job() -> int:
    """Delete tasks past their TTL plus the grace period, with their keys, events and records,
    leaving an archive line each; tasks with an effect whose outcome is unknown are kept. Also
    forgets handshake-wire sessions idle past TASKDESK_SESSION_IDLE_SECONDS, and audit entries
    older than TASKDESK_AUDIT_RETENTION_DAYS."""
    from tasks_app import retention, runtime, sessions

    sessions.purge_idle()
    runtime.mark_unknown_intended_of_finished()
    retention.purge_audit()
    return retention.purge_expired()


@shared_task(name="deliver_webhooks_job")
def deliver_webhooks_job() -> int:
    """Send the webhook messages that are due (``tasks_app.webhooks``), for up to half the
    control jobs' soft time limit; whatever is left is sent by the next run."""
    from tasks_app import webhooks

    seconds = min(30.0, settings.TASKDESK_CONTROL_SOFT_TIME_LIMIT_SECONDS / 2)
    return webhooks.deliver_due(seconds=seconds)


@shared_task(name="bulk_action_job")
def bulk_action_job(bulk_id: int) -> bool:
    """Go on with a bulk action ("Cancel all matching", "Settle all matching") for up to half
    the control jobs' soft time limit, then queue the next run; return whether it finished."""
    from tasks_app import bulk

    finished = bulk.run(bulk_id, seconds=bulk.job_seconds())
    if not finished:
        bulk.enqueue(bulk_id)
    return finished
