"""Drive Taskdesk with FastMCP's client (fastmcp + fastmcp-tasks), one command at a time.

Run with the Python of the FastMCP virtualenv (tests/clients/__init__.py makes it):

    python fastmcp_drive.py URL TOKEN MODE        # MODE: auto, legacy or 2026-07-28

It connects one ``fastmcp.Client`` (bearer TOKEN, the given protocol-era MODE, an elicitation
handler), then reads one JSON command a line on standard input and writes one JSON answer a
line on standard output, so that the test between two commands can look at the database:

    {"op": "hello"}                                   the negotiated version
    {"op": "list_tools"}                              {name: execution.taskSupport or None}
    {"op": "call_tool", "name": N, "arguments": A, "meta": M}
    {"op": "call_tool_task", "name": N, "arguments": A, "meta": M}   (fastmcp_tasks)
    {"op": "status" | "result" | "cancel", "task": TASK_ID}          (the ToolTask handle)
    {"op": "wait", "task": TASK_ID, "state": S, "timeout": SECONDS}
    {"op": "answer_with", "action": "accept", "content": {...}}  what the handler answers
    {"op": "asked"}                                   the questions asked since the last time

An answer is ``{"ok": ...}`` or ``{"error": {"type", "message", "code"}}``. Anything else the
libraries print goes to standard error.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from fastmcp import Client
from fastmcp.client.elicitation import ElicitResult
from fastmcp_tasks import ToolTask, call_tool_task
from pydantic_core import to_jsonable_python


def dump(value: Any) -> Any:
    """VALUE as JSON: pydantic models by their wire names, without the unset fields."""
    if hasattr(value, "model_dump"):
        return value.model_dump(by_alias=True, mode="json", exclude_none=True)
    return to_jsonable_python(value)


def call_result(result: Any) -> dict[str, Any]:
    """fastmcp's CallToolResult (a dataclass) as the wire's CallToolResult."""
    return {
        "content": [dump(block) for block in result.content],
        "structuredContent": result.structured_content,
        "isError": result.is_error,
        "_meta": result.meta,
    }


def error(exc: BaseException) -> dict[str, Any]:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    code = getattr(exc, "code", None) or getattr(getattr(exc, "error", None), "code", None)
    return {"error": {"type": type(exc).__name__, "message": str(exc), "code": code}}


class Driver:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.tasks: dict[str, ToolTask] = {}

    async def hello(self) -> Any:
        return {"protocolVersion": self.client.session.protocol_version}

    async def list_tools(self) -> Any:
        tools = await self.client.list_tools()
        return {t.name: t.execution.task_support if t.execution else None for t in tools}

    async def call_tool(self, name: str, arguments: dict[str, Any], meta: Any = None) -> Any:
        result = await self.client.call_tool(name, arguments, meta=meta, raise_on_error=False)
        return call_result(result)

    async def call_tool_task(self, name: str, arguments: dict[str, Any], meta: Any = None) -> Any:
        task = await call_tool_task(self.client, name, arguments, meta=meta)
        self.tasks[task.task_id] = task
        return {"taskId": task.task_id, "created": dump(task.create_result)}

    async def status(self, task: str) -> Any:
        return dump(await self.tasks[task].status())

    async def wait(self, task: str, state: str | None = None, timeout: float = 30) -> Any:
        return dump(await self.tasks[task].wait(state=state, timeout=timeout))

    async def result(self, task: str) -> Any:
        return call_result(await self.tasks[task].result())

    async def cancel(self, task: str) -> Any:
        await self.tasks[task].cancel()
        return {}


ANSWER: dict[str, Any] = {"action": "accept", "content": {}}
ASKED: list[dict[str, Any]] = []


async def elicit(message: str, response_type: Any, params: Any, context: Any) -> Any:
    """The client's elicitation handler: records the question, answers with ANSWER."""
    ASKED.append(dump(params))
    return ElicitResult(action=ANSWER["action"], content=ANSWER.get("content"))


async def main(url: str, token: str, mode: str, out: Any) -> None:
    client = Client(url, auth=token, mode=mode, elicitation_handler=elicit, timeout=60)
    async with client:
        driver = Driver(client)
        out.write(json.dumps({"ok": "connected"}) + "\n")
        out.flush()
        while line := await asyncio.to_thread(sys.stdin.readline):
            command = json.loads(line)
            op = command.pop("op")
            try:
                if op == "answer_with":
                    ANSWER.clear()
                    ANSWER.update(command)
                    answer: Any = {"ok": {}}
                elif op == "asked":
                    answer = {"ok": list(ASKED)}
                    ASKED.clear()
                else:
                    answer = {"ok": await getattr(driver, op)(**command)}
            except Exception as exc:
                answer = error(exc)
            out.write(json.dumps(answer) + "\n")
            out.flush()


if __name__ == "__main__":
    # Standard output carries the answers only: whatever else is printed goes to stderr.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], answers))
