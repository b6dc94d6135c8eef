"""The official MCP Python SDK (``mcp`` 2.3) against a live Taskdesk: web, worker and beat.

The SDK has no tasks client of its own; it offers hooks. ``Tasks`` below is the small client
extension mcp-protocol.md §e.2 describes: it claims ``resultType: "task"`` results, polls
``tasks/get``, answers input requests with ``tasks/update`` and returns the final
``CallToolResult``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

import anyio
import mcp_types
import pytest
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import Request, RequestParams, Result
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

TASKS = "io.modelcontextprotocol/tasks"
TERMINAL = ("completed", "failed", "cancelled")

pytestmark = pytest.mark.live


class TaskFields(Result):
    """What a receipt and a tasks/get result both say about the task."""

    task_id: str
    status: str
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None
    status_message: str | None = None


class CreateTaskResult(TaskFields):
    result_type: Literal["task"]


class GetTaskResult(TaskFields):
    result_type: Literal["complete"] = "complete"
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None


class TaskIdParams(RequestParams):
    task_id: str


class UpdateParams(TaskIdParams):
    input_responses: dict[str, Any]


class TasksGet(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"


class TasksUpdate(Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    name_param = "taskId"


class TasksCancel(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


Answerer = Callable[[dict[str, Any]], dict[str, Any]]


class Tasks(ClientExtension):
    identifier = TASKS

    def __init__(self, answer: Answerer) -> None:
        self.answer = answer
        self.seen_statuses: list[str] = []

    def claims(self):  # type: ignore[no-untyped-def]
        return (
            ResultClaim(
                result_type="task",
                model=CreateTaskResult,
                resolve=self.drive,
                protocol_versions=frozenset(MODERN_PROTOCOL_VERSIONS),
            ),
        )

    async def drive(self, created: CreateTaskResult, ctx: ClaimContext) -> mcp_types.CallToolResult:
        session, task_id, answered = ctx.session, created.task_id, set()
        while True:
            task = await session.send_request(
                TasksGet(params=TaskIdParams(task_id=task_id)), GetTaskResult
            )
            self.seen_statuses.append(task.status)
            if task.status in TERMINAL:
                break
            new = {k: v for k, v in (task.input_requests or {}).items() if k not in answered}
            if task.status == "input_required" and new:
                answers = {key: self.answer(request) for key, request in new.items()}
                answered |= answers.keys()
                params = UpdateParams(task_id=task_id, input_responses=answers)
                await session.send_request(TasksUpdate(params=params), Result)
                continue
            await anyio.sleep(0.1)
        if task.status == "completed":
            return mcp_types.CallToolResult.model_validate(task.result)
        message = (task.error or {}).get("message") if task.status == "failed" else "cancelled"
        return mcp_types.CallToolResult(
            content=[mcp_types.TextContent(type="text", text=str(message))], is_error=True
        )


def confirm_everything(request: dict[str, Any]) -> dict[str, Any]:
    assert request["method"] == "elicitation/create"
    return {"action": "accept", "content": {"confirm": True}}


async def in_tasks_get_only(
    context: Any, params: mcp_types.ElicitRequestParams
) -> mcp_types.ElicitResult:
    raise AssertionError("a task's question comes in tasks/get, not as elicitation/create")


def connect(url: str, token: str, tasks: Tasks) -> Client:
    """A client with the tasks extension that declares it answers questions (an elicitation
    callback), which Tasks does with tasks/update."""
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    return Client(
        streamable_http_client(url, http_client=http),
        extensions=[tasks],
        elicitation_callback=in_tasks_get_only,
    )


def text(result: mcp_types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, mcp_types.TextContent)
    return block.text


def test_the_python_sdk_drives_sync_calls_tasks_questions_and_cancel(live, alice_token) -> None:  # type: ignore[no-untyped-def]
    tasks = Tasks(confirm_everything)

    async def scenario() -> None:
        async with connect(live.mcp_url, alice_token, tasks) as client:
            assert client.protocol_version == "2026-07-28"
            assert TASKS in (client.server_capabilities.extensions or {})
            tools = await client.list_tools()
            assert "slow_compute" in {tool.name for tool in tools.tools}

            greeting = await client.call_tool("greet", {"name": "Ada"})
            assert text(greeting) == "Hello, Ada!" and not greeting.is_error

            computed = await client.call_tool("slow_compute", {"seconds": 0.5, "label": "sdk"})
            assert text(computed) == "sdk finished after 0.5 s"
            assert "working" in tasks.seen_statuses and tasks.seen_statuses[-1] == "completed"

            deleted = await client.call_tool("confirm_delete", {"filename": "report.csv"})
            assert text(deleted) == "Deleted report.csv"
            assert "input_required" in tasks.seen_statuses

            failing = await client.call_tool("failing_job", {})
            assert failing.is_error and "always fails" in text(failing)

            raw = await client.session.call_tool(
                "slow_compute", {"seconds": 60, "label": "long"}, allow_claimed=True
            )
            assert isinstance(raw, CreateTaskResult)
            cancel = TasksCancel(params=TaskIdParams(task_id=raw.task_id))
            await client.session.send_request(cancel, Result)
            asked = time.monotonic()
            while True:
                got = TasksGet(params=TaskIdParams(task_id=raw.task_id))
                task = await client.session.send_request(got, GetTaskResult)
                if task.status in TERMINAL or time.monotonic() - asked > 10:
                    break
                await anyio.sleep(0.1)
            assert task.status == "cancelled"
            assert time.monotonic() - asked < 5

    anyio.run(scenario)


def test_the_python_sdk_is_refused_with_a_bad_token(live) -> None:  # type: ignore[no-untyped-def]
    async def scenario() -> None:
        async with connect(live.mcp_url, "tdk_not-a-token", Tasks(confirm_everything)) as client:
            await client.call_tool("greet", {"name": "Ada"})

    # The 401's JSON-RPC body surfaces as the SDK's MCPError (inside anyio's task groups).
    with pytest.raises(Exception) as caught:
        anyio.run(scenario)
    assert "MCPError(-32600, 'The bearer token is unknown or revoked'" in repr(caught.value)
