"""Questions of a task whose client cannot answer them: to the inbox, or the task fails."""

from __future__ import annotations

import pytest

from elicitations import transitions as elicitations
from elicitations.models import Channel
from tasks_app.models import JournalEntry, Status, Task
from tasks_app.runtime import LegOutcome
from tests.tasks_app.runtime.helpers import answer, events, leg, pending, submit, text_of


def declared(task: Task, client_answers: str | None) -> Task:
    """TASK as if its call had declared CLIENT_ANSWERS (``Task.client_answers``)."""
    Task.objects.filter(pk=task.pk).update(client_answers=client_answers)
    return task


def test_a_question_for_the_client_fails_the_task_at_once_naming_the_capability(alice) -> None:
    task = declared(submit(alice, "steps"), "")

    assert leg(task) == LegOutcome.FAILED

    assert task.status == Status.FAILED
    assert task.error == {
        "code": -32021,
        "message": "Question 'approve' cannot be asked: the client declared no elicitation "
        "capability (form mode); this question can only be answered by the client",
        "data": {
            "requiredCapabilities": {"elicitation": {"form": {}}},
            "reason": "client_cannot_answer",
            "question": "approve",
        },
    }
    assert not task.input_requests.exists()
    assert not JournalEntry.objects.filter(task=task, kind="ask").exists()
    assert events(task) == ["leg_started", "failed"]


def test_the_demo_confirmation_fails_for_a_client_without_elicitation(alice) -> None:
    task = declared(submit(alice, "confirm_action", action="deploy"), "")

    assert leg(task) == LegOutcome.FAILED

    assert "the client declared no elicitation capability (form mode)" in task.error["message"]


def test_a_question_operators_may_answer_waits_in_the_inbox(alice, operator) -> None:
    task = declared(submit(alice, "asks_anyone"), "")

    assert leg(task) == LegOutcome.SUSPENDED

    assert task.status == Status.WORKING  # never input_required: the client cannot answer
    assert task.status_message == "Waiting for an operator in the inbox: Let it through?"
    [request] = pending(task)
    assert request.audience == "operator"
    refused = elicitations.answer(
        task=task,
        key=request.key,
        response={"action": "accept", "content": {"ok": True}},
        channel=Channel.TASKS_UPDATE,
        client=alice,
    )
    assert refused.outcome == elicitations.AnswerResult.NOT_ALLOWED
    answer(task, "ok", {"action": "accept", "content": {"ok": True}}, channel=Channel.INBOX,
           user=operator)  # fmt: skip
    assert leg(task) == LegOutcome.COMPLETED
    assert text_of(task.result) == "accept {'ok': True}"


def test_a_url_question_fails_for_a_client_without_url_mode(alice) -> None:
    task = declared(submit(alice, "asks_anyone", mode="url"), "form")

    assert leg(task) == LegOutcome.FAILED

    assert task.error["message"] == (
        "Question 'consent' cannot be asked: the client declared elicitation without url mode; "
        "this question can only be answered by the client (operators do not answer URL-mode "
        "questions)"
    )
    assert task.error["data"]["requiredCapabilities"] == {"elicitation": {"url": {}}}


def test_a_tool_may_catch_it_and_go_on_without_the_answer(alice) -> None:
    task = declared(submit(alice, "asks_or_goes_on"), "")

    assert leg(task) == LegOutcome.COMPLETED

    assert text_of(task.result) == (
        "went on without an answer (needs {'elicitation': {'form': {}}})"
    )
    assert not task.input_requests.exists()


@pytest.mark.parametrize("declares", ["form", "form url", None])
def test_a_client_that_can_answer_is_asked(alice, declares) -> None:
    task = declared(submit(alice, "asks_anyone"), declares)

    assert leg(task) == LegOutcome.SUSPENDED

    assert task.status == Status.INPUT_REQUIRED
    assert [r.audience for r in pending(task)] == ["any"]
