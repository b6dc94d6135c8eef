"""Deadlines of questions applied by the real beat and worker processes."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from elicitations import transitions
from elicitations.models import InputRequest
from tasks_app.models import Task

pytestmark = pytest.mark.live


def test_beat_and_a_worker_apply_the_fail_policy_of_an_overdue_question(live, alice) -> None:
    task = Task.objects.create(client=alice, tool_name="refund_payment", arguments={})
    question = transitions.open_request(
        task=task,
        ask_key="approval",
        message="Approve?",
        audience="operator",
        deadline=timedelta(seconds=1),
        on_timeout="fail",
    )

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        task.refresh_from_db()
        if task.status == "failed":
            break
        time.sleep(0.2)

    assert task.status == "failed"
    assert task.error["message"].startswith("No answer to 'approval' before its deadline")
    row = InputRequest.objects.get(pk=question.pk)
    assert (row.status, row.channel, row.answer) == ("expired", "deadline", {"action": "decline"})
    assert task.events.filter(kind="input_expired", actor_type="system").count() == 1
