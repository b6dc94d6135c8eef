from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.utils import timezone

from elicitations.models import InputRequest, RequestStatus
from tasks_app import transitions
from tasks_app.models import Dispatch, Status, Task, TaskEvent

TERMINAL = {Status.COMPLETED, Status.FAILED, Status.CANCELLED}


@pytest.fixture
def task(alice):  # type: ignore[no-untyped-def]
    return Task.objects.create(client=alice, tool_name="slow_echo", arguments={"text": "hi"})


@pytest.mark.parametrize(("old", "new"), list(itertools.product(Status.values, Status.values)))
def test_the_allowed_table_is_exactly_the_spec(old: str, new: str) -> None:
    expected = (
        old not in TERMINAL
        and new != old
        and (new in TERMINAL or {old, new} == {Status.WORKING, Status.INPUT_REQUIRED})
    )
    assert transitions.is_allowed(old, new) is expected


def test_complete_stores_the_result_and_writes_an_event(task) -> None:  # type: ignore[no-untyped-def]
    result = {"content": [{"type": "text", "text": "hi"}], "isError": False}

    transitions.complete(task_id=task.pk, result=result, actor="w1")

    task.refresh_from_db()
    assert (task.status, task.result, task.is_error) == (Status.COMPLETED, result, False)
    assert task.finished_at is not None
    event = TaskEvent.objects.get(task=task)
    assert (event.kind, event.old_status, event.new_status, event.actor) == (
        "completed",
        "working",
        "completed",
        "w1",
    )


def test_a_tool_error_is_marked_on_the_task_row(task) -> None:  # type: ignore[no-untyped-def]
    result = {"content": [{"type": "text", "text": "Refund declined"}], "isError": True}

    transitions.complete(task_id=task.pk, result=result, actor="w1")

    task.refresh_from_db()
    assert (task.status, task.is_error) == (Status.COMPLETED, True)
    assert Task.objects.filter(is_error=True).get() == task


def test_fail_keeps_the_error_and_explains_it(task) -> None:  # type: ignore[no-untyped-def]
    transitions.fail(task_id=task.pk, error={"code": -32603, "message": "upstream down"})

    task.refresh_from_db()
    assert task.status == Status.FAILED
    assert task.error == {"code": -32603, "message": "upstream down"}
    assert task.status_message == "upstream down"


@pytest.mark.parametrize("terminal", sorted(TERMINAL))
def test_terminal_states_never_change(task, terminal: str) -> None:  # type: ignore[no-untyped-def]
    Task.objects.filter(pk=task.pk).update(status=terminal)

    for move in (
        lambda: transitions.complete(task_id=task.pk, result={"content": []}),
        lambda: transitions.fail(task_id=task.pk, error={"code": -32603, "message": "x"}),
        lambda: transitions.cancel(task_id=task.pk),
        lambda: transitions.require_input(task_id=task.pk),
        lambda: transitions.resume(task_id=task.pk, actor_type="client"),
    ):
        with pytest.raises(transitions.InvalidTransition):
            move()
    task.refresh_from_db()
    assert task.status == terminal
    assert not TaskEvent.objects.filter(task=task).exists()


