"""The control queue: sweeper, heartbeat, deadlines and purge run on their own worker
process, so legs that fill every pool process of the leg worker never hold them up."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tasks_app import transitions
from tasks_app.models import Dispatch, Task, WorkerHeartbeat
from tests.integration.worker_helpers import runtime_stack, submit, terminal
from tests.live import wait_for

pytestmark = pytest.mark.live


def test_control_jobs_run_while_every_leg_slot_is_busy(transactional_db, settings, alice) -> None:
    with runtime_stack(settings) as stack:  # a leg worker with 2 pool processes
        long = [submit(alice, "sleeper", seconds=60) for _ in range(2)]
        for task in long:
            wait_for(
                "a long leg to start",
                lambda task=task: Task.objects.filter(pk=task.pk).exclude(lease_owner="").exists(),  # type: ignore[misc]
                timeout=30,
            )
        busy_since = timezone.now()
        # A task whose leg died: its lease ran out and its record is consumed. Only the
        # sweeper can bring it back, and both leg slots are taken.
        dead = submit(alice, "noop")
        Task.objects.filter(pk=dead.pk).update(
            lease_owner="dead:1:abc", lease_expires_at=timezone.now() - timedelta(seconds=1), leg=1
        )
        Dispatch.objects.filter(task=dead).update(consumed_at=timezone.now())

        wait_for(
            "the sweeper to expire the dead leg's lease",
            lambda: dead.events.filter(kind="lease_expired").exists(),
            timeout=20,
            explain=lambda: stack.log("control")[-2000:],
        )
        wait_for(
            "a heartbeat while every leg slot is busy",
            lambda: WorkerHeartbeat.objects.filter(seen_at__gt=busy_since).exists(),
            timeout=20,
        )
        assert all(Task.objects.get(pk=t.pk).status == "working" for t in long)
        expired = f"lease expired task={dead.pk}"
        assert expired in stack.log("control")
        assert expired not in stack.log("worker")

        for task in long:
            transitions.request_cancel(task_id=task.pk, actor_type="client", actor="alice")
        for task in [*long, dead]:
            terminal(task, timeout=60)
