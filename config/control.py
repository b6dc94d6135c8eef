"""The control worker as one process: beat in a thread of it, and its jobs' time limits.

``celery worker --pool solo --queues control --embed-beat`` (the Procfile's ``control``) runs
the control jobs in its main process, one at a time, and sends the periodic jobs from a thread
beside them. It replaces two processes of a prefork control worker and a beat process of its
own, each of which held the whole application (about 65-100 MiB of PSS each, measured in
docs/benchmarks.md). Celery's own ``--beat`` forks beat as a process, and its solo pool has no
time limits, so both are here.

Time limits (``CELERY_TASK_SOFT_TIME_LIMIT``, ``CELERY_TASK_TIME_LIMIT``, or a job's own):
past the soft limit the job gets ``SoftTimeLimitExceeded`` (SIGALRM in the main thread, where
the solo pool runs it), as a prefork pool process would, so its transaction rolls back and the
next run does the work. Past the hard limit the job is stuck where no exception reaches (a call
that never returns): the process ends with status 70, and its process manager (systemd, the
Kubernetes Deployment) starts a fresh one, as a prefork pool replaces a child it killed.
`make run`'s supervisor stops the whole stack when a process ends, with a line naming it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

from celery import bootsteps
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import task_postrun, task_prerun, worker_init

log = logging.getLogger(__name__)

# The status a control worker ends with when a job ran past its hard time limit.
STUCK_EXIT_STATUS = 70


class EmbeddedBeat(bootsteps.StartStopStep):
    """``--embed-beat``: beat's scheduler in a thread of this worker, started with the worker
    and stopped with it (its schedule file is the worker's ``-s``)."""

    label = "Beat (thread)"
    conditional = True

    def __init__(self, worker: Any, embed_beat: bool = False, **options: Any) -> None:
        self.enabled = bool(embed_beat)
        super().__init__(worker, **options)

    def create(self, worker: Any) -> Any:
        from celery.beat import EmbeddedService

        return EmbeddedService(
            worker.app,
            thread=True,
            schedule_filename=worker.schedule_filename,
            scheduler_cls=worker.scheduler,
        )


class _Limits:
    """The time limits of the job the main thread is running (solo pool only)."""

    def __init__(self) -> None:
        self.enabled = False
        self.running: str | None = None  # the job's name while it runs
        self.hard_deadline = 0.0  # time.monotonic() past which the process ends
        self.lock = threading.Lock()
        self.watchdog: threading.Thread | None = None

    def start(self, name: str, soft: float | None, hard: float | None) -> None:
        with self.lock:
            self.running = name
            self.hard_deadline = time.monotonic() + hard if hard else 0.0
        if soft:
            signal.setitimer(signal.ITIMER_REAL, soft)
        if hard and self.watchdog is None:
            self.watchdog = threading.Thread(target=self._watch, name="time-limits", daemon=True)
            self.watchdog.start()

    def end(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        with self.lock:
            self.running = None
            self.hard_deadline = 0.0

    def on_alarm(self, signum: int, frame: Any) -> None:
        if self.running is not None:  # an alarm that outlived its job is ignored
            raise SoftTimeLimitExceeded(f"soft time limit exceeded: {self.running}")

    def _watch(self) -> None:
        while True:
            time.sleep(1)
            with self.lock:
                stuck = self.running if 0 < self.hard_deadline < time.monotonic() else None
            if stuck is not None:
                log.critical(
                    "control job %s ran past its hard time limit: ending this worker "
                    "(status %s) for its process manager to start a fresh one",
                    stuck,
                    STUCK_EXIT_STATUS,
                )
                logging.shutdown()
                os._exit(STUCK_EXIT_STATUS)


_limits = _Limits()


@worker_init.connect
def _time_limits_for_a_solo_pool(sender: Any = None, **kwargs: Any) -> None:
    """A worker whose jobs run in its main thread (the solo pool) keeps their time limits."""
    pool = getattr(sender, "pool_cls", None)
    name = pool if isinstance(pool, str) else getattr(pool, "__module__", "")
    if str(name).endswith("solo"):
        _limits.enabled = True
        signal.signal(signal.SIGALRM, _limits.on_alarm)


def _limit(task: Any, attribute: str) -> float | None:
    own = getattr(task, attribute, None)
    value = own if own is not None else getattr(task.app.conf, f"task_{attribute}", None)
    return float(value) if value else None


@task_prerun.connect
def _start_limits(sender: Any = None, **kwargs: Any) -> None:
    if _limits.enabled and threading.current_thread() is threading.main_thread():
        _limits.start(sender.name, _limit(sender, "soft_time_limit"), _limit(sender, "time_limit"))


@task_postrun.connect
def _end_limits(**kwargs: Any) -> None:
    if _limits.enabled and threading.current_thread() is threading.main_thread():
        _limits.end()
