"""Run again: a new task with the same tool and arguments, linked both ways; with reuse it
replays what the original's journal recorded (an applied effect is not applied again)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks_app import audit, rerun
from tasks_app.models import AuditEntry, Effect, Status, Task
from tasks_app.runtime import LegOutcome
from tasks_app.tools.toolsets.demo.models import DemoRefund
from tests.tasks_app.runtime.helpers import events, leg, next_dispatch, submit


@pytest.fixture
def failed(alice, operator, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A refund_then_receipt task that refunded, then failed at its receipt step."""
    flag = tmp_path / "receipt-down"
    flag.touch()
    task = submit(alice, "refund_then_receipt", payment_id="pay_7", receipt_down_flag=str(flag))
    leg(task)
    assert task.status == Status.COMPLETED and task.is_error, task.result  # a tool error
    assert Effect.objects.get(task=task).state == "confirmed"
    flag.unlink()  # the receipt service is back
    return task


def who(user) -> audit.Who:  # type: ignore[no-untyped-def]
    return audit.Who(user, user.get_username(), "192.0.2.9")


def test_with_reuse_the_applied_effect_is_replayed_not_applied_again(failed, operator) -> None:
    planned = rerun.plan(failed)
    assert planned.reuse_by_default and not planned.blocked
    assert [e.name for e in planned.applied] == ["refund"] and planned.reusable == 1
    assert planned.key == f"{failed.pk}~rerun-1"

    again = rerun.run_again(failed, reuse=True, who=who(operator))
    assert leg(again) == LegOutcome.COMPLETED

    assert again.status == Status.COMPLETED and again.rerun_of == failed
    refund = DemoRefund.objects.get()  # one refund in the provider, never asked again
    assert refund.refused_calls == 0 and refund.downstream_key == f"{failed.pk}:refund:0"
    reused = Effect.objects.get(task=again)
    assert reused.state == "confirmed" and reused.detail["reused"]["task"] == failed.pk
    assert "effect_intended" not in events(again)
    assert events(again)[:2] == ["accepted", "run_again_from"]
    assert failed.events.get(kind="ran_again").detail["rerun"] == again.pk
    [entry] = AuditEntry.objects.filter(action="task.rerun")
    assert entry.detail["new_task"] == again.pk and entry.detail["reuse"] is True


def test_without_reuse_the_effect_runs_again(failed, operator) -> None:
    again = rerun.run_again(failed, reuse=False, who=who(operator))
    leg(again)

    assert again.status == Status.COMPLETED
    assert DemoRefund.objects.count() == 2  # a second refund: its own downstream key
    assert Effect.objects.get(task=again).downstream_key == f"{again.pk}:refund:0"


def test_a_second_run_again_gets_the_next_key_and_a_resubmitted_one_the_same_task(
    failed, operator
) -> None:
    first = rerun.run_again(failed, reuse=True, who=who(operator))
    same = rerun.run_again(failed, reuse=True, who=who(operator), key=first.idempotency_key)
    second = rerun.run_again(failed, reuse=True, who=who(operator))

    assert same.pk == first.pk
    assert (first.idempotency_key, second.idempotency_key) == (
        f"{failed.pk}~rerun-1",
        f"{failed.pk}~rerun-2",
    )
    assert set(failed.reruns.values_list("pk", flat=True)) == {first.pk, second.pk}


def test_an_unknown_effect_or_an_unfinished_task_blocks_it(alice, operator) -> None:
    task = submit(alice, "charge")
    blocked = rerun.plan(task).blocked
    assert "has not finished" in blocked
    leg(task)
    Effect.objects.filter(task=task).update(state="unknown")
    assert "settle it" in rerun.plan(task).blocked
    with pytest.raises(rerun.NotRerunnable):
        rerun.run_again(task, reuse=True, who=who(operator))
    assert not Task.objects.filter(rerun_of=task).exists()


def test_a_completed_task_runs_from_scratch_by_default(alice, operator) -> None:
    task = submit(alice, "charge")
    leg(task)
    assert not rerun.plan(task).reuse_by_default
    again = rerun.run_again(task, reuse=False, who=who(operator))
    assert next_dispatch(again)


def test_run_all_matching_again_from_the_shell_reuses_by_default(
    alice, operator, tmp_path: Path
) -> None:
    import json
    from io import StringIO

    from django.core.management import call_command

    from tasks_app.models import BulkAction

    flag = tmp_path / "down"
    flag.touch()
    tasks = [
        submit(alice, "refund_then_receipt", payment_id=f"pay_{i}", receipt_down_flag=str(flag))
        for i in range(3)
    ]
    for task in tasks:
        leg(task)
    flag.unlink()
    unsettled = submit(alice, "charge")
    leg(unsettled)
    Effect.objects.filter(task=unsettled).update(state="unknown")

    dry = StringIO()
    call_command("tasks", "rerun", "--outcome", "tool_error", "--dry-run", "--json", stdout=dry)
    assert json.loads(dry.getvalue())["ran_again"] == 3
    done = StringIO()
    call_command("tasks", "rerun", "--status", "completed", "--json", "--actor", "ops", stdout=done)
    report = json.loads(done.getvalue())

    assert (report["matched"], report["ran_again"], report["skipped"]) == (4, 3, 1)
    for task in tasks:
        again = Task.objects.get(rerun_of=task)
        assert again.idempotency_key == f"{task.pk}~bulk-{report['bulk']}"
        assert leg(again) == LegOutcome.COMPLETED
    assert DemoRefund.objects.count() == 3  # each refund once, replayed by its run again
    assert not Task.objects.filter(rerun_of=unsettled).exists()
    action = BulkAction.objects.get(pk=report["bulk"])
    assert action.items.get(task_id=unsettled.pk).outcome == "skipped"
    assert AuditEntry.objects.filter(action="bulk.rerun").count() == 1
    assert not AuditEntry.objects.filter(action="task.rerun").exists()
