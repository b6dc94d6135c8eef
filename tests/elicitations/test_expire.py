"""transitions.expire_overdue: the on-timeout policy of questions past their deadline."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from elicitations import transitions
from elicitations.models import InputRequest
from tasks_app import transitions as task_transitions
from tasks_app.models import Dispatch, TaskEvent


def test_decline_policy_declines_and_resumes(task, ask) -> None:
    now = timezone.now()
    request = ask(deadline=now - timedelta(seconds=1))

    assert transitions.expire_overdue(now) == 1

    row = InputRequest.objects.get(pk=request.pk)
    assert (row.status, row.answer, row.channel) == ("expired", {"action": "decline"}, "deadline")
    assert row.answered_by == "the deadline"
    ev = TaskEvent.objects.get(task=task, kind="input_expired")
    assert ev.actor_type == "system"
    assert ev.detail["on_timeout"] == "decline"
    assert Dispatch.objects.filter(task=task, reason="deadline").count() == 1


def test_default_policy_accepts_the_default_answer(task, ask) -> None:
    now = timezone.now()
    request = ask(deadline=now, on_timeout="default", default={"approve": False, "note": "late"})
    task_transitions.require_input(task_id=task.pk)

    assert transitions.expire_overdue(now) == 1

    row = InputRequest.objects.get(pk=request.pk)
    assert row.answer == {"action": "accept", "content": {"approve": False, "note": "late"}}
    task.refresh_from_db()
    assert task.status == "working"


def test_fail_policy_ends_the_task(task, ask) -> None:
    now = timezone.now()
    request = ask(deadline=now - timedelta(hours=1), on_timeout="fail")
    other = ask(ask_key="other")

    assert transitions.expire_overdue(now) == 1

    task.refresh_from_db()
    assert task.status == "failed"
    assert task.error == {
        "code": -32603,
        "message": f"No answer to 'approval' before its deadline ({request.deadline.isoformat()})",
    }
    assert InputRequest.objects.get(pk=request.pk).status == "expired"
    assert InputRequest.objects.get(pk=other.pk).status == "cancelled"
    assert not Dispatch.objects.exists()


def test_it_leaves_questions_that_are_not_due_or_already_answered(task, ask, operator) -> None:
    now = timezone.now()
    later = ask(deadline=now + timedelta(minutes=1))
    forever = ask(deadline=None)
    answered = ask(deadline=now - timedelta(minutes=1))
    transitions.answer(
        task=task,
        key=answered.key,
        response={"action": "decline"},
        channel="inbox",
        user=operator,
    )

    assert transitions.expire_overdue(now) == 0
    statuses = dict(InputRequest.objects.values_list("pk", "status"))
    assert statuses == {later.pk: "pending", forever.pk: "pending", answered.pk: "declined"}


def test_the_task_resumes_once_after_all_its_questions_expire(task, ask) -> None:
    now = timezone.now()
    ask(deadline=now, ask_key="a")
    ask(deadline=now, ask_key="b")
    assert transitions.expire_overdue(now) == 2
    assert Dispatch.objects.filter(task=task).count() == 1
    assert transitions.expire_overdue(now) == 0
