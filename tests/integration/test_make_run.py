"""`make run`'s supervisor (scripts/run_procfile.py, the Procfile) with the real processes: a
Ctrl-C lets each Celery worker finish the leg it is running, and a process that died stops
the others with a message naming it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tasks_app.models import Status
from tests.integration.worker_helpers import leg_pid, submit
from tests.live import BIN, ROOT, LiveStack, stop_process, wait_for

pytestmark = [pytest.mark.live, pytest.mark.slow]


@contextmanager
def make_run(**env: str) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """The command `make run` ends in, started in a session of its own (as a terminal's
    foreground job), once every process has said it is up."""
    stack = LiveStack()  # only for its environment: a private folder, port and broker
    stack.collect_static()
    out = stack.tmp / "run.log"
    with open(out, "wb") as log:
        supervisor = subprocess.Popen(
            [
                str(BIN / "python"),
                "scripts/run_procfile.py",
                "-f",
                "Procfile",
                "--port",
                str(stack.port),
            ],
            cwd=ROOT,
            env={**stack.env, "PATH": f"{BIN}:{os.environ['PATH']}", **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            "every process to start",
            lambda: (
                all(
                    f"{n}.1 started" in (text := out.read_text())
                    for n in ("web", "worker", "control", "beat")
                )
                and text.count(" ready.") >= 2
            ),  # both Celery workers
            timeout=90,
            every=0.3,
            explain=lambda: out.read_text()[-3000:],
        )
        yield supervisor, out
    finally:
        stop_process(supervisor)


def test_ctrl_c_lets_the_worker_finish_the_leg_it_is_running(transactional_db, alice) -> None:  # type: ignore[no-untyped-def]
    with make_run() as (supervisor, out):
        task = submit(alice, "slow_echo", text="finish me", seconds=3)
        wait_for("the leg to start", lambda: leg_pid(task), timeout=30)
        interrupted = time.monotonic()
        os.killpg(supervisor.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
        supervisor.wait(30)
        took = time.monotonic() - interrupted
        text = out.read_text()

    assert supervisor.returncode == 0, text[-3000:]
    assert "SIGINT received: sending SIGTERM to web.1, worker.1, control.1, beat.1" in text
    assert "worker.1  | worker: Warm shutdown" in text
    assert "WorkerLostError" not in text, text[-3000:]
    for name in ("web", "worker", "control", "beat"):
        assert f"{name}.1 stopped (rc=0)" in text, text[-3000:]
    assert took < 10
    task.refresh_from_db()
    assert task.status == Status.COMPLETED  # the leg ran to its end before the worker stopped
    assert task.leg == 1


def test_a_worker_that_dies_stops_make_run_with_a_message_naming_it(transactional_db) -> None:
    with make_run() as (supervisor, out):
        found = re.search(r"worker\.1 started \(pid=(\d+)\)", out.read_text())
        assert found is not None
        os.kill(int(found.group(1)), signal.SIGKILL)
        supervisor.wait(60)
        text = out.read_text()

    assert "worker.1 stopped (rc=-9)" in text
    assert "worker.1 ended: sending SIGTERM to web.1, control.1, beat.1" in text
    assert supervisor.returncode == 1
    for name in ("web", "control", "beat"):
        assert f"{name}.1 stopped" in text, text[-3000:]


def _with_children(pid: int) -> list[int]:
    """PID and its children: a Celery worker's pool processes, gunicorn's web processes."""
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    ).stdout
    return [pid, *(int(child) for child in out.split())]


def _started_pid(text: str, name: str) -> int:
    found = re.search(rf"{name}\.1 started \(pid=(\d+)\)", text)
    assert found is not None, text[-3000:]
    return int(found.group(1))


def test_the_leg_worker_yields_the_cpu_to_the_web_processes(transactional_db) -> None:  # type: ignore[no-untyped-def]
    with make_run(WORKER_NICE="7") as (_supervisor, out):
        text = out.read_text()
        processes = {
            name: _with_children(_started_pid(text, name)) for name in ("web", "worker", "control")
        }
        nice = {
            name: {os.getpriority(os.PRIO_PROCESS, pid) for pid in pids}
            for name, pids in processes.items()
        }
        groups = {
            name: {Path(f"/proc/{pid}/autogroup").read_text().split()[-1] for pid in pids}
            for name, pids in processes.items()
            if Path(f"/proc/{pids[0]}/autogroup").exists()
        }

    assert len(processes["worker"]) == 3  # the worker and its two pool processes
    assert nice == {"web": {0}, "worker": {7}, "control": {0}}
    if not groups:
        pytest.skip("this kernel has no autogroup; the nice values above are the whole story")
    # Each process leads a session of its own, whose scheduling group takes its priority.
    assert groups == {"web": {"0"}, "worker": {"7"}, "control": {"0"}}
