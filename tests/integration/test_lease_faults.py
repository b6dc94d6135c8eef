"""Fenced leases on the database's clock, against real worker processes.

A leg frozen with SIGSTOP inside an effect, past its lease, wakes after another leg finished
the task: the frozen leg's call reaches the provider, which refuses it by the effect's key, so
there is one refund; every write the frozen leg tries is refused.
Workers whose clocks run 60 s ahead and 60 s behind (time-machine, started in each pool
process by ``TASKDESK_TEST_CLOCK_SKEW_SECONDS``) never run two live legs of one task.
"""

from __future__ import annotations

import os
import signal

import pytest

from tasks_app.models import Effect, Status, Task, TaskEvent
from tasks_app.tools.toolsets.demo.models import DemoRefund
from tests.integration.worker_helpers import describe, runtime_stack, submit, terminal
from tests.live import wait_for

pytestmark = [pytest.mark.live, pytest.mark.slow]

LEASE_SECONDS = 3
REFUND_SECONDS = 6.0  # the demo provider waits half of it before the refund, half after


def test_a_leg_frozen_inside_an_effect_past_its_lease_changes_nothing_when_it_wakes(
    transactional_db, settings, alice
) -> None:
    env = {
        "TASKDESK_LEASE_SECONDS": str(LEASE_SECONDS),
        "TASKDESK_DEMO_REFUND_SECONDS": str(REFUND_SECONDS),
    }
    with runtime_stack(settings, **env) as stack:
        task = submit(alice, "refund_payment", payment_id="pay-1", amount_cents=500, reason="r")
        intended = wait_for(
            "the refund's intent",
            lambda: TaskEvent.objects.filter(task=task, kind="effect_intended").first(),
            timeout=30,
            every=0.005,
        )
        frozen = intended.actor  # host:pid:suffix of the leg inside the provider call
        pid = int(frozen.split(":")[1])
        assert pid in stack.pool_pids()
        os.kill(pid, signal.SIGSTOP)
        try:
            # Its lease runs out, the sweeper dispatches a new leg in the other pool process;
            # that leg verifies the refund (not made yet), makes it and ends the task.
            terminal(task, timeout=60)
        finally:
            os.kill(pid, signal.SIGCONT)

        assert task.status == Status.COMPLETED
        assert task.result["isError"] is False
        assert task.leg == 2
        wait_for(
            "the frozen leg's refused write",
            lambda: f"writes refused task={task.pk} leg=1" in stack.log("worker"),
            timeout=30,
            every=0.1,
            explain=lambda: stack.log("worker")[-3000:],
        )

    # The provider got two calls, one from each leg: the new leg's made the refund; the frozen
    # leg, frozen inside or just before its call, called when it woke and was refused by the
    # key. Its unique key keeps it at one refund; nothing in Taskdesk stopped the call.
    [refund] = DemoRefund.objects.filter(payment_id="pay-1")
    assert refund.refused_calls == 1, "the frozen leg's call when it woke"
    effect = Effect.objects.get(task=task)
    assert effect.state == "confirmed"
    assert task.result["structuredContent"]["refund_id"] == effect.detail["refund_id"]
    # Everything the frozen leg wrote, it wrote before it froze.
    by_frozen = list(
        TaskEvent.objects.filter(task=task, actor=frozen)
        .order_by("created_at", "id")
        .values_list("kind", flat=True)
    )
    assert by_frozen == ["leg_started", "effect_intended"]
    kinds = list(task.events.order_by("created_at", "id").values_list("kind", flat=True))
    assert kinds.count("leg_started") == 2
    assert "lease_expired" in kinds
    assert kinds[-1] == "completed"


def test_workers_with_clocks_60_s_ahead_and_behind_never_run_two_live_legs_of_a_task(
    transactional_db, settings, alice
) -> None:
    env = {
        "TASKDESK_LEASE_SECONDS": str(LEASE_SECONDS),
        # Each leg starts from its own message, so every worker gets some of the tasks.
        "TASKDESK_WAITING_LEGS_SECONDS": "0",
    }
    with runtime_stack(settings, **env) as stack:
        stack.stop("worker")
        skews = {"worker-ahead": 60, "worker-behind": -60, "worker": 0}
        for name, skew in skews.items():
            stack.start_worker(1, name=name, env={"TASKDESK_TEST_CLOCK_SKEW_SECONDS": str(skew)})
        for name in skews:
            wait_for(
                f"{name} to be ready",
                lambda name=name: "ready." in stack.log(name),  # type: ignore[misc]
                timeout=60,
                every=0.2,
            )
        # Legs longer than the lease: they live on renewals, the dangerous part.
        tasks = [submit(alice, "sleeper", seconds=2 * LEASE_SECONDS) for _ in range(9)]
        try:
            for task in tasks:
                terminal(task, timeout=120)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{describe(tasks)}") from None

        pids = {name: set(stack.pool_pids(name)) for name in skews}

    offsets: dict[str, list[float]] = {name: [] for name in skews}
    for task in Task.objects.filter(pk__in=[t.pk for t in tasks]):
        assert task.status == Status.COMPLETED, describe([task])
        started = list(task.events.filter(kind="leg_started"))
        kinds = list(task.events.values_list("kind", flat=True))
        assert len(started) == 1, f"task {task.pk}: {kinds}"
        assert "lease_expired" not in kinds
        # Which worker ran it, and how far its clock was off (its events carry its time).
        pid = int(started[0].actor.split(":")[1])
        accepted = task.events.get(kind="accepted")
        for name, members in pids.items():
            if pid in members:
                offsets[name].append((started[0].created_at - accepted.created_at).total_seconds())
    assert any(o > 50 for o in offsets["worker-ahead"]), offsets
    assert any(o < -50 for o in offsets["worker-behind"]), offsets
