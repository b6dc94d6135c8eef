"""The control worker's own time limits (config/control.py): its solo pool runs each job in
the main thread, where Celery's prefork limits do not reach."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from config import control
from tests.live import ROOT


@pytest.fixture
def limits():
    import signal

    before = signal.getsignal(signal.SIGALRM)
    limits = control._Limits()
    signal.signal(signal.SIGALRM, limits.on_alarm)
    yield limits
    limits.end()
    signal.signal(signal.SIGALRM, before)


def test_a_job_past_its_soft_limit_gets_soft_time_limit_exceeded(limits) -> None:
    started = time.monotonic()
    with pytest.raises(SoftTimeLimitExceeded, match="purge_expired_job"):
        limits.start("purge_expired_job", soft=0.2, hard=None)
        time.sleep(5)
    assert time.monotonic() - started < 2


def test_a_job_that_ends_in_time_leaves_no_alarm_behind(limits) -> None:
    limits.start("sweep_job", soft=0.3, hard=None)
    limits.end()
    time.sleep(0.5)  # the alarm would have fired here


def test_an_alarm_between_jobs_is_ignored(limits) -> None:
    limits.on_alarm(0, None)  # no job running: nothing raised


def test_a_job_stuck_past_its_hard_limit_ends_the_process_with_its_status() -> None:
    stuck = textwrap.dedent(
        """
        import time
        from config import control
        control._limits.start("stuck_job", soft=None, hard=1)
        time.sleep(30)  # where no exception reaches: only the process's end stops it
        """
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", stuck], cwd=ROOT, capture_output=True, text=True, timeout=20
    )
    assert done.returncode == control.STUCK_EXIT_STATUS, done.stderr
    assert time.monotonic() - started < 10
    assert "control job stuck_job ran past its hard time limit" in done.stderr


def test_the_solo_pool_alone_takes_the_limits_on(monkeypatch) -> None:
    import signal

    before = signal.getsignal(signal.SIGALRM)
    monkeypatch.setattr(control, "_limits", control._Limits())

    class Worker:
        pool_cls = "prefork"

    control._time_limits_for_a_solo_pool(Worker())
    assert control._limits.enabled is False
    Worker.pool_cls = "solo"
    try:
        control._time_limits_for_a_solo_pool(Worker())
        assert control._limits.enabled is True
        assert signal.getsignal(signal.SIGALRM) == control._limits.on_alarm
    finally:
        signal.signal(signal.SIGALRM, before)


def test_each_job_in_the_main_thread_starts_and_ends_its_limits(monkeypatch) -> None:
    import signal

    from celery import shared_task

    @shared_task(name="tests.limited_job", soft_time_limit=0.3, time_limit=60)
    def limited_job() -> str:
        return "done"

    before = signal.getsignal(signal.SIGALRM)
    limits = control._Limits()
    limits.enabled = True
    monkeypatch.setattr(control, "_limits", limits)
    signal.signal(signal.SIGALRM, limits.on_alarm)
    try:
        control._start_limits(sender=limited_job)
        assert limits.running == "tests.limited_job"
        assert limits.hard_deadline > time.monotonic() + 50
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 0.3
        control._end_limits(sender=limited_job)
        assert (limits.running, limits.hard_deadline) == (None, 0.0)
        assert signal.getitimer(signal.ITIMER_REAL)[0] == 0
    finally:
        limits.end()
        signal.signal(signal.SIGALRM, before)


def test_a_job_without_limits_of_its_own_takes_the_control_jobs_defaults(settings) -> None:
    from celery import shared_task

    @shared_task(name="tests.unlimited_job")
    def unlimited_job() -> None:
        return None

    assert control._limit(unlimited_job, "soft_time_limit") == float(
        unlimited_job.app.conf.task_soft_time_limit
    )
    assert control._limit(unlimited_job, "time_limit") == float(
        unlimited_job.app.conf.task_time_limit
    )


def test_embed_beat_makes_beat_a_thread_of_the_worker_with_its_schedule(tmp_path) -> None:
    from celery.beat import _Threaded

    from config.celery import app

    class Worker:
        pass

    worker = Worker()
    worker.app = app  # type: ignore[attr-defined]
    worker.schedule_filename = str(tmp_path / "schedule")  # type: ignore[attr-defined]
    worker.scheduler = None  # type: ignore[attr-defined]
    assert control.EmbeddedBeat(worker, embed_beat=False).enabled is False
    step = control.EmbeddedBeat(worker, embed_beat=True)
    assert step.enabled is True
    service = step.create(worker)
    assert isinstance(service, _Threaded)
    assert service.service.schedule_filename == str(tmp_path / "schedule")
