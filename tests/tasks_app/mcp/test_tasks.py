"""tools/call as a task, and tasks/get, tasks/update and tasks/cancel (SEP-2663), in-process.

No worker runs here: the tests move tasks along with the same transitions the runtime calls.
The live tests (test_live.py) run the same flows through real worker processes.
"""

from __future__ import annotations

import re

import pytest

from elicitations import transitions as elicitation_transitions
from elicitations.models import InputRequest, RequestStatus
from tasks_app import transitions
from tasks_app.models import Status, Task
from tests.wire import error_of, request, result_of

pytestmark = pytest.mark.django_db(transaction=True)

ISO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}")


def create(mcp, name: str = "slow_compute", arguments: dict | None = None, **headers) -> dict:  # type: ignore[no-untyped-def]
    body = request(
        "tools/call", {"name": name, "arguments": arguments or {"seconds": 30}}, tasks=True
    )
    return result_of(mcp.post(body, headers=headers or None))


def get(mcp, task_id: str, **env) -> dict:  # type: ignore[no-untyped-def]
    return result_of(mcp.call("tasks/get", {"taskId": task_id}, tasks=True, **env))


def ask(task_id: str, ask_key: str, *, audience: str = "client") -> InputRequest:
    task = Task.objects.get(pk=task_id)
    schema = {
        "type": "object",
        "properties": {"confirm": {"type": "boolean"}},
        "required": ["confirm"],
    }
    req = elicitation_transitions.open_request(
        task=task, ask_key=ask_key, message=f"{ask_key}?", schema=schema, audience=audience
    )
    if task.status == Status.WORKING and audience != "operator":
        transitions.require_input(task_id=task_id, message="waiting for an answer")
    return req


def test_a_task_call_returns_a_flat_create_task_result(mcp) -> None:  # type: ignore[no-untyped-def]
    created = create(mcp)
    assert created["resultType"] == "task" and created["status"] == "working"
    assert ISO.match(created["createdAt"]) and ISO.match(created["lastUpdatedAt"])
    assert created["ttlMs"] == 7 * 24 * 3600 * 1000 and created["pollIntervalMs"] == 1000
    for absent in ("result", "error", "inputRequests", "requestState", "task", "ttl", "_meta"):
        assert absent not in created
    assert len(created["taskId"]) >= 22  # at least 128 random bits, URL-safe base64
    # Durable create: the task resolves at once, from this or any process.
    detail = get(mcp, created["taskId"])
    assert detail["resultType"] == "complete"
    assert {k: detail[k] for k in ("taskId", "status")} == {
        "taskId": created["taskId"],
        "status": "working",
    }
    assert "result" not in detail and "error" not in detail


def test_a_keyed_call_is_replayed(mcp) -> None:  # type: ignore[no-untyped-def]
    first = create(mcp, **{"Idempotency-Key": "order-1"})
    again = create(mcp, **{"Idempotency-Key": "order-1"})
    assert first["_meta"] == {"dev.taskdesk/replayed": False}
    assert again["_meta"] == {"dev.taskdesk/replayed": True}
    assert again["taskId"] == first["taskId"]
    conflict = mcp.post(
        request("tools/call", {"name": "slow_compute", "arguments": {"seconds": 1}}, tasks=True),
        headers={"Idempotency-Key": "order-1"},
    )
    assert conflict.status_code == 400
    assert error_of(conflict)["data"]["reason"] == "idempotency_key_reused"


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
def test_tasks_methods_need_the_extension_before_any_lookup(mcp, method: str) -> None:  # type: ignore[no-untyped-def]
    params = {"taskId": "no-such-task", "inputResponses": {}}
    response = mcp.call(method, params)
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == -32021
    assert error["data"]["requiredCapabilities"]["extensions"] == {
        "io.modelcontextprotocol/tasks": {}
    }


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
def test_unknown_and_foreign_task_ids_answer_alike(mcp, bob_mcp, method: str) -> None:  # type: ignore[no-untyped-def]
    alices = create(mcp)["taskId"]
    for client, task_id in ((mcp, "no-such-task"), (bob_mcp, alices)):
        response = client.call(method, {"taskId": task_id, "inputResponses": {}}, tasks=True)
        assert response.status_code == 400
        assert error_of(response) == {
            "code": -32602,
            "message": f"Task {task_id} not found",
            "data": {"taskId": task_id},
        }
    assert Task.objects.get(pk=alices).status == Status.WORKING


def test_cancel_acks_and_is_idempotent(mcp) -> None:  # type: ignore[no-untyped-def]
    task_id = create(mcp)["taskId"]
    ack = result_of(mcp.call("tasks/cancel", {"taskId": task_id}, tasks=True))
    assert ack == {"resultType": "complete"}
    # Not picked up by a worker yet, so nothing runs: cancelled at once.
    assert get(mcp, task_id)["status"] == "cancelled"
    assert result_of(mcp.call("tasks/cancel", {"taskId": task_id}, tasks=True)) == {
        "resultType": "complete"
    }
    assert Task.objects.get(pk=task_id).events.filter(kind="cancel_requested").count() == 2


