"""Legs in real Celery worker processes: duplicates, cancellation, non-determinism, questions."""

from __future__ import annotations

import time

import pytest

from elicitations import transitions as elicitations
from elicitations.models import Channel
from tasks_app import transitions
from tasks_app.models import Actor, Dispatch, Status
from tests.integration.worker_helpers import leg_pid, runtime_stack, submit, terminal
from tests.live import wait_for

# broker: CI runs these on RabbitMQ as well as Redis.
pytestmark = [pytest.mark.live, pytest.mark.broker]


@pytest.fixture
def debug_stack(transactional_db, settings):  # type: ignore[no-untyped-def]
    # The worker logs skipped duplicates at DEBUG. No process stands by as a drainer, so a
    # new record is always published: a drainer handed the record could find a duplicate
    # message had taken it first, which leaves one skipped message instead of two.
    with runtime_stack(settings, LOG_LEVEL="DEBUG", TASKDESK_DRAIN_STANDBY="false") as running:
        yield running


def test_the_same_message_delivered_twice_runs_one_leg(debug_stack, alice) -> None:
    from config.celery import app

    stack = debug_stack
    task = submit(alice, "slow_echo", text="once", seconds=1)
    record = Dispatch.objects.get(task=task)
    for _ in range(2):
        app.send_task("run_task_job", kwargs={"task_id": task.pk, "dispatch_id": record.pk})

    terminal(task, timeout=30)

    assert task.status == Status.COMPLETED
    assert task.leg == 1
    assert task.events.filter(kind="leg_started").count() == 1
    record.refresh_from_db()
    assert record.published_at is not None  # three messages: the original and two copies
    wait_for(
        "the duplicates to be skipped",
        lambda: stack.log("worker").count(f"leg skipped task={task.pk}") >= 2,
        timeout=10,
    )


def test_a_cancelled_60_second_slow_echo_is_cancelled_within_2_seconds(stack, alice) -> None:
    task = submit(alice, "slow_echo", text="never", seconds=60)
    wait_for("the leg to start", lambda: leg_pid(task), timeout=30)
    time.sleep(0.5)

    requested = time.monotonic()
    transitions.request_cancel(task_id=task.pk, actor_type=Actor.CLIENT, actor="alice")
    terminal(task, timeout=10)

    assert time.monotonic() - requested < 2
    assert task.status == Status.CANCELLED
    kinds = list(task.events.values_list("kind", flat=True))
    assert kinds[-2:] == ["cancel_requested", "cancelled"]
    stopped = task.events.get(kind="cancelled")
    assert (stopped.actor_type, stopped.detail) == ("worker", {"work_stopped": True})


def test_a_non_deterministic_tool_fails_with_a_clear_error(stack, alice) -> None:
    task = submit(alice, "nondeterministic")

    def asked() -> bool:
        task.refresh_from_db()
        return task.status == Status.INPUT_REQUIRED

    wait_for("the question", asked, timeout=30)
    request = task.input_requests.get()
    elicitations.answer(
        task=task, key=request.key, response={"action": "accept"}, channel=Channel.TASKS_UPDATE
    )
    terminal(task, timeout=30)

    assert task.status == Status.FAILED
    assert task.error["code"] == -32603
    assert task.error["message"].startswith(
        "Tool nondeterministic is not deterministic: journaled call #1 was ctx.step('stamp-"
    )
    assert task.error["data"]["reason"] == "non_deterministic"


def test_a_question_frees_the_worker_and_an_answer_resumes_the_task(stack, alice) -> None:
    task = submit(alice, "confirm_action", action="ship it")

    def asked() -> bool:
        task.refresh_from_db()
        return task.status == Status.INPUT_REQUIRED

    wait_for("the question", asked, timeout=30)
    assert task.lease_owner == ""
    # While it waits, the worker runs other tasks.
    other = submit(alice, "slow_echo", text="meanwhile", seconds=0)
    terminal(other, timeout=30)
    assert other.status == Status.COMPLETED

    request = task.input_requests.get()
    elicitations.answer(
        task=task,
        key=request.key,
        response={"action": "accept", "content": {"confirm": True}},
        channel=Channel.TASKS_UPDATE,
    )
    terminal(task, timeout=30)

    assert task.result["structuredContent"] == {"confirmed": True}
    assert task.leg == 2


def test_a_leg_past_its_time_limit_is_stopped_in_the_worker(stack, alice) -> None:
    task = submit(alice, "busy", checkpoints=False)  # blocks in time.sleep(5), limit 0.5 s

    terminal(task, timeout=30)

    assert task.status == Status.FAILED
    assert task.error["message"] == (
        "Tool busy ran longer than its time limit of 0.5 s (leg 1) and was stopped"
    )
    started = task.events.get(kind="leg_started").created_at
    assert (task.finished_at - started).total_seconds() < 2
