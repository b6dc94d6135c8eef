"""transitions.answer: the first valid answer wins, through whichever channel."""

from __future__ import annotations

import threading
from unittest import mock

import pytest
from django.db import connection

from elicitations import transitions
from elicitations.models import InputRequest
from elicitations.transitions import AnswerResult
from tasks_app import transitions as task_transitions
from tasks_app.models import Dispatch, Task, TaskEvent
from tasks_app.operators import grant_role

APPROVE = {"action": "accept", "content": {"approve": True, "note": "ok"}}


def kinds(task: Task) -> list[str]:
    return list(TaskEvent.objects.filter(task=task).values_list("kind", flat=True))


def test_an_operator_approves_in_the_inbox(
    task, ask, operator, django_capture_on_commit_callbacks
) -> None:
    request = ask()
    with django_capture_on_commit_callbacks() as callbacks:
        outcome = transitions.answer(
            task=task, key=request.key, response=APPROVE, channel="inbox", user=operator
        )

    assert outcome.outcome is AnswerResult.RECORDED and outcome.resumed
    row = InputRequest.objects.get(pk=request.pk)
    assert row.status == "answered"
    assert row.answer == APPROVE
    assert row.channel == "inbox"
    assert row.answered_by_user == operator
    assert row.answered_by_client is None
    assert row.answered_at is not None
    answered = TaskEvent.objects.get(task=task, kind="input_answered")
    assert (answered.actor_type, answered.actor) == ("operator", "olga")
    assert answered.detail == {
        "key": request.key,
        "action": "accept",
        "channel": "inbox",
        "content": {"approve": True, "note": "ok"},
    }
    # The task waited for an operator while "working"; a new leg is dispatched after commit.
    assert kinds(task)[-1] == "resumed"
    assert Dispatch.objects.filter(task=task, reason="answered").count() == 1
    assert len(callbacks) == 1


def test_a_client_answer_moves_the_task_back_to_working(task, ask, alice) -> None:
    request = ask(audience="client", message="Confirm?", schema=None)
    task_transitions.require_input(task_id=task.pk, message="a question is waiting")

    outcome = transitions.answer(
        task=task,
        key=request.key,
        response={"action": "accept", "content": {}},
        channel="tasks/update",
        client=alice,
    )

    assert outcome.recorded
    task.refresh_from_db()
    assert task.status == "working"
    row = InputRequest.objects.get(pk=request.pk)
    assert (row.answered_by_client, row.answered_by_user, row.channel) == (
        alice,
        None,
        "tasks/update",
    )


@pytest.mark.parametrize(("action", "status"), [("decline", "declined"), ("cancel", "cancelled")])
def test_decline_and_cancel_drop_any_content(task, ask, operator, action, status) -> None:
    request = ask()
    response = {"action": action, "content": {"approve": True}}
    outcome = transitions.answer(
        task=task, key=request.key, response=response, channel="inbox", user=operator
    )
    assert outcome.recorded and outcome.resumed
    row = InputRequest.objects.get(pk=request.pk)
    assert (row.status, row.answer) == (status, {"action": action})


def test_a_second_answer_changes_nothing_and_is_recorded(
    task, ask, operator, django_user_model
) -> None:
    request = ask()
    transitions.answer(task=task, key=request.key, response=APPROVE, channel="inbox", user=operator)
    second = django_user_model.objects.create_user(username="sam", password="pw-sam-12345")
    task.client.tenant.members.add(second)
    grant_role(second, "answerer")

    outcome = transitions.answer(
        task=task, key=request.key, response={"action": "decline"}, channel="inbox", user=second
    )

    assert outcome.outcome is AnswerResult.ALREADY_ANSWERED
    assert outcome.request is not None
    assert outcome.request.answered_by == "olga"
    row = InputRequest.objects.get(pk=request.pk)
    assert (row.status, row.answer, row.answered_by_user) == ("answered", APPROVE, operator)
    ignored = TaskEvent.objects.get(task=task, kind="input_answer_ignored")
    assert ignored.actor == "sam"
    assert ignored.detail == {
        "key": request.key,
        "action": "decline",
        "channel": "inbox",
        "reason": "already answered",
        "answered_by": "olga",
    }
    assert Dispatch.objects.filter(task=task).count() == 1


def test_an_invalid_client_answer_stays_pending_and_says_why(task, ask, alice) -> None:
    request = ask(audience="client")
    task_transitions.require_input(task_id=task.pk, message="a question is waiting")

    outcome = transitions.answer(
        task=task,
        key=request.key,
        response={"action": "accept", "content": {"approve": "sure", "note": "x" * 201}},
        channel="tasks/update",
        client=alice,
    )

    errors = ("approve: must be true or false", "note: must be at most 200 characters long")
    assert (outcome.outcome, outcome.errors) == (AnswerResult.INVALID, errors)
    assert InputRequest.objects.get(pk=request.pk).status == "pending"
    task.refresh_from_db()
    assert task.status == "input_required"
    assert task.status_message == (
        f"The answer to {request.key} was not accepted: "
        "approve: must be true or false; note: must be at most 200 characters long"
    )
    rejected = TaskEvent.objects.get(task=task, kind="input_answer_rejected")
    assert rejected.detail["errors"] == list(errors)
    assert not Dispatch.objects.exists()