def test_resume_moves_back_to_working_and_dispatches_a_leg(
    task, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    transitions.require_input(task_id=task.pk, message="waiting for you")

    with django_capture_on_commit_callbacks() as callbacks:
        transitions.resume(task_id=task.pk, actor_type="client", actor="alice")

    task.refresh_from_db()
    assert task.status == Status.WORKING
    assert task.status_message == ""
    assert Dispatch.objects.filter(task=task, reason="answered").count() == 1
    assert len(callbacks) == 1
    assert list(TaskEvent.objects.filter(task=task).values_list("kind", flat=True)) == [
        "input_required",
        "resumed",
    ]


def test_a_cancel_request_on_a_task_waiting_for_input_cancels_it_at_once(task) -> None:  # type: ignore[no-untyped-def]
    transitions.require_input(task_id=task.pk)
    InputRequest.objects.create(task=task, key="k1", ask_key="confirm", message="Sure?")

    transitions.request_cancel(task_id=task.pk, actor_type="client", actor="alice")

    task.refresh_from_db()
    assert task.status == Status.CANCELLED
    assert task.cancel_requested_at is not None
    assert InputRequest.objects.get().status == RequestStatus.CANCELLED
    kinds = list(TaskEvent.objects.filter(task=task).values_list("kind", flat=True))
    assert kinds == ["input_required", "cancel_requested", "cancelled", "input_closed"]


def test_a_cancel_request_on_a_running_leg_only_records_the_request(task) -> None:  # type: ignore[no-untyped-def]
    Task.objects.filter(pk=task.pk).update(lease_owner="worker-1")

    transitions.request_cancel(task_id=task.pk, actor_type="client", actor="alice")

    task.refresh_from_db()
    assert task.status == Status.WORKING
    assert task.cancel_requested_at is not None
    assert TaskEvent.objects.get(task=task).kind == "cancel_requested"


def test_a_cancel_request_on_a_terminal_task_is_recorded_and_changes_nothing(task) -> None:  # type: ignore[no-untyped-def]
    transitions.complete(task_id=task.pk, result={"content": [], "isError": False})

    transitions.request_cancel(task_id=task.pk, actor_type="client", actor="alice")

    task.refresh_from_db()
    assert task.status == Status.COMPLETED
    assert task.cancel_requested_at is None
    assert TaskEvent.objects.filter(task=task, kind="cancel_requested").count() == 1


def test_a_concurrently_deleted_task_is_reported(task) -> None:  # type: ignore[no-untyped-def]
    Task.objects.filter(pk=task.pk).delete()

    with pytest.raises(Task.DoesNotExist):
        transitions.complete(task_id=task.pk, result={"content": []})


@pytest.mark.parametrize("end", ["complete", "fail", "cancel"])
def test_the_leg_holding_the_lease_ends_its_task_and_closes_open_questions(task, end: str) -> None:  # type: ignore[no-untyped-def]
    live = timezone.now() + timedelta(seconds=30)
    Task.objects.filter(pk=task.pk).update(lease_owner="worker-1", leg=1, lease_expires_at=live)
    InputRequest.objects.create(task=task, key="b", ask_key="approve", message="Approve?")
    InputRequest.objects.create(task=task, key="a", ask_key="note", message="Note?")
    moves = {
        "complete": lambda: transitions.complete(
            task_id=task.pk, result={"content": [], "isError": True}, actor="w",
            lease_owner="worker-1", lease_leg=1,
        ),
        "fail": lambda: transitions.fail(
            task_id=task.pk, error={"code": -32603, "message": "boom"}, actor="w",
            lease_owner="worker-1", lease_leg=1,
        ),
        "cancel": lambda: transitions.cancel(
            task_id=task.pk, actor="w", lease_owner="worker-1", lease_leg=1
        ),
    }  # fmt: skip

    moves[end]()

    task.refresh_from_db()
    expected = {"complete": Status.COMPLETED, "fail": Status.FAILED, "cancel": Status.CANCELLED}
    assert task.status == expected[end]
    assert (task.lease_owner, task.lease_expires_at) == ("", None)
    assert task.finished_at is not None
    assert set(InputRequest.objects.values_list("status", flat=True)) == {RequestStatus.CANCELLED}
    ended, closed = TaskEvent.objects.filter(task=task)
    assert (ended.kind, ended.old_status, ended.new_status, ended.actor, ended.actor_type) == (
        {"complete": "completed", "fail": "failed", "cancel": "cancelled"}[end],
        "working",
        expected[end],
        "w",
        "worker",
    )
    assert closed.kind == "input_closed"
    assert closed.detail == {"keys": ["a", "b"], "reason": expected[end]}
    if end == "complete":
        assert (task.result, ended.detail) == ({"content": [], "isError": True}, {"is_error": True})
        assert task.is_error  # written by the hot path's end, as by the ORM's
    if end == "fail":
        assert (task.error["message"], task.status_message, ended.detail) == (
            "boom",
            "boom",
            {"code": -32603},
        )


def test_a_leg_that_lost_its_lease_ends_nothing(task) -> None:  # type: ignore[no-untyped-def]
    live = timezone.now() + timedelta(seconds=30)
    Task.objects.filter(pk=task.pk).update(lease_owner="worker-2", leg=2, lease_expires_at=live)

    with pytest.raises(transitions.LeaseLost):
        transitions.complete(
            task_id=task.pk, result={"content": []}, lease_owner="worker-1", lease_leg=1
        )

    task.refresh_from_db()
    assert (task.status, task.lease_owner) == (Status.WORKING, "worker-2")
    assert not TaskEvent.objects.filter(task=task).exists()


@pytest.mark.parametrize("lease", ["expired", "other generation"])
def test_a_leg_whose_fence_fails_ends_nothing(task, lease: str) -> None:  # type: ignore[no-untyped-def]
    # The same owner name, but the lease ran out by the database's clock, or its generation
    # (the fencing token) moved on: the end is refused either way.
    offset = -1 if lease == "expired" else 30
    until = timezone.now() + timedelta(seconds=offset)
    Task.objects.filter(pk=task.pk).update(lease_owner="worker-1", leg=3, lease_expires_at=until)
    leg = 3 if lease == "expired" else 2

    with pytest.raises(transitions.LeaseLost):
        transitions.fail(
            task_id=task.pk,
            error={"code": 1, "message": "x"},
            lease_owner="worker-1",
            lease_leg=leg,
        )

    task.refresh_from_db()
    assert (task.status, task.lease_owner, task.leg) == (Status.WORKING, "worker-1", 3)
    assert not TaskEvent.objects.filter(task=task).exists()
