"""Legs: how a tool function's ending becomes the task's status, leases, replay and limits."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from tasks_app import runtime
from tasks_app.models import Dispatch, JournalEntry, Status, Task, TaskEvent
from tasks_app.runtime import LegOutcome
from tests.runtime_toolset import RUNS
from tests.tasks_app.runtime.helpers import (
    answer,
    events,
    leg,
    next_dispatch,
    submit,
    text_of,
)

# --- endings ---------------------------------------------------------------------------------


def test_it_completes_a_task_with_what_the_function_returned(alice) -> None:
    task = submit(alice, "noop")

    assert leg(task) == LegOutcome.COMPLETED

    assert task.status == Status.COMPLETED
    assert task.result == {"content": [{"type": "text", "text": "ok"}], "isError": False}
    assert task.leg == 1
    assert (task.lease_owner, task.lease_expires_at) == ("", None)
    assert events(task) == ["leg_started", "completed"]
    started = task.events.get(kind="leg_started")
    assert started.detail["leg"] == 1
    assert started.actor.count(":") == 2  # host:pid:suffix


def test_it_returns_structured_content(alice) -> None:
    task = submit(alice, "outcome", how="structured")

    leg(task)

    assert task.result["structuredContent"] == {"answer": 42}
    assert task.result["isError"] is False


def test_a_tool_error_completes_the_task_with_is_error(alice) -> None:
    task = submit(alice, "outcome", how="tool_error")

    assert leg(task) == LegOutcome.COMPLETED

    assert task.status == Status.COMPLETED
    assert task.result["isError"] is True
    assert text_of(task.result) == "the payment provider said no"
    assert task.events.get(kind="completed").detail["is_error"] is True


def test_an_unexpected_exception_reports_only_a_reference_and_logs_its_text(alice, caplog) -> None:
    task = submit(alice, "outcome", how="exception")

    leg(task)

    assert task.status == Status.COMPLETED
    assert task.result["isError"] is True
    told = text_of(task.result)
    assert "missing-thing" not in told and "KeyError" not in told
    reference = re.search(r"reference ([0-9a-f]{12})", told)
    assert reference is not None, told
    [record] = [r for r in caplog.records if reference.group(1) in r.getMessage()]
    assert record.exc_info is not None and "missing-thing" in str(record.exc_info[1])


def test_a_protocol_error_fails_the_task_with_its_json_rpc_error(alice) -> None:
    task = submit(alice, "outcome", how="protocol_error")

    assert leg(task) == LegOutcome.FAILED

    assert task.status == Status.FAILED
    assert task.error == {"code": -32050, "message": "bad upstream", "data": {"upstream": "x"}}


def test_a_result_that_is_not_json_becomes_a_clear_tool_error(alice) -> None:
    task = submit(alice, "outcome", how="not_json")

    leg(task)

    assert task.status == Status.COMPLETED
    assert task.result["isError"] is True
    assert text_of(task.result).startswith("Tool outcome returned a value that is not valid JSON")


def test_a_tool_that_is_no_longer_enabled_fails_the_task(alice, settings) -> None:
    task = submit(alice, "noop")
    settings.TASKDESK_TOOLSETS = ["demo"]

    assert leg(task) == LegOutcome.FAILED

    assert task.error["code"] == -32603
    assert "Tool noop is not available on this worker" in task.error["message"]


# --- leases and duplicate messages ------------------------------------------------------


def test_the_same_message_delivered_twice_runs_one_leg(alice) -> None:
    task = submit(alice, "asks_operator")
    dispatch_id = next_dispatch(task)

    first = runtime.run_leg(task_id=task.pk, dispatch_id=dispatch_id)
    # The task now waits for an operator: still working and unleased, so only the consumed
    # dispatch record tells the second delivery apart from a real new leg.
    second = runtime.run_leg(task_id=task.pk, dispatch_id=dispatch_id)

    task.refresh_from_db()
    assert (first, second) == (LegOutcome.SUSPENDED, LegOutcome.SKIPPED)
    assert task.status == Status.WORKING
    assert task.leg == 1
    assert events(task).count("leg_started") == 1


def test_a_leg_does_nothing_while_another_leg_holds_a_live_lease(alice) -> None:
    task = submit(alice, "noop")
    Task.objects.filter(pk=task.pk).update(
        lease_owner="elsewhere:1:abc", lease_expires_at=timezone.now() + timedelta(seconds=30)
    )

    assert leg(task) == LegOutcome.SKIPPED

    assert task.status == Status.WORKING
    assert task.leg == 0
    assert Dispatch.objects.get(task=task).consumed_at is not None


def test_a_leg_takes_over_an_expired_lease(alice) -> None:
    task = submit(alice, "noop")
    Task.objects.filter(pk=task.pk).update(
        lease_owner="dead:1:abc", lease_expires_at=timezone.now() - timedelta(seconds=1)
    )

    assert leg(task) == LegOutcome.COMPLETED


@pytest.mark.parametrize("status", [Status.INPUT_REQUIRED, Status.COMPLETED, Status.CANCELLED])
def test_a_task_that_is_not_working_is_never_started(alice, status) -> None:
    task = submit(alice, "noop")
    Task.objects.filter(pk=task.pk).update(status=status)

    assert leg(task) == LegOutcome.SKIPPED

    assert task.leg == 0
    assert "leg_started" not in events(task)


def test_the_sweeper_redispatches_a_task_whose_lease_expired(alice) -> None:
    task = submit(alice, "noop")
    runtime.run_leg(task_id=task.pk, dispatch_id=next_dispatch(task))  # completes
    stuck = submit(alice, "noop")
    live = submit(alice, "noop")
    now = timezone.now()
    Task.objects.filter(pk=stuck.pk).update(
        lease_owner="dead:1:abc", lease_expires_at=now - timedelta(seconds=1), leg=1
    )
    Task.objects.filter(pk=live.pk).update(
        lease_owner="alive:1:abc", lease_expires_at=now + timedelta(seconds=30), leg=1
    )
    Dispatch.objects.update(consumed_at=now)

    assert runtime.redispatch_expired_leases() == 1

    stuck.refresh_from_db()
    assert (stuck.lease_owner, stuck.lease_expires_at) == ("", None)
    expired = stuck.events.get(kind="lease_expired")
    assert expired.detail == {"owner": "dead:1:abc", "leg": 1}
    assert Dispatch.objects.get(task=stuck, consumed_at__isnull=True).reason == "lease_expired"
    assert not Dispatch.objects.filter(task=live, consumed_at__isnull=True).exists()
    assert leg(stuck) == LegOutcome.COMPLETED
    assert stuck.leg == 2
    assert runtime.redispatch_expired_leases() == 0


# --- the journal ---------------------------------------------------------------------------


def test_journaled_steps_run_once_across_legs(alice) -> None:
    task = submit(alice, "steps", label="b")

    assert leg(task) == LegOutcome.SUSPENDED
    answer(task, "approve", {"action": "accept", "content": {"approve": True}})
    assert leg(task) == LegOutcome.COMPLETED

    assert task.result["structuredContent"] == {
        "loaded": [1, "b"],
        "action": "accept",
        "content": {"approve": True},
        "total": 41,
    }
    assert RUNS["load"] == 1
    assert RUNS["total"] == 1
    journal = list(JournalEntry.objects.filter(task=task).values_list("seq", "kind", "name"))
    assert journal == [(0, "step", "load"), (1, "ask", "approve"), (2, "step", "total")]


def test_a_different_call_at_a_recorded_position_fails_the_task(alice) -> None:
    task = submit(alice, "nondeterministic")
    leg(task)
    recorded = JournalEntry.objects.get(task=task, seq=0).name
    answer(task, "again", {"action": "accept", "content": {}})

    assert leg(task) == LegOutcome.FAILED

    assert task.status == Status.FAILED
    assert task.error["code"] == -32603
    message = task.error["message"]
    assert message.startswith("Tool nondeterministic is not deterministic: journaled call #1 was ")
    assert f"ctx.step('{recorded}') on an earlier leg but is ctx.step('stamp-" in message
    assert "on leg 2" in message
    assert task.error["data"]["reason"] == "non_deterministic"
    assert task.error["data"]["recorded"] == {"kind": "step", "name": recorded}


def test_returning_before_the_recorded_calls_is_not_deterministic_either(alice, tmp_path) -> None:
    flag = tmp_path / "flag"
    flag.touch()
    task = submit(alice, "returns_early", flag_path=str(flag))
    leg(task)
    flag.unlink()
    answer(task, "go", {"action": "accept", "content": {}})

    leg(task)

    assert task.status == Status.FAILED
    assert (
        "journaled call #1 was ctx.step('only-sometimes') on an earlier leg but is no further "
        "journaled call on leg 2" in task.error["message"]
    )


def test_answers_recorded_at_acceptance_are_replayed(alice) -> None:
    task = submit(alice, "asks_operator")
    JournalEntry.objects.create(
        task=task, seq=1, kind="ask", name="ok", outcome={"action": "accept", "content": {"ok": 1}}
    )

    assert leg(task) == LegOutcome.COMPLETED

    assert text_of(task.result) == "accept {'ok': 1}"
    assert not task.input_requests.exists()


# --- time limits, progress, cancellation ----------------------------------------------------


@pytest.mark.parametrize("checkpoints", [True, False])
def test_a_leg_past_its_time_limit_fails_the_task(alice, checkpoints) -> None:
    task = submit(alice, "busy", checkpoints=checkpoints)
    started = time.monotonic()

    assert leg(task) == LegOutcome.FAILED

    assert time.monotonic() - started < 2
    assert task.error["message"] == (
        "Tool busy ran longer than its time limit of 0.5 s (leg 1) and was stopped"
    )
    assert task.error["data"] == {"reason": "time_limit", "timeLimitSeconds": 0.5}


def test_progress_becomes_the_status_message(alice, monkeypatch) -> None:
    from tasks_app.runtime import context

    seen: list[str] = []
    original = context.transitions.set_status_message

    def spy(*, task_id: str, message: str) -> None:
        seen.append(message)
        original(task_id=task_id, message=message)

    monkeypatch.setattr(context.transitions, "set_status_message", spy)
    task = submit(alice, "sleeper", seconds=1)

    leg(task)

    assert seen[0] == "sleeping (0/10)"
    assert len(seen) < 7  # written at most every quarter second


def test_the_claim_counts_as_the_first_cancellation_poll(alice) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    task = submit(alice, "slow_echo", text="x", seconds=0)  # one checkpoint (ctx.sleep(0))

    with CaptureQueriesContext(connection) as queries:
        assert leg(task) == LegOutcome.COMPLETED

    polls = [q for q in queries.captured_queries if '"cancel_requested_at" IS NOT NULL' in q["sql"]]
    assert polls == []  # the claim read the row a moment ago and found no request


def test_a_leg_stops_at_a_checkpoint_once_cancellation_is_requested(alice) -> None:
    task = submit(alice, "sleeper", seconds=5)
    # As if tasks/cancel arrived while the leg ran (request_cancel would cancel an unleased
    # task at once, so record the request the way it does for a running one).
    Task.objects.filter(pk=task.pk).update(cancel_requested_at=timezone.now())
    started = time.monotonic()

    assert leg(task) == LegOutcome.CANCELLED

    assert time.monotonic() - started < 1
    assert task.status == Status.CANCELLED
    cancelled = task.events.get(kind="cancelled")
    assert cancelled.detail == {"work_stopped": True}
    assert cancelled.actor_type == "worker"


def test_the_worker_log_names_the_task_and_the_leg(alice, caplog) -> None:
    task = submit(alice, "noop")

    with caplog.at_level("DEBUG", logger="tasks_app.runtime"):
        leg(task)

    # The start at DEBUG; the end (outcome and duration) at DEBUG too when it completed.
    started = [
        r
        for r in caplog.records
        if r.getMessage().startswith(f"leg started task={task.pk} leg=1 tool=noop")
    ]
    assert [r.levelname for r in started] == ["DEBUG"]
    ended = [r for r in caplog.records if r.getMessage().startswith(f"leg ended task={task.pk}")]
    assert [r.getMessage().split(" ms=")[0] for r in ended] == [
        f"leg ended task={task.pk} leg=1 outcome=completed"
    ]
    assert [r.levelname for r in ended] == ["DEBUG"]


def test_every_task_logged_makes_a_completed_leg_an_info_line(alice, caplog, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_LOG_EVERY_TASK = True
    task = submit(alice, "noop")

    with caplog.at_level("DEBUG", logger="tasks_app.runtime"):
        leg(task)

    ended = [r for r in caplog.records if r.getMessage().startswith("leg ended")]
    assert [r.levelname for r in ended] == ["INFO"]


def test_the_job_runs_a_leg(alice) -> None:
    from tasks_app.tasks import run_task_job

    task = submit(alice, "noop")

    run_task_job(task_id=task.pk, dispatch_id=next_dispatch(task))

    task.refresh_from_db()
    assert task.status == Status.COMPLETED


def test_a_leg_that_lost_its_lease_does_not_end_the_task(alice) -> None:
    task = submit(alice, "hands_over")

    assert leg(task) == LegOutcome.LEASE_LOST

    assert task.status == Status.WORKING
    assert task.lease_owner == "newer:1:abc"
    assert events(task) == ["leg_started"]


# --- waiting legs: tasks run straight from their dispatch records ------------------------------


def test_a_worker_runs_waiting_tasks_oldest_first_and_their_messages_then_do_nothing(alice) -> None:
    tasks = [submit(alice, "noop") for _ in range(3)]
    records = [next_dispatch(task) for task in tasks]

    assert runtime.run_waiting_legs(seconds=5) == 3

    started = TaskEvent.objects.filter(kind="leg_started").order_by("id")
    assert [e.task_id for e in started] == [task.pk for task in tasks]
    assert [e.detail["dispatch"] for e in started] == records
    for task, record in zip(tasks, records, strict=True):
        task.refresh_from_db()
        assert (task.status, task.leg) == (Status.COMPLETED, 1)
        # The task's own message arrives later and finds its record consumed.
        assert runtime.run_leg(task_id=task.pk, dispatch_id=record) == LegOutcome.SKIPPED
        task.refresh_from_db()
        assert task.leg == 1
    assert runtime.run_waiting_legs(seconds=5) == 0  # nothing is waiting any more


def test_a_waiting_record_whose_task_cannot_start_is_consumed_and_skipped(alice) -> None:
    leased, cancelled, ready = (submit(alice, "noop") for _ in range(3))
    Task.objects.filter(pk=leased.pk).update(
        lease_owner="elsewhere:1:abc", lease_expires_at=timezone.now() + timedelta(seconds=30)
    )
    Task.objects.filter(pk=cancelled.pk).update(status=Status.CANCELLED)

    assert runtime.run_waiting_legs(seconds=5) == 1

    assert not Dispatch.objects.filter(consumed_at__isnull=True).exists()
    for task in (leased, cancelled, ready):
        task.refresh_from_db()
    assert (leased.status, leased.leg, leased.lease_owner) == (
        Status.WORKING,
        0,
        "elsewhere:1:abc",
    )
    assert (cancelled.status, cancelled.leg) == (Status.CANCELLED, 0)
    assert (ready.status, ready.leg) == (Status.COMPLETED, 1)


def test_waiting_legs_stop_taking_new_tasks_once_their_time_is_up(alice) -> None:
    slow, waiting = submit(alice, "slow_echo", text="a", seconds=0.3), submit(alice, "noop")

    assert runtime.run_waiting_legs(seconds=0.1) == 1  # the slow leg ran to its end

    slow.refresh_from_db()
    waiting.refresh_from_db()
    assert slow.status == Status.COMPLETED
    assert (waiting.status, waiting.leg) == (Status.WORKING, 0)
    assert Dispatch.objects.get(task=waiting).consumed_at is None


@pytest.mark.parametrize(("seconds", "expected"), [(1.0, Status.COMPLETED), (0, Status.WORKING)])
def test_after_its_own_leg_the_job_runs_waiting_tasks_unless_turned_off(
    alice, settings, seconds, expected
) -> None:  # type: ignore[no-untyped-def]
    from tasks_app.tasks import run_task_job

    settings.TASKDESK_WAITING_LEGS_SECONDS = seconds
    first, other = submit(alice, "noop"), submit(alice, "noop")

    run_task_job(task_id=first.pk, dispatch_id=next_dispatch(first))

    first.refresh_from_db()
    other.refresh_from_db()
    assert (first.status, other.status) == (Status.COMPLETED, expected)


def test_a_tool_without_a_time_limit_of_its_own_gets_the_default_leg_time_limit(
    alice, settings
) -> None:
    settings.TASKDESK_LEG_TIME_LIMIT_SECONDS = 0.5
    task = submit(alice, "sleeper", seconds=5)

    assert leg(task) == LegOutcome.FAILED

    assert task.error["data"] == {"reason": "time_limit", "timeLimitSeconds": 0.5}
    assert "ran longer than its time limit of 0.5 s" in task.error["message"]
