"""What a ``tools/call`` answers, by era, declared capabilities and ``params.task``.

Each era has its own result shapes, and an answer is always one of its own era's:

- 2026-07-28 (stateless; capabilities in the request's own ``_meta``): a ``CallToolResult``
  with ``resultType: "complete"``, or, only when that request declares the tasks extension,
  the flat ``CreateTaskResult`` (``resultType: "task"`` and the Task's fields, ext-tasks
  specification/2026-07-28/tasks.md, "Task Creation"). ``params.task`` is not a 2026 field
  and changes nothing. A ``required`` tool without the extension is -32021 (HTTP 400).
- 2025-11-25 (handshake; capabilities declared once in ``initialize``): a ``CallToolResult``
  without ``resultType``, or with ``params.task`` the nested ``CreateTaskResult``
  (``{task: {taskId, status, ttl, pollInterval, ...}}``, basic/utilities/tasks.mdx). Whatever
  the session's ``initialize`` declared, the 2026 tasks extension included (the MCP
  Inspector declares it by default). ``forbidden`` with a task, or ``required`` without
  one, is -32601 (HTTP 200 on this wire).

Shapes are checked with the spec's own models (mcp-types, generated from each revision's
schema.json), and no key outside the model is allowed: the models ignore extra keys, and a
2026 key in a 2025 answer (or the other way round) is exactly the mistake to catch.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp_types import _v2025_11_25 as v2025
from mcp_types import _v2026_07_28 as v2026
from pydantic import BaseModel

from tasks_app.models import Era, Task
from tests.tasks_app.mcp.conftest import Session
from tests.wire import TASKS, json_of, request

pytestmark = pytest.mark.django_db(transaction=True)

CAPABILITIES: dict[str, dict[str, Any]] = {
    "none": {},
    "2026 tasks extension": {"extensions": {TASKS: {}}},
    "2025 tasks capability": {"tasks": {"list": {}, "cancel": {}}},
}
# The demo toolset's optional and required tools; it has no forbidden one, so that is the
# conformance toolset's greet (the tests serve both).
TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "optional": ("slow_echo", {"text": "hi", "seconds": 0}),
    "required": ("confirm_action", {"action": "ship it"}),
    "forbidden": ("greet", {"name": "Ann"}),
}
TEXT = {"optional": "hi", "forbidden": "Hello, Ann!"}

# ext-tasks specification/2026-07-28/tasks.md: CreateTaskResult = Result & Task.
TASK_2026_REQUIRED = {"resultType", "taskId", "status", "createdAt", "lastUpdatedAt", "ttlMs"}
TASK_2026_OPTIONAL = {"statusMessage", "pollIntervalMs", "_meta"}


def keys_of(model: type[BaseModel]) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


def conforms(result: dict[str, Any], model: type[BaseModel]) -> None:
    """RESULT is a MODEL and carries no key MODEL does not have."""
    model.model_validate(result)
    assert set(result) <= keys_of(model), set(result) - keys_of(model)


def assert_call_tool_result_2026(result: dict[str, Any], text: str) -> None:
    conforms(result, v2026.CallToolResult)
    assert result["resultType"] == "complete"
    assert result["content"] == [{"type": "text", "text": text}] and result["isError"] is False


def assert_create_task_result_2026(result: dict[str, Any]) -> None:
    assert TASK_2026_REQUIRED <= set(result) <= TASK_2026_REQUIRED | TASK_2026_OPTIONAL, result
    assert result["resultType"] == "task" and result["status"] == "working"
    assert isinstance(result["ttlMs"], int) and isinstance(result["pollIntervalMs"], int)
    assert Task.objects.get(pk=result["taskId"]).era == Era.MODERN


def assert_call_tool_result_2025(result: dict[str, Any], text: str) -> None:
    conforms(result, v2025.CallToolResult)
    assert result["content"] == [{"type": "text", "text": text}] and result["isError"] is False


def assert_create_task_result_2025(result: dict[str, Any]) -> None:
    conforms(result, v2025.CreateTaskResult)
    conforms(result["task"], v2025.Task)
    assert result["task"]["status"] == "working"
    assert isinstance(result["task"]["ttl"], int) and isinstance(
        result["task"]["pollInterval"], int
    )
    assert Task.objects.get(pk=result["task"]["taskId"]).era == Era.LEGACY


def answer(response: Any) -> dict[str, Any]:
    body = json_of(response)
    assert set(body) == {"jsonrpc", "id", "result"} or set(body) == {"jsonrpc", "id", "error"}
    return body


def params_for(tool: str, with_task: bool) -> dict[str, Any]:
    name, arguments = TOOLS[tool]
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if with_task:
        params["task"] = {"ttl": 60000}
    return params


@pytest.mark.parametrize("with_task", [False, True], ids=["no params.task", "params.task"])
@pytest.mark.parametrize("declared", list(CAPABILITIES))
@pytest.mark.parametrize("tool", list(TOOLS))
def test_the_stateless_era(mcp, tool: str, declared: str, with_task: bool) -> None:  # type: ignore[no-untyped-def]
    body = request("tools/call", params_for(tool, with_task))
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = CAPABILITIES[declared]
    response = mcp.post(body)
    message = answer(response)
    extension = declared == "2026 tasks extension"
    # params.task is not part of this wire: the answer is the same with it or without it.
    if tool == "forbidden" or (tool == "optional" and not extension):
        assert response.status_code == 200
        assert_call_tool_result_2026(message["result"], TEXT[tool])
    elif extension:
        assert response.status_code == 200
        assert_create_task_result_2026(message["result"])
    else:  # a required tool, and this request does not declare the extension
        assert response.status_code == 400
        error = message["error"]
        assert error["code"] == -32021
        assert error["data"] == {"requiredCapabilities": {"extensions": {TASKS: {}}}}
        assert Task.objects.count() == 0


@pytest.mark.parametrize("with_task", [False, True], ids=["no params.task", "params.task"])
@pytest.mark.parametrize("declared", list(CAPABILITIES))
@pytest.mark.parametrize("tool", list(TOOLS))
def test_the_handshake_era(mcp, tool: str, declared: str, with_task: bool) -> None:  # type: ignore[no-untyped-def]
    session = Session(mcp, capabilities=CAPABILITIES[declared])
    response = session.call("tools/call", params_for(tool, with_task))
    message = answer(response)
    # What initialize declared changes nothing: params.task alone asks for a task.
    assert response.status_code == 200  # method errors too, on this wire
    if with_task and tool != "forbidden":
        assert_create_task_result_2025(message["result"])
    elif not with_task and tool != "required":
        assert_call_tool_result_2025(message["result"], TEXT[tool])
        assert Task.objects.count() == 0
    else:  # a task of a forbidden tool, or a required tool without one
        assert message["error"]["code"] == -32601
        assert "execution.taskSupport" in message["error"]["message"]
        assert Task.objects.count() == 0


def test_an_inspector_session_gets_the_tools_own_result(mcp) -> None:  # type: ignore[no-untyped-def]
    # The MCP Inspector's initialize: the 2026 extension among its capabilities. Its call of
    # an optional tool runs the tool; the answer is the tool's, with nothing of a task.
    session = Session(
        mcp,
        capabilities={"sampling": {}, "elicitation": {}, "roots": {}, "extensions": {TASKS: {}}},
    )
    response = session.call("tools/call", params_for("optional", False))
    assert json.loads(response.content) == {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {"content": [{"type": "text", "text": "hi"}], "isError": False},
    }
