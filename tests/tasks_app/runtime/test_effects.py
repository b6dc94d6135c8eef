"""The effects ledger: intent before the body, outcome after, and legs that died in between."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tasks_app import dispatch, runtime, transitions
from tasks_app.models import Dispatch, Effect, Status, Task
from tasks_app.runtime import LegOutcome
from tests.runtime_toolset import CRASH_IN_EFFECT, RUNS, WorkerDied
from tests.tasks_app.runtime.helpers import (
    answer,
    events,
    leg,
    next_dispatch,
    submit,
    text_of,
)


def crashed_leg(task: Task) -> None:
    """Run a leg whose worker "dies" inside the effect body, then let its lease expire and
    the sweeper dispatch the next leg, as happens after a kill -9."""
    CRASH_IN_EFFECT.add("charge")
    with pytest.raises(WorkerDied):
        runtime.run_leg(task_id=task.pk, dispatch_id=next_dispatch(task))
    assert Effect.objects.get(task=task).state == "intended"
    Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert runtime.redispatch_expired_leases() == 1


def test_an_effect_is_intended_before_its_body_and_confirmed_after(alice) -> None:
    task = submit(alice, "charge")

    assert leg(task) == LegOutcome.COMPLETED

    effect = Effect.objects.get(task=task)
    assert effect.state == "confirmed"
    assert effect.downstream_key == f"{task.pk}:charge:0"
    assert effect.target == "card-1"
    assert effect.detail == {"charge_id": "ch_1"}
    assert effect.settled_at is not None
    assert task.result["structuredContent"] == {
        "key": f"{task.pk}:charge:0",
        "detail": {"charge_id": "ch_1"},
        "done": True,
    }
    assert events(task) == ["leg_started", "effect_intended", "effect_confirmed", "completed"]
    intended = task.events.get(kind="effect_intended")
    assert intended.detail["key"] == effect.downstream_key
    assert (intended.detail["target"], intended.detail["seq"], intended.detail["leg"]) == (
        "card-1",
        0,
        1,
    )


def test_a_failing_body_records_the_effect_failed(alice) -> None:
    task = submit(alice, "charge", fail=True)

    leg(task)

    effect = Effect.objects.get(task=task)
    assert effect.state == "failed"
    assert effect.detail == {
        "error": {
            "type": "ConnectionRefusedError",
            "message": "ConnectionRefusedError: card declined",
        }
    }
    assert task.result["isError"] is True
    assert text_of(task.result) == "ConnectionRefusedError: card declined"


def test_an_effect_interrupted_without_a_verify_hook_waits_for_an_operator(alice) -> None:
    task = submit(alice, "charge")
    crashed_leg(task)

    assert leg(task) == LegOutcome.AWAITING_OPERATOR

    effect = Effect.objects.get(task=task)
    assert effect.state == "unknown"
    assert task.status == Status.WORKING
    assert task.lease_owner == ""
    assert task.status_message.startswith(
        f"Effect 'charge' (key {effect.downstream_key}) may or may not have happened"
    )
    assert "An operator must reconcile it" in task.status_message
    assert events(task)[-3:] == ["leg_started", "effect_unknown", "effect_needs_reconciliation"]
    assert RUNS["charge"] == 1


def test_an_operator_who_says_it_happened_lets_the_task_finish_without_repeating_it(
    alice, operator
) -> None:
    task = submit(alice, "charge")
    crashed_leg(task)
    leg(task)
    effect = Effect.objects.get(task=task)

    runtime.reconcile_effect(effect_id=effect.pk, happened=True, user=operator)

    effect.refresh_from_db()
    assert effect.state == "confirmed"
    assert effect.detail["reconciled"]["by"] == "olga"
    reconciled = task.events.get(kind="effect_reconciled")
    assert (reconciled.actor_type, reconciled.actor, reconciled.detail["happened"]) == (
        "operator",
        "olga",
        True,
    )
    assert leg(task) == LegOutcome.COMPLETED
    assert RUNS["charge"] == 1


def test_an_operator_who_says_it_did_not_happen_gets_it_run_again_with_the_same_key(
    alice, operator
) -> None:
    task = submit(alice, "charge")
    crashed_leg(task)
    leg(task)
    effect = Effect.objects.get(task=task)

    runtime.reconcile_effect(effect_id=effect.pk, happened=False, user=operator)
    assert leg(task) == LegOutcome.COMPLETED

    effect.refresh_from_db()
    assert effect.state == "confirmed"
    assert effect.detail == {"attempts": 2, "charge_id": "ch_1"}
    assert RUNS["charge"] == 2
    assert task.result["structuredContent"]["key"] == effect.downstream_key


def test_only_an_unknown_effect_can_be_reconciled(alice, operator) -> None:
    task = submit(alice, "charge")
    leg(task)

    with pytest.raises(runtime.NotReconcilable, match="effect 'charge' is confirmed"):
        runtime.reconcile_effect(
            effect_id=Effect.objects.get(task=task).pk, happened=False, user=operator
        )


def test_a_decision_is_never_overwritten_before_the_next_leg_acts_on_it(alice, operator) -> None:
    task = submit(alice, "charge")
    crashed_leg(task)
    leg(task)
    effect = Effect.objects.get(task=task)
    runtime.reconcile_effect(effect_id=effect.pk, happened=False, user=operator, note="no")

    with pytest.raises(runtime.NotReconcilable, match="already reconciled by olga"):
        runtime.reconcile_effect(effect_id=effect.pk, happened=True, user=operator)

    effect.refresh_from_db()
    assert (effect.state, effect.detail["reconciled"]["happened"]) == ("unknown", False)
    assert leg(task) == LegOutcome.COMPLETED
    assert RUNS["charge"] == 2  # the decision that stood: run again


def test_verify_saying_it_happened_confirms_the_effect_and_skips_the_body(alice) -> None:
    task = submit(alice, "charge", verify="yes")
    crashed_leg(task)

    assert leg(task) == LegOutcome.COMPLETED

    effect = Effect.objects.get(task=task)
    assert effect.state == "confirmed"
    assert effect.detail == {"verified": True}
    assert RUNS["charge"] == 1
    assert RUNS[f"verify:{effect.downstream_key}"] == 1
    assert events(task)[-4:] == ["leg_started", "effect_unknown", "effect_verified", "completed"]


def test_verify_saying_it_did_not_happen_runs_the_body_again_with_the_same_key(alice) -> None:
    task = submit(alice, "charge", verify="no")
    crashed_leg(task)

    assert leg(task) == LegOutcome.COMPLETED

    effect = Effect.objects.get(task=task)
    assert effect.state == "confirmed"
    assert effect.detail == {"attempts": 2, "charge_id": "ch_1"}
    assert RUNS["charge"] == 2
    assert events(task)[-5:] == [
        "leg_started",
        "effect_unknown",
        "effect_retried",
        "effect_confirmed",
        "completed",
    ]


def test_an_operator_who_confirms_while_verify_runs_is_not_overruled_into_a_rerun(
    alice, operator
) -> None:
    task = submit(alice, "charge", verify="operator_confirms_meanwhile")
    crashed_leg(task)

    assert leg(task) == LegOutcome.COMPLETED

    effect = Effect.objects.get(task=task)
    assert effect.state == "confirmed"
    assert effect.detail["reconciled"]["by"] == "olga"
    assert RUNS["charge"] == 1


def test_a_verify_hook_that_raises_leaves_the_decision_to_an_operator(alice) -> None:
    task = submit(alice, "charge", verify="raise")
    crashed_leg(task)

    assert leg(task) == LegOutcome.AWAITING_OPERATOR

    assert "its verify hook raised ConnectionError: provider unreachable" in task.status_message


def test_no_effect_starts_once_cancellation_is_requested(alice) -> None:
    task = submit(alice, "charge")
    Task.objects.filter(pk=task.pk).update(cancel_requested_at=timezone.now())

    assert leg(task) == LegOutcome.CANCELLED

    assert not Effect.objects.filter(task=task).exists()
    assert RUNS["charge"] == 0


def test_a_cancelled_task_compensates_its_confirmed_effects(alice) -> None:
    task = submit(alice, "charge_then_ask")
    leg(task)
    answer(task, "go", {"action": "accept", "content": {}})
    # Cancellation arrives while the next leg runs (recorded as request_cancel does for a
    # leased task): the replayed effect is not run again, but it is compensated.
    Task.objects.filter(pk=task.pk).update(cancel_requested_at=timezone.now())

    assert leg(task) == LegOutcome.CANCELLED

    effect = Effect.objects.get(task=task)
    assert effect.state == "compensated"
    assert RUNS["reserve"] == 1
    assert RUNS[f"undo:{effect.downstream_key}"] == 1
    assert events(task)[-2:] == ["effect_compensated", "cancelled"]


def test_a_tool_error_after_an_effect_compensates_it(alice) -> None:
    task = submit(alice, "effect_then_fail")

    leg(task)

    assert task.result["isError"] is True
    assert Effect.objects.get(task=task).state == "compensated"


def test_a_question_inside_an_effect_body_is_refused(alice) -> None:
    task = submit(alice, "ask_in_effect")

    leg(task)

    assert Effect.objects.get(task=task).state == "failed"
    assert text_of(task.result) == (
        "RuntimeError: ctx.ask cannot be called inside the body of ctx.effect('send'): "
        "an effect body holds only the side effect"
    )
    assert not task.input_requests.exists()


# --- a task cancelled while it waited: its effects are undone afterwards ----------------------


def test_a_task_cancelled_while_it_waits_is_cancelled_at_once_and_undone_by_a_leg(alice) -> None:
    task = submit(alice, "charge_then_ask")
    assert leg(task) == LegOutcome.SUSPENDED
    effect = Effect.objects.get(task=task)
    assert (effect.state, effect.compensable) == ("confirmed", True)

    transitions.request_cancel(task_id=task.pk, actor_type="client", actor="alice")

    task.refresh_from_db()
    assert task.status == Status.CANCELLED  # at once: nothing was running
    cancelled = task.events.get(kind="cancelled")
    assert cancelled.detail == {"work_stopped": True, "compensating": True}
    assert Effect.objects.get(pk=effect.pk).state == "confirmed"  # not yet undone
    record = Dispatch.objects.get(task=task, consumed_at__isnull=True)
    assert record.reason == "compensate"

    assert leg(task) == LegOutcome.UNDONE

    effect.refresh_from_db()
    assert effect.state == "compensated"
    assert RUNS["reserve"] == 1  # replayed, never run again
    assert RUNS[f"undo:{effect.downstream_key}"] == 1
    assert task.status == Status.CANCELLED
    assert (task.lease_owner, task.lease_expires_at) == ("", None)
    assert events(task)[-5:] == [
        "cancelled",
        "input_closed",
        "leg_started",
        "effect_compensated",
        "undo_finished",
    ]
    assert not task.input_requests.filter(status="pending").exists()
    # Nothing is left to undo: another message for the task does nothing.
    dispatch.enqueue(task, reason="compensate")
    assert leg(task) == LegOutcome.SKIPPED
    assert RUNS[f"undo:{effect.downstream_key}"] == 1


def test_a_task_cancelled_with_nothing_to_undo_dispatches_no_leg(alice) -> None:
    task = submit(alice, "asks_operator")
    leg(task)

    transitions.request_cancel(task_id=task.pk, actor_type="client", actor="alice")

    task.refresh_from_db()
    assert task.status == Status.CANCELLED
    assert task.events.get(kind="cancelled").detail == {"work_stopped": True, "compensating": False}
    assert not Dispatch.objects.filter(task=task, consumed_at__isnull=True).exists()


def test_an_undo_leg_that_died_is_run_again_by_the_sweeper(alice) -> None:
    task = submit(alice, "charge_then_ask")
    leg(task)
    transitions.request_cancel(task_id=task.pk, actor_type="client", actor="alice")
    # A leg took the lease to undo the effect and was killed before it did.
    record = Dispatch.objects.get(task=task, consumed_at__isnull=True)
    record.consumed_at = timezone.now()
    record.save()
    Task.objects.filter(pk=task.pk).update(
        lease_owner="dead:1:abc", lease_expires_at=timezone.now() - timedelta(seconds=1)
    )

    assert runtime.redispatch_expired_leases() == 1

    assert Dispatch.objects.get(task=task, consumed_at__isnull=True).reason == "compensate"
    assert leg(task) == LegOutcome.UNDONE
    assert Effect.objects.get(task=task).state == "compensated"
    assert "lease_expired" in events(task)
