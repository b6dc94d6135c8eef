"""Real Celery worker processes killed with SIGKILL in the middle of tasks.

The worker runs with the live stack's short lease (5 s) and sweep interval (1 s). A killed
pool process is replaced by Celery; its task's lease runs out, the sweeper dispatches a new
leg, and the replay, the effects ledger and the verify hooks make the re-run safe. Runs on
the embedded broker by default and on Redis with ``CELERY_BROKER_URL=redis://...``.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import time
from pathlib import Path

import pytest

from elicitations import transitions as elicitations
from elicitations.models import Channel, RequestStatus
from tasks_app import runtime
from tasks_app.models import Effect, Status, Task
from tasks_app.tools.toolsets.demo.models import DemoRefund
from tests.integration.worker_helpers import (
    describe,
    export_writes,
    leg_pid,
    runtime_stack,
    submit,
    terminal,
)
from tests.live import kill, pool_restored, wait_for
from tests.tasks_app.runtime.helpers import events as events_of

# broker: CI runs these on RabbitMQ as well as Redis.
pytestmark = [pytest.mark.live, pytest.mark.broker]

# Slower demo tools give the random kills a leg to hit.
EXPORT_SECONDS = 1.0
REFUND_SECONDS = 0.4


@pytest.fixture
def slow_stack(transactional_db, settings):  # type: ignore[no-untyped-def]
    env = {
        "TASKDESK_DEMO_EXPORT_SECONDS": str(EXPORT_SECONDS),
        "TASKDESK_DEMO_REFUND_SECONDS": str(REFUND_SECONDS),
    }
    with runtime_stack(settings, **env) as running:
        yield running


def test_a_leg_killed_between_an_effects_intent_and_outcome_is_rerun_and_writes_once(
    stack, alice
) -> None:
    task = submit(alice, "export_report", quarter="Q1", rows=2000)
    wait_for(
        "the export's intent",
        lambda: Effect.objects.filter(task=task, state="intended").exists(),
        timeout=30,
        every=0.005,
    )
    pid = leg_pid(task)
    assert pid is not None

    kill(stack, pid)
    killed_at = time.monotonic()
    terminal(task, timeout=60)

    assert time.monotonic() - killed_at < 20  # lease (5 s) + sweep (1 s) + the re-run
    assert task.status == Status.COMPLETED
    assert task.result["isError"] is False
    effect = Effect.objects.get(task=task)
    assert effect.state == "confirmed"
    kinds = events_of(task)
    assert "lease_expired" in kinds
    assert "effect_unknown" in kinds
    assert "effect_verified" in kinds or "effect_retried" in kinds
    assert task.leg >= 2
    path = Path(stack.env["TASKDESK_EXPORT_DIR"]) / task.result["structuredContent"]["file"]
    assert (
        hashlib.sha256(path.read_bytes()).hexdigest() == task.result["structuredContent"]["sha256"]
    )
    assert len(export_writes(stack, task)) == 1
    assert not list(path.parent.glob(f".{task.pk}.*.part"))
    assert pid not in pool_restored(stack)  # Celery replaced the killed process


def test_an_unverifiable_effect_cut_short_waits_for_an_operator(stack, alice, operator) -> None:
    task = submit(alice, "suicide")  # kills its own pool process inside the effect body

    def waiting() -> bool:
        task.refresh_from_db()
        return task.status_message.startswith("Effect 'mark'")

    wait_for("the operator reconciliation message", waiting, timeout=30)
    effect = Effect.objects.get(task=task)
    assert effect.state == "unknown"
    assert task.status == Status.WORKING

    runtime.reconcile_effect(effect_id=effect.pk, happened=True, user=operator)
    terminal(task, timeout=30)

    assert task.status == Status.COMPLETED
    assert task.result["content"][0]["text"] == "survived"
    assert DemoRefund.objects.filter(downstream_key=f"suicide:{task.pk}").count() == 1


def test_pool_processes_killed_while_waiting_for_a_job_leave_the_worker_running(
    stack, alice
) -> None:
    # A pool process waiting for its next job is the one that would hold the lock of a job
    # pipe shared by the whole pool: killing each idle process in turn would stop such a worker.
    # First a task, so the worker is past its start-up (Celery gives up on a pool whose
    # processes die before its first check that they started).
    terminal(submit(alice, "noop"), timeout=30)
    for pid in pool_restored(stack):
        kill(stack, pid)
        pool_restored(stack)

    task = submit(alice, "export_report", quarter="Q2", rows=10)
    try:
        terminal(task, timeout=30)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe([task])}\n{stack.log('worker')[-6000:]}") from None

    assert task.status == Status.COMPLETED
    assert task.result["isError"] is False


def test_twenty_runs_with_random_kills_end_terminal_with_nothing_done_twice(
    slow_stack, alice, operator
) -> None:
    stack = slow_stack
    rng = random.Random()
    tasks: list[Task] = []
    kills = 0
    for i in range(20):
        if i % 2 == 0:
            task = submit(alice, "export_report", quarter="Q3", rows=500)
            duration = EXPORT_SECONDS
        else:
            # Every other refund is large: it waits for an operator, who approves it at once.
            amount = 15000 if i % 4 == 3 else 700
            task = submit(
                alice, "refund_payment", payment_id=f"pay_{i}", amount_cents=amount, reason="r"
            )
            duration = REFUND_SECONDS
        tasks.append(task)

        def started(task: Task = task) -> bool:
            _approve_pending(tasks, operator)
            return leg_pid(task) is not None

        # A random moment of the leg's life: as it starts, while it generates, writes or
        # refunds, or just after it ended. Some kills miss (the leg was faster).
        with contextlib.suppress(AssertionError):
            wait_for("the leg to start", started, timeout=5, every=0.005)
        time.sleep(rng.uniform(0, duration * 1.1))
        pid = leg_pid(task)
        if pid in stack.pool_pids():
            kill(stack, pid)
            kills += 1
            pool_restored(stack)  # one death at a time, as a crashing host would do

    def all_done() -> bool:
        _approve_pending(tasks, operator)
        unfinished = Task.objects.filter(
            pk__in=[t.pk for t in tasks], status__in=[Status.WORKING, Status.INPUT_REQUIRED]
        )
        return not unfinished.exists()

    try:
        wait_for("every task to end", all_done, timeout=120, every=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe(tasks)}") from None

    # The moments are random and some land after a short leg already ended; what matters is
    # that many legs died mid-way and every task still ended right.
    assert kills >= 5
    for task in tasks:
        task.refresh_from_db()
        assert task.status == Status.COMPLETED, (task.tool_name, task.status, task.error)
        assert task.result["isError"] is False, task.result
        if task.tool_name == "refund_payment":
            assert DemoRefund.objects.filter(downstream_key__startswith=f"{task.pk}:").count() == 1
        else:
            assert len(export_writes(stack, task)) <= 1  # written once (0: killed after rename)
            path = Path(stack.env["TASKDESK_EXPORT_DIR"]) / task.result["structuredContent"]["file"]
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            assert digest == task.result["structuredContent"]["sha256"]
        assert not Effect.objects.filter(task=task).exclude(state="confirmed").exists()


def _approve_pending(tasks: list[Task], operator) -> None:  # type: ignore[no-untyped-def]
    from elicitations.models import InputRequest

    for request in InputRequest.objects.filter(
        task__in=[t.pk for t in tasks], status=RequestStatus.PENDING
    ).select_related("task"):
        elicitations.answer(
            task=request.task,
            key=request.key,
            response={"action": "accept", "content": {"decision": "approve"}},
            channel=Channel.INBOX,
            user=operator,
        )