def test_an_invalid_inbox_answer_leaves_the_clients_status_message_alone(
    task, ask, operator
) -> None:
    request = ask()
    task_transitions.set_status_message(task_id=task.pk, message="waiting for approval")
    outcome = transitions.answer(
        task=task,
        key=request.key,
        response={"action": "accept", "content": {}},
        channel="inbox",
        user=operator,
    )
    assert outcome.errors == ("approve: is required",)
    task.refresh_from_db()
    assert task.status_message == "waiting for approval"
    assert "input_answer_rejected" in kinds(task)


@pytest.mark.parametrize("response", [None, "accept", {"action": "approve"}, {}])
def test_a_malformed_response_is_invalid(task, ask, operator, response) -> None:
    request = ask()
    outcome = transitions.answer(
        task=task, key=request.key, response=response, channel="inbox", user=operator
    )
    assert outcome.outcome is AnswerResult.INVALID
    assert InputRequest.objects.get(pk=request.pk).status == "pending"


def test_unknown_keys_are_ignored_without_a_trace(task, ask, alice) -> None:
    ask(audience="client")
    before = kinds(task)
    outcome = transitions.answer(
        task=task, key="nope", response=APPROVE, channel="tasks/update", client=alice
    )
    assert outcome.outcome is AnswerResult.UNKNOWN_KEY
    assert kinds(task) == before


def test_the_client_cannot_answer_an_operator_question(task, ask, alice) -> None:
    request = ask(audience="operator")
    outcome = transitions.answer(
        task=task, key=request.key, response=APPROVE, channel="tasks/update", client=alice
    )
    assert (outcome.outcome, outcome.errors) == (
        AnswerResult.NOT_ALLOWED,
        ("this question is for an operator",),
    )
    assert InputRequest.objects.get(pk=request.pk).status == "pending"
    assert TaskEvent.objects.get(task=task, kind="input_answer_refused").actor == "alice"


def test_another_client_cannot_answer(task, ask, bob) -> None:
    request = ask(audience="client")
    outcome = transitions.answer(
        task=task, key=request.key, response=APPROVE, channel="tasks/update", client=bob
    )
    assert outcome.errors == ("the task belongs to another client",)
    assert InputRequest.objects.get(pk=request.pk).status == "pending"


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"audience": "client"}, "this question is for the MCP client"),
        (
            {"audience": "any", "mode": "url", "schema": None, "url": "https://x.example/"},
            "URL-mode questions are answered in the MCP client",
        ),
    ],
)
def test_the_inbox_cannot_answer_client_questions(task, ask, operator, options, reason) -> None:
    request = ask(**options)
    outcome = transitions.answer(
        task=task, key=request.key, response=APPROVE, channel="inbox", user=operator
    )
    assert outcome.errors == (reason,)
    assert InputRequest.objects.get(pk=request.pk).status == "pending"


def test_an_operator_outside_the_tenant_cannot_answer(task, ask, outsider) -> None:
    request = ask()
    outcome = transitions.answer(
        task=task, key=request.key, response=APPROVE, channel="inbox", user=outsider
    )
    assert outcome.errors == ("the operator is not a member of the task's tenant",)
    assert InputRequest.objects.get(pk=request.pk).status == "pending"


def test_a_superuser_may_answer_any_tenant(task, ask, django_user_model) -> None:
    root = django_user_model.objects.create_superuser(username="root", password="pw-root-123")
    outcome = transitions.answer(
        task=task, key=ask().key, response=APPROVE, channel="inbox", user=root
    )
    assert outcome.recorded


def test_any_audience_is_answered_by_whoever_comes_first(task, ask, alice, operator) -> None:
    request = ask(audience="any")
    first = transitions.answer(
        task=task, key=request.key, response=APPROVE, channel="tasks/update", client=alice
    )
    second = transitions.answer(
        task=task, key=request.key, response=APPROVE, channel="inbox", user=operator
    )
    assert (first.outcome, second.outcome) == (AnswerResult.RECORDED, AnswerResult.ALREADY_ANSWERED)
    assert InputRequest.objects.get(pk=request.pk).answered_by_client == alice


def test_the_task_resumes_only_when_nothing_is_pending(task, ask, alice) -> None:
    one, two = ask(audience="client", ask_key="one"), ask(audience="client", ask_key="two")
    task_transitions.require_input(task_id=task.pk, message="two questions")

    first = transitions.answer(
        task=task, key=one.key, response=APPROVE, channel="tasks/update", client=alice
    )
    task.refresh_from_db()
    assert (first.resumed, task.status) == (False, "input_required")

    second = transitions.answer(
        task=task, key=two.key, response=APPROVE, channel="tasks/update", client=alice
    )
    task.refresh_from_db()
    assert (second.resumed, task.status) == (True, "working")
    assert Dispatch.objects.filter(task=task).count() == 1


