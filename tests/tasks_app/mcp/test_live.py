"""Raw HTTP against a live stack (gunicorn, a Celery worker, beat): task flows end to end."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.wire import headers_for, request

# broker: CI runs these on RabbitMQ as well as Redis.
pytestmark = [pytest.mark.live, pytest.mark.broker]


class Wire:
    def __init__(self, live: Any, token: str) -> None:
        self.live = live
        self.token = token

    def post(self, body: dict[str, Any], **headers: str) -> Any:
        return self.live.post(body, token=self.token, headers={**headers_for(body), **headers})

    def result(self, method: str, params: dict[str, Any], **env: Any) -> dict[str, Any]:
        response = self.post(request(method, params, **env))
        assert response.status_code == 200, response.text
        assert "result" in response.json(), response.text
        return response.json()["result"]

    def wait(self, task_id: str, until: tuple[str, ...], timeout: float = 15) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            task = self.result("tasks/get", {"taskId": task_id}, tasks=True)
            if task["status"] in until or time.monotonic() > deadline:
                return task
            time.sleep(0.1)


def test_tasks_run_to_their_outcome_through_the_worker(live, alice_token) -> None:  # type: ignore[no-untyped-def]
    wire = Wire(live, alice_token)
    terminal = ("completed", "failed", "cancelled")

    created = wire.result(
        "tools/call", {"name": "slow_compute", "arguments": {"seconds": 0.3}}, tasks=True
    )
    done = wire.wait(created["taskId"], terminal)
    assert done["status"] == "completed"
    assert done["result"]["content"][0]["text"] == "computation finished after 0.3 s"

    failed = wire.result("tools/call", {"name": "protocol_error_job", "arguments": {}}, tasks=True)
    failed = wire.wait(failed["taskId"], terminal)
    assert failed["status"] == "failed" and "result" not in failed
    assert failed["error"]["code"] == -32603

    call = {"name": "multi_input", "arguments": {}}
    multi = wire.result("tools/call", call, tasks=True, elicitation={})  # it answers forms
    asked = wire.wait(multi["taskId"], ("input_required",))
    first, second = asked["inputRequests"]
    answer = {"action": "accept", "content": {"name": "one"}}
    wire.result(
        "tasks/update", {"taskId": multi["taskId"], "inputResponses": {first: answer}}, tasks=True
    )
    partial = wire.result("tasks/get", {"taskId": multi["taskId"]}, tasks=True)
    assert partial["status"] == "input_required" and list(partial["inputRequests"]) == [second]
    answer = {"action": "accept", "content": {"name": "two"}}
    wire.result(
        "tasks/update", {"taskId": multi["taskId"], "inputResponses": {second: answer}}, tasks=True
    )
    assert wire.wait(multi["taskId"], terminal)["result"]["content"][0]["text"] == "Got one and two"

    # Without the extension, a keyed optional call waits for its task and answers in line;
    # the retry answers from the same task.
    body = request(
        "tools/call", {"name": "slow_compute", "arguments": {"seconds": 0.2, "label": "k"}}
    )
    first_reply = wire.post(body, **{"Idempotency-Key": "live-1"}).json()["result"]
    retry = wire.post(body, **{"Idempotency-Key": "live-1"}).json()["result"]
    assert first_reply["content"][0]["text"] == "k finished after 0.2 s"
    assert first_reply["_meta"]["dev.taskdesk/replayed"] is False
    assert retry["_meta"]["dev.taskdesk/replayed"] is True
    assert retry["_meta"]["dev.taskdesk/taskId"] == first_reply["_meta"]["dev.taskdesk/taskId"]

    # MRTR first, then a task that replays the answer (the conformance composition case).
    call = {"name": "test_tool_with_task", "arguments": {}}
    round1 = wire.result("tools/call", call, tasks=True, elicitation={})
    assert round1["resultType"] == "input_required"
    round2 = wire.result(
        "tools/call",
        {
            **call,
            "inputResponses": {"user_name": {"action": "accept", "content": {"name": "Alice"}}},
            "requestState": round1["requestState"],
        },
        tasks=True,
        elicitation={},
    )
    assert round2["resultType"] == "task"
    finished = wire.wait(round2["taskId"], terminal)
    assert "Alice" in finished["result"]["content"][0]["text"]

    long = wire.result(
        "tools/call", {"name": "slow_compute", "arguments": {"seconds": 60}}, tasks=True
    )
    wire.wait(long["taskId"], ("working",))
    time.sleep(0.5)  # let the worker pick it up, so the cancel has to stop running work
    assert wire.result("tasks/cancel", {"taskId": long["taskId"]}, tasks=True) == {
        "resultType": "complete"
    }
    started = time.monotonic()
    assert wire.wait(long["taskId"], terminal, timeout=10)["status"] == "cancelled"
    assert time.monotonic() - started < 5
