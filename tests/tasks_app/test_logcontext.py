"""Log lines carry their context: a tool's ``ctx.log`` lines name the task and the tool,
through the same filter and formatters the LOGGING setting installs; the default text format
stays a readable line with the ids appended."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from tasks_app import logcontext
from tasks_app.logcontext import ContextFilter, JsonFormatter, TextFormatter
from tasks_app.testing import ToolRunner
from tasks_app.tools import ToolContext, Toolset

tools = Toolset("logcontext_tests")


@tools.tool(task="required")
def chatty(ctx: ToolContext, rows: int) -> str:
    """Logs what it did through ctx.log."""
    ctx.log("info", "exported the rows", rows=rows)
    return "done"


def captured(
    formatter: logging.Formatter, name: str = "tasks_app.runtime", level: int = logging.INFO
) -> Iterator[io.StringIO]:
    """Lines of logger NAME from LEVEL up, through the context filter and FORMATTER, as the
    console handler of settings.LOGGING writes them."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    handler.setFormatter(formatter)
    logger = logging.getLogger(name)
    was = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(was)


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    yield from captured(JsonFormatter())


@pytest.fixture
def text_lines() -> Iterator[io.StringIO]:
    yield from captured(TextFormatter())


def tool_lines(stream: io.StringIO) -> list[str]:
    return [line for line in stream.getvalue().splitlines() if "tool log" in line]


def test_a_tool_log_line_carries_the_task_id_and_the_tool_in_json(
    taskdesk: ToolRunner, json_lines: io.StringIO
) -> None:
    run = taskdesk.run(chatty, {"rows": 3})

    assert run.status == "completed"
    [line] = tool_lines(json_lines)
    record = json.loads(line)
    assert record["task_id"] == run.task.pk
    assert record["tool"] == "chatty"
    assert record["leg"] == 1
    assert record["level"] == "INFO"
    assert record["logger"] == "tasks_app.runtime"
    assert '"exported the rows"' in record["message"]
    assert 'data={"rows": 3}' in record["message"]


TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"


def not_json(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return True
    return False


def test_a_tool_log_line_is_readable_text_with_the_ids_in_the_text_format(
    taskdesk: ToolRunner, text_lines: io.StringIO
) -> None:
    run = taskdesk.run(chatty, {"rows": 3})

    [line] = tool_lines(text_lines)
    task_id = run.task.pk
    assert re.fullmatch(
        rf"{TIME} INFO tasks_app\.runtime tool log task={task_id} leg=1 tool=chatty "
        rf'message="exported the rows" data=\{{"rows": 3\}} \[tool=chatty task_id={task_id} leg=1\]',
        line,
    ), line
    assert not_json(line)


def test_the_text_format_appends_the_context_in_a_fixed_order_and_keeps_tracebacks_below(
    text_lines: io.StringIO,
) -> None:
    log = logging.getLogger("tasks_app.runtime")
    log.info("outside any context")
    with logcontext.bound(task_id="t-9b2e", leg=2, client="alice", request_id="req-7f3a"):
        logcontext.update(method="tools/call", tool="slow_echo", code=None)
        log.warning("mcp %s %s http=%s", "tools/call", "ok", 200)
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("leg failed")

    plain, request, failed, *traceback = text_lines.getvalue().splitlines()
    assert re.fullmatch(rf"{TIME} INFO tasks_app\.runtime outside any context", plain), plain
    context = (
        "[request_id=req-7f3a client=alice method=tools/call tool=slow_echo task_id=t-9b2e leg=2]"
    )
    assert re.fullmatch(
        rf"{TIME} WARNING tasks_app\.runtime mcp tools/call ok http=200 {re.escape(context)}",
        request,
    ), request
    assert failed.endswith(f"ERROR tasks_app.runtime leg failed {context}")
    assert traceback[0] == "Traceback (most recent call last):"
    assert traceback[-1] == "RuntimeError: boom"
    assert all(not_json(line) for line in (plain, request, failed))