def test_input_requests_are_listed_and_answered(mcp) -> None:  # type: ignore[no-untyped-def]
    params = {"name": "confirm_delete", "arguments": {"filename": "a.txt"}}
    body = request("tools/call", params, tasks=True, elicitation={})  # the client can answer
    task_id = result_of(mcp.post(body))["taskId"]
    first = ask(task_id, "first")
    second = ask(task_id, "second")
    ask(task_id, "approval", audience="operator")
    detail = get(mcp, task_id)
    assert detail["status"] == "input_required"
    assert set(detail["inputRequests"]) == {first.key, second.key}  # not the operator's
    assert detail["inputRequests"][first.key] == {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": "first?", "requestedSchema": first.requested_schema},
    }
    yes = {"action": "accept", "content": {"confirm": True}}
    ack = result_of(
        mcp.call(
            "tasks/update",
            {
                "taskId": task_id,
                "inputResponses": {first.key: yes, "unknown-key": {"ignored": True}},
            },
            tasks=True,
        )
    )
    assert ack == {"resultType": "complete"}
    detail = get(mcp, task_id)
    assert detail["status"] == "input_required" and list(detail["inputRequests"]) == [second.key]
    # An invalid answer is acked, recorded and leaves the question pending.
    bad = {"action": "accept", "content": {"confirm": "yes"}}
    mcp.call("tasks/update", {"taskId": task_id, "inputResponses": {second.key: bad}}, tasks=True)
    assert InputRequest.objects.get(pk=second.pk).status == RequestStatus.PENDING
    mcp.call("tasks/update", {"taskId": task_id, "inputResponses": {second.key: yes}}, tasks=True)
    assert InputRequest.objects.get(pk=second.pk).answer == yes
    # Only the operator's question is left, and it is never offered to the client.
    assert get(mcp, task_id).get("inputRequests", {}) == {}


def test_terminal_tasks_inline_their_outcome(mcp) -> None:  # type: ignore[no-untyped-def]
    done = create(mcp)["taskId"]
    transitions.complete(
        task_id=done, result={"content": [{"type": "text", "text": "42"}], "isError": False}
    )
    detail = get(mcp, done)
    assert detail["status"] == "completed"
    assert detail["result"] == {
        "content": [{"type": "text", "text": "42"}],
        "isError": False,
        "resultType": "complete",
    }
    failed = create(mcp)["taskId"]
    transitions.fail(task_id=failed, error={"code": -32603, "message": "upstream down"})
    detail = get(mcp, failed)
    assert detail["status"] == "failed" and "result" not in detail
    assert detail["error"] == {"code": -32603, "message": "upstream down"}
    assert detail["statusMessage"] == "upstream down"


def test_a_keyed_call_without_the_extension_waits_for_its_task(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_SYNC_WAIT_SECONDS = 0.2
    body = request("tools/call", {"name": "slow_compute", "arguments": {"seconds": 5}})
    waiting = result_of(mcp.post(body, headers={"Idempotency-Key": "sync-1"}))
    task_id = waiting["_meta"]["dev.taskdesk/taskId"]
    assert waiting["isError"] is True and "same idempotency key" in waiting["content"][0]["text"]
    assert waiting["_meta"]["dev.taskdesk/replayed"] is False
    transitions.complete(
        task_id=task_id, result={"content": [{"type": "text", "text": "done"}], "isError": False}
    )
    retried = result_of(mcp.post(body, headers={"Idempotency-Key": "sync-1"}))
    assert retried["content"][0]["text"] == "done" and retried["isError"] is False
    assert retried["_meta"] == {"dev.taskdesk/taskId": task_id, "dev.taskdesk/replayed": True}
    assert Task.objects.filter(idempotency_key="sync-1").count() == 1


def test_a_durable_sync_tool_runs_as_a_task_even_without_a_key(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_SYNC_WAIT_SECONDS = 0.2
    body = request("tools/call", {"name": "test_reconnection", "arguments": {}})
    waiting = result_of(mcp.post(body))
    task = Task.objects.get(pk=waiting["_meta"]["dev.taskdesk/taskId"])
    assert task.tool_name == "test_reconnection" and task.idempotency_key is None
    assert waiting["isError"] is True  # still running after the wait: the answer says so


def test_a_required_key_is_asked_for(mcp) -> None:  # type: ignore[no-untyped-def]
    body = request(
        "tools/call", {"name": "export_report", "arguments": {"quarter": "Q1"}}, tasks=True
    )
    response = mcp.post(body)
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == -32602 and "Idempotency-Key" in error["message"]
    assert not Task.objects.exists()


def test_over_eager_pollers_are_throttled(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    from django.core.cache import cache

    cache.clear()
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"mcp_poll": "2/minute"},
    }
    task_id = create(mcp)["taskId"]
    get(mcp, task_id)
    get(mcp, task_id)
    response = mcp.call("tasks/get", {"taskId": task_id}, tasks=True)
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    error = error_of(response)
    assert (error["code"], error["data"]["reason"]) == (-32000, "poll_rate")
    assert error["data"]["retryAfterMs"] >= 1000
