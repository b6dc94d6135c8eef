"""``async def`` tools: the coroutine runs on the process's event loop; ``await ctx.ask``,
``async with ctx.effect`` and ``await ctx.step`` are the same journaled calls as in a plain
tool, and cancellation checkpoints and time limits hold."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest

from tasks_app import transitions
from tasks_app.models import Actor, Task
from tasks_app.runtime import LegOutcome
from tasks_app.testing import Kill, ToolRunner
from tasks_app.tools import Toolset
from tasks_app.tools.aio import AsyncToolContext
from tests.wire import result_of

tools = Toolset("async_tests")
RAN: Counter[str] = Counter()
DONE: set[str] = set()
THREADS: dict[str, str] = {}
FORM = {"type": "object", "properties": {"ok": {"type": "boolean"}}}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    RAN.clear()
    DONE.clear()
    THREADS.clear()


@tools.tool(task="required")
async def book(ctx: AsyncToolContext, room: str) -> dict[str, Any]:
    """Counts tasks with the ORM in a plain step, awaits an async step and a question, and
    books the room in an async effect with an async verify hook."""
    THREADS["tool"] = threading.current_thread().name

    def count() -> int:  # a plain function: runs on the leg's thread, may use the ORM
        THREADS["step"] = threading.current_thread().name
        return Task.objects.count()

    async def quote() -> int:
        RAN["quote"] += 1
        a, b = await asyncio.gather(asyncio.sleep(0.01, 60), asyncio.sleep(0.01, 40))
        return a + b

    tasks = await ctx.step("count", count)
    price = await ctx.step("quote", quote)
    answer = await ctx.ask("ok", message=f"Book {room} for {price}?", schema=FORM)
    if not answer.content.get("ok"):
        return {"booked": False}

    async def booked(key: str) -> bool:
        await asyncio.sleep(0)
        return key in DONE

    async with ctx.effect("book", target=room, verify=booked) as fx:
        if not fx.done:
            RAN["book"] += 1
            await asyncio.sleep(0.01)
            DONE.add(fx.key)
            fx.record(room=room)
    await ctx.progress(1, 1, "booked")
    return {"booked": True, "price": price, "tasks": tasks, "room": fx.detail["room"]}


@tools.tool(task="required")
async def spin(ctx: AsyncToolContext, cancel_at: int = -1) -> str:
    """Checks for cancellation in a loop; a step requests it at CANCEL_AT."""
    for i in range(40):
        await ctx.check_cancelled()  # reads the flag at most every 0.1 s
        await asyncio.sleep(0.05)
        if i == cancel_at:

            def cancel() -> None:
                transitions.request_cancel(task_id=ctx.task_id or "", actor_type=Actor.CLIENT)

            await ctx.step("cancel", cancel)
    return "spun"


@tools.tool(task="required", time_limit=1)
async def hang(ctx: AsyncToolContext) -> str:
    """Never reaches a checkpoint."""
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        RAN["hang cancelled"] += 1
        raise
    return "woke"


@tools.tool(task="forbidden")
async def hello(ctx: AsyncToolContext, name: str) -> str:
    """A synchronous async tool."""
    await asyncio.sleep(0)
    return f"Hello, {name} from {ctx.client_name}!"


def test_an_async_tool_asks_steps_and_records_its_effect(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(book, {"room": "blue"}, answers={"ok": {"ok": True}})
    assert run.status == "completed" and not run.is_error, run.result
    assert run.structured == {"booked": True, "price": 100, "tasks": 1, "room": "blue"}
    assert run.journal == [("step", "count"), ("step", "quote"), ("ask", "ok"), ("effect", "book")]
    assert [(e.name, e.state) for e in run.effects] == [("book", "confirmed")]
    assert RAN == {"quote": 1, "book": 1}
    assert THREADS["tool"] == "taskdesk-tool-loop" and THREADS["step"] == "MainThread"


def test_a_killed_async_effect_is_verified_by_its_async_hook(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(book, {"room": "red"}, answers={"ok": {"ok": True}}, kill=Kill("book"))
    assert run.legs[-2:] == [LegOutcome.ABORTED, LegOutcome.COMPLETED]
    assert run.status == "completed" and RAN["book"] == 1 and RAN["quote"] == 1
    assert "effect_unknown" in run.events


def test_an_async_question_the_client_cannot_answer_fails_the_task(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(book, {"room": "green"}, elicitation=())
    assert run.status == "failed" and run.error is not None
    assert run.error["code"] == -32021
    assert run.journal == [("step", "count"), ("step", "quote")] and run.effects == []


def test_a_cancellation_stops_an_async_tool_at_its_next_checkpoint(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(spin, {"cancel_at": 3})
    assert run.status == "cancelled" and run.legs == [LegOutcome.CANCELLED]
    assert run.journal == [("step", "cancel")]


def test_the_time_limit_stops_an_async_tool_that_never_checks(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(hang)
    assert run.status == "failed"
    assert run.error is not None and "ran longer than its time limit of 1 s" in run.error["message"]
    assert RAN["hang cancelled"] == 1  # the coroutine was cancelled, not left running


def test_an_async_tool_without_tasks_answers_on_the_wire(client, alice_token, settings) -> None:  # type: ignore[no-untyped-def]
    from tests.tasks_app.mcp.conftest import Mcp

    settings.TASKDESK_TOOLSETS = ["demo", __name__]  # this module, by its path
    mcp = Mcp(client, alice_token)
    response = mcp.call("tools/call", {"name": "hello", "arguments": {"name": "Ada"}})
    result = result_of(response)
    assert result["content"] == [{"type": "text", "text": "Hello, Ada from alice!"}]
