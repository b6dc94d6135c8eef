"""The embedded configuration (SQLite or the run's database, the filesystem broker) under a
kill loop: 100 SIGKILLs of pool processes, idle and busy, and 10 of the worker's main
process, while refunds keep arriving. Nothing stalls and every refund happens exactly once.

A killed pool process is replaced by Celery; its leg's lease runs out and the sweeper (on the
control worker, never killed here) re-runs it. A killed main process is started again, as a
supervisor would; the messages it had claimed but not acknowledged are put back in the queue
when the new one opens the broker folder.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time

import pytest

from tasks_app.models import Effect, Status, Task
from tasks_app.tools.toolsets.demo.models import DemoRefund
from tests.integration.worker_helpers import describe, runtime_stack, submit, terminal
from tests.live import LiveStack, pool_restored, wait_for

pytestmark = [
    pytest.mark.live,
    pytest.mark.slow,
    # In make test's serial pass, a process of its own beside the workers
    # (scripts/run_tests.py): ten worker restarts and a hundred pool forks, each waiting for a
    # core, stalled it inside a worker beside three busy ones.
    pytest.mark.serial,
    pytest.mark.skipif(
        os.environ.get("CELERY_BROKER_URL", "filesystem://").split(":")[0] != "filesystem",
        reason="the kill loop runs on the embedded broker (the run of CI without CELERY_BROKER_URL)",
    ),
]

POOL_KILLS = 100
MAIN_KILLS = 10
POOL_RESTART_SECONDS = 60
STARTED_SECONDS = 1.0


def worker_started(stack: LiveStack, ready_before: int) -> None:
    """Wait until STACK's worker, started after READY_BEFORE "ready." lines of its log, is
    running. Celery checks that its pool started at the first turn of its loop, just after it
    logs "ready.": a pool process killed before that ends the worker ("Could not start worker
    processes"), so the loop is given STARTED_SECONDS to turn; kills of a running worker's
    pool are what this test is about."""
    wait_for(
        "the worker to start",
        lambda: stack.log("worker").count(" ready.") > ready_before,
        timeout=60,
        every=0.2,
    )
    time.sleep(STARTED_SECONDS)


def pool_alive(stack: LiveStack) -> list[int]:
    """The PIDs of STACK's worker's live pool processes, once it has at least one. A kill
    does not wait for the pool to be whole again: Celery replaces a killed process at once
    when it sees its exit, but some exits it sees only at its pool maintenance timer, 5 s
    later (celery/celery#9588); the loop kills one of the processes that are there."""
    return wait_for("a pool process", stack.pool_pids, timeout=POOL_RESTART_SECONDS)


def test_a_hundred_pool_kills_and_ten_main_process_kills_stall_nothing_and_refund_once(
    transactional_db, settings, alice
) -> None:
    rng = random.Random(14)
    env = {"TASKDESK_DEMO_REFUND_SECONDS": "0.4", "CELERY_BROKER_URL": "filesystem://"}
    tasks: list[Task] = []
    dead_mains: list[subprocess.Popen[bytes]] = []
    pool_kills = {"busy": 0, "idle": 0}
    with runtime_stack(settings, **env) as stack:
        try:
            worker_started(stack, 0)
            main_every = POOL_KILLS // MAIN_KILLS
            for i in range(POOL_KILLS):
                tasks.append(
                    submit(
                        alice, "refund_payment", payment_id=f"p{i}", amount_cents=100, reason="k"
                    )
                )
                time.sleep(rng.uniform(0, 0.4))  # a random moment of some leg's life
                busy = set(
                    Task.objects.filter(pk__in=[t.pk for t in tasks])
                    .exclude(lease_owner="")
                    .values_list("lease_owner", flat=True)
                )
                busy_pids = {int(owner.split(":")[1]) for owner in busy}
                pid = rng.choice(pool_alive(stack))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                pool_kills["busy" if pid in busy_pids else "idle"] += 1
                wait_for(
                    f"pool process {pid} to die",
                    lambda pid=pid: pid not in stack.pool_pids(),
                    timeout=10,
                )
                if i % main_every == main_every - 1:
                    # The main process dies with whatever it had claimed; a supervisor starts
                    # it again. Its orphaned pool processes finish what they run, then go.
                    main = stack.procs.pop("worker")
                    os.kill(main.pid, signal.SIGKILL)
                    main.wait(10)
                    dead_mains.append(main)
                    ready = stack.log("worker").count(" ready.")
                    stack.start_worker()
                    worker_started(stack, ready)
            # The pool is whole again, and nothing stalled: a task submitted after the loop
            # runs at once.
            pool_restored(stack, timeout=POOL_RESTART_SECONDS)
            last = submit(alice, "refund_payment", payment_id="last", amount_cents=100, reason="k")
            terminal(last, timeout=60)
            tasks.append(last)
            try:
                wait_for(
                    "every task to end",
                    lambda: (
                        not Task.objects.filter(pk__in=[t.pk for t in tasks])
                        .exclude(status__in=["completed", "failed", "cancelled"])
                        .exists()
                    ),
                    timeout=120,
                    every=0.5,
                )
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{describe(tasks)}") from None
        finally:
            for main in dead_mains:  # their process groups: orphaned pool processes too
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(main.pid, signal.SIGKILL)

    assert pool_kills["busy"] >= 10 and pool_kills["idle"] >= 10, pool_kills
    for task in Task.objects.filter(pk__in=[t.pk for t in tasks]):
        assert task.status == Status.COMPLETED, describe([task])
        assert task.result["isError"] is False, task.result
    assert DemoRefund.objects.count() == len(tasks)
    assert set(DemoRefund.objects.values_list("payment_id", flat=True)) == {
        t.arguments["payment_id"] for t in tasks
    }
    assert set(Effect.objects.values_list("state", flat=True)) == {"confirmed"}
    print(f"\nkills: {pool_kills}, main: {len(dead_mains)}, tasks: {len(tasks)}")
