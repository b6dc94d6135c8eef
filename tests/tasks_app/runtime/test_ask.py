"""Questions inside a task: suspending the leg, the task's status, and the answers replayed."""

from __future__ import annotations

import pytest
from django.utils import timezone

from elicitations import transitions as elicitations
from elicitations.models import RequestStatus
from tasks_app import transitions
from tasks_app.models import JournalEntry, Status
from tasks_app.runtime import LegOutcome
from tests.tasks_app.runtime.helpers import (
    answer,
    events,
    leg,
    pending,
    submit,
    text_of,
)


def test_a_question_for_the_client_suspends_the_leg_and_requires_input(
    alice, django_capture_on_commit_callbacks
) -> None:
    task = submit(alice, "steps")

    with django_capture_on_commit_callbacks() as callbacks:
        assert leg(task) == LegOutcome.SUSPENDED

    assert task.status == Status.INPUT_REQUIRED
    assert task.status_message == "Approve a?"
    assert (task.lease_owner, task.lease_expires_at) == ("", None)
    [request] = pending(task)
    assert (request.ask_key, request.audience, request.message) == (
        "approve",
        "client",
        "Approve a?",
    )
    entry = JournalEntry.objects.get(task=task, kind="ask")
    assert entry.outcome == {"request": request.key}
    assert events(task) == [
        "leg_started",
        "input_requested",
        "input_required",
        "leg_suspended",
    ]
    assert task.events.get(kind="leg_suspended").detail == {"leg": 1, "waiting_for": ["approve"]}
    assert callbacks == []  # nothing is dispatched while the task waits


def test_an_answer_dispatches_the_leg_that_receives_it(
    alice, django_capture_on_commit_callbacks
) -> None:
    task = submit(alice, "steps")
    leg(task)

    with django_capture_on_commit_callbacks() as callbacks:
        answer(task, "approve", {"action": "accept", "content": {"approve": False}})
    task.refresh_from_db()
    assert task.status == Status.WORKING
    assert len(callbacks) == 1  # the new leg's dispatch record is published after commit

    assert leg(task) == LegOutcome.COMPLETED
    assert task.result["structuredContent"]["content"] == {"approve": False}
    assert task.leg == 2


@pytest.mark.parametrize("action", ["decline", "cancel"])
def test_a_declined_or_cancelled_question_returns_that_action(alice, action) -> None:
    task = submit(alice, "steps")
    leg(task)

    answer(task, "approve", {"action": action})
    leg(task)

    assert task.result["structuredContent"]["action"] == action
    assert task.result["structuredContent"]["content"] == {}


def test_an_expired_question_with_a_default_answers_with_the_default(alice) -> None:
    task = submit(alice, "steps")
    leg(task)
    [request] = pending(task)
    type(request).objects.filter(pk=request.pk).update(
        on_timeout="default",
        default_answer={"approve": True},
        deadline=timezone.now() - timezone.timedelta(seconds=1),
    )

    assert elicitations.expire_overdue() == 1
    leg(task)

    assert task.result["structuredContent"]["action"] == "accept"
    assert task.result["structuredContent"]["content"] == {"approve": True}


def test_an_expired_question_with_on_timeout_fail_ends_the_task_without_another_leg(
    alice,
) -> None:
    task = submit(alice, "steps")
    leg(task)
    [request] = pending(task)
    type(request).objects.filter(pk=request.pk).update(
        on_timeout="fail", deadline=timezone.now() - timezone.timedelta(seconds=1)
    )

    elicitations.expire_overdue()
    task.refresh_from_db()

    assert task.status == Status.FAILED
    assert task.dispatches.filter(consumed_at__isnull=True).count() == 0


def test_an_operator_question_keeps_the_task_working_with_a_status_message(alice) -> None:
    task = submit(alice, "asks_operator")

    assert leg(task) == LegOutcome.SUSPENDED

    assert task.status == Status.WORKING
    assert task.status_message == "Waiting for an operator in the inbox: Let it through?"
    assert task.lease_owner == ""
    assert "input_required" not in events(task)
    [request] = pending(task)
    assert request.audience == "operator"


def test_an_operator_answer_resumes_the_working_task(alice, operator) -> None:
    from elicitations.models import Channel

    task = submit(alice, "asks_operator")
    leg(task)

    answer(task, "ok", {"action": "accept", "content": {"ok": True}}, channel=Channel.INBOX,
           user=operator)  # fmt: skip
    assert leg(task) == LegOutcome.COMPLETED

    assert text_of(task.result) == "accept {'ok': True}"


def test_questions_asked_together_are_all_pending_at_once(alice, operator) -> None:
    from elicitations.models import Channel

    task = submit(alice, "asks_two")

    leg(task)

    assert task.status == Status.INPUT_REQUIRED  # one of them is the client's
    assert [r.ask_key for r in pending(task)] == ["client_ok", "operator_ok"]
    answer(task, "client_ok", {"action": "accept", "content": {"ok": True}})
    # Only the operator's question is left: a leg replays up to it and waits as working.
    assert leg(task) == LegOutcome.SUSPENDED
    assert task.status == Status.WORKING
    assert task.status_message == "Waiting for an operator in the inbox: Operator, ok?"
    assert [r.ask_key for r in pending(task)] == ["operator_ok"]
    answer(task, "operator_ok", {"action": "decline"}, channel=Channel.INBOX, user=operator)
    assert leg(task) == LegOutcome.COMPLETED
    assert task.result["structuredContent"] == {"client_ok": "accept", "operator_ok": "decline"}


def test_a_schema_outside_mcps_subset_is_refused_at_ask_time(alice) -> None:
    task = submit(alice, "bad_schema")

    assert leg(task) == LegOutcome.COMPLETED

    assert text_of(task.result).startswith("refused: ")
    assert "a" in text_of(task.result)
    assert not task.input_requests.exists()
    assert not JournalEntry.objects.filter(task=task).exists()


def test_a_task_waiting_for_input_is_cancelled_at_once(alice) -> None:
    task = submit(alice, "steps")
    leg(task)

    transitions.request_cancel(task_id=task.pk, actor_type="client", actor="alice")

    task.refresh_from_db()
    assert task.status == Status.CANCELLED
    assert task.input_requests.get().status == RequestStatus.CANCELLED
    assert events(task)[-3:] == ["cancel_requested", "cancelled", "input_closed"]


def test_a_cancellation_requested_during_a_leg_stops_it_at_the_question(alice) -> None:
    from tasks_app.models import Task

    task = submit(alice, "steps")
    Task.objects.filter(pk=task.pk).update(cancel_requested_at=timezone.now())

    assert leg(task) == LegOutcome.CANCELLED

    assert not task.input_requests.exists()