def test_a_question_of_a_cancelled_task_is_closed(task, ask, operator) -> None:
    request = ask()
    task_transitions.require_input(task_id=task.pk)
    task_transitions.request_cancel(task_id=task.pk, actor_type="client", actor="alice")

    outcome = transitions.answer(
        task=task, key=request.key, response=APPROVE, channel="inbox", user=operator
    )

    assert outcome.outcome is AnswerResult.ALREADY_ANSWERED
    assert InputRequest.objects.get(pk=request.pk).status == "cancelled"
    assert not Dispatch.objects.exists()


def test_the_compare_and_set_refuses_a_request_settled_mid_flight(task, ask, operator) -> None:
    """A row changed between the read and the update (the CAS guard) is not overwritten."""
    request = ask()
    real_check = transitions._check_response

    def settle_elsewhere(req, response):  # type: ignore[no-untyped-def]
        InputRequest.objects.filter(pk=req.pk).update(
            status="declined", answer={"action": "decline"}, channel="tasks/update"
        )
        return real_check(req, response)

    with mock.patch.object(transitions, "_check_response", settle_elsewhere):
        outcome = transitions.answer(
            task=task, key=request.key, response=APPROVE, channel="inbox", user=operator
        )

    assert outcome.outcome is AnswerResult.ALREADY_ANSWERED
    row = InputRequest.objects.get(pk=request.pk)
    assert (row.status, row.answer, row.answered_by_user) == (
        "declined",
        {"action": "decline"},
        None,
    )
    assert "input_answered" not in kinds(task)
    assert not Dispatch.objects.exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_answers_have_exactly_one_winner(alice, operator) -> None:
    task = Task.objects.create(client=alice, tool_name="refund_payment", arguments={})
    request = transitions.open_request(
        task=task,
        ask_key="approval",
        message="Approve?",
        schema={"type": "object", "properties": {"approve": {"type": "boolean"}}},
        audience="any",
    )
    barrier = threading.Barrier(6)
    outcomes: list[AnswerResult] = []

    def answer(i: int) -> None:
        try:
            barrier.wait()
            response = {"action": "accept", "content": {"approve": i % 2 == 0}}
            if i % 2:
                out = transitions.answer(
                    task=task,
                    key=request.key,
                    response=response,
                    channel="tasks/update",
                    client=alice,
                )
            else:
                out = transitions.answer(
                    task=task, key=request.key, response=response, channel="inbox", user=operator
                )
            outcomes.append(out.outcome)
        finally:
            connection.close()

    threads = [threading.Thread(target=answer, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(outcomes) == sorted([AnswerResult.RECORDED] + [AnswerResult.ALREADY_ANSWERED] * 5)
    assert Dispatch.objects.filter(task=task).count() == 1
    assert TaskEvent.objects.filter(task=task, kind="input_answered").count() == 1
    assert TaskEvent.objects.filter(task=task, kind="input_answer_ignored").count() == 5


def test_once_only_operator_questions_are_left_the_task_stops_waiting_on_the_client(
    task, ask, alice, operator
) -> None:
    approval = ask()  # operator-only
    confirm = ask(ask_key="confirm", audience="client", message="Go ahead?", schema=None)
    task_transitions.require_input(task_id=task.pk, message="Go ahead?")

    outcome = transitions.answer(
        task=task,
        key=confirm.key,
        response={"action": "accept", "content": {}},
        channel="tasks/update",
        client=alice,
    )

    # input_required would promise the client a question it can answer; there is none left.
    assert outcome.resumed
    task.refresh_from_db()
    assert task.status == "working"
    assert InputRequest.objects.get(pk=approval.pk).status == "pending"
    assert Dispatch.objects.filter(task=task, reason="answered").count() == 1


def test_a_client_question_left_keeps_the_task_waiting_on_the_client(task, ask, alice) -> None:
    first = ask(ask_key="first", audience="client", message="First?", schema=None)
    ask(ask_key="second", audience="any", message="Second?", schema=None)
    task_transitions.require_input(task_id=task.pk, message="First?")

    outcome = transitions.answer(
        task=task,
        key=first.key,
        response={"action": "accept", "content": {}},
        channel="tasks/update",
        client=alice,
    )

    assert outcome.recorded and not outcome.resumed
    task.refresh_from_db()
    assert task.status == "input_required"


def test_a_recorded_answer_counts_in_its_tasks_stored_bytes(task, ask, operator) -> None:  # type: ignore[no-untyped-def]
    from tasks_app import storage

    request = ask()
    before = Task.objects.get(pk=task.pk).stored_bytes
    transitions.answer(task=task, key=request.key, response=APPROVE, channel="inbox", user=operator)
    stored = InputRequest.objects.get(pk=request.pk).answer
    added = storage.json_bytes(stored) + storage.json_bytes(stored["content"])
    assert Task.objects.get(pk=task.pk).stored_bytes == before + added
    # A late answer stores nothing more.
    transitions.answer(task=task, key=request.key, response=APPROVE, channel="inbox", user=operator)
    assert Task.objects.get(pk=task.pk).stored_bytes == before + added
