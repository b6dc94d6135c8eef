"""What a task records at acceptance about how its client can answer questions
(``Task.client_answers``), on both wires."""

from __future__ import annotations

from typing import Any

import pytest

from tasks_app.models import Task
from tests.tasks_app.mcp.conftest import Session
from tests.wire import json_of, request, result_of

pytestmark = pytest.mark.django_db(transaction=True)

SLOW = {"name": "slow_echo", "arguments": {"text": "hi", "seconds": 30}}


def recorded(task_id: str) -> str | None:
    return Task.objects.values_list("client_answers", flat=True).get(pk=task_id)


@pytest.mark.parametrize(
    ("capabilities", "expected"),
    [
        ({}, ""),
        ({"elicitation": {}}, "form"),
        ({"elicitation": {"form": {}}}, "form"),
        ({"elicitation": {"url": {}}}, "url"),
        ({"elicitation": {"form": {}, "url": {}}}, "form url"),
        ({"sampling": {}, "roots": {}}, ""),
    ],
)
def test_a_2026_task_records_the_elicitation_modes_its_request_declared(
    mcp, capabilities: dict[str, Any], expected: str
) -> None:
    created = result_of(mcp.post(request("tools/call", SLOW, tasks=True, **capabilities)))

    assert recorded(created["taskId"]) == expected


def test_a_2026_call_without_the_tasks_extension_records_that_it_cannot_answer_a_task(
    mcp, settings
) -> None:
    settings.TASKDESK_SYNC_WAIT_SECONDS = 0  # no worker runs here: answer "still running"
    body = request("tools/call", SLOW, elicitation={})

    result = result_of(mcp.post(body, headers={"Idempotency-Key": "no-tasks-1"}))

    assert recorded(result["_meta"]["dev.taskdesk/taskId"]) == "form no-tasks"


@pytest.mark.parametrize(
    ("capabilities", "expected"),
    [({}, ""), ({"elicitation": {}}, "form"), ({"elicitation": {"url": {}}}, "url")],
)
def test_a_2025_task_records_what_its_sessions_initialize_declared(
    mcp, capabilities: dict[str, Any], expected: str
) -> None:
    session = Session(mcp, capabilities=capabilities)

    created = json_of(session.call("tools/call", {**SLOW, "task": {}}))["result"]["task"]

    assert recorded(created["taskId"]) == expected


def test_a_replay_keeps_what_the_first_call_declared(mcp) -> None:  # type: ignore[no-untyped-def]
    key = {"Idempotency-Key": "replayed-1"}
    first = result_of(mcp.post(request("tools/call", SLOW, tasks=True), headers=key))
    again = mcp.post(request("tools/call", SLOW, tasks=True, elicitation={}), headers=key)

    assert result_of(again)["taskId"] == first["taskId"]
    assert recorded(first["taskId"]) == ""
