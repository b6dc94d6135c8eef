"""Log lines carry their context: a tool's ``ctx.log`` lines name the task and the tool,
through the same filter and formatters the LOGGING setting installs."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from tasks_app.logcontext import ContextFilter, JsonFormatter
from tasks_app.testing import ToolRunner
from tasks_app.tools import ToolContext, Toolset

tools = Toolset("logcontext_tests")


@tools.tool(task="required")
def chatty(ctx: ToolContext, rows: int) -> str:
    """Logs what it did through ctx.log."""
    ctx.log("info", "exported the rows", rows=rows)
    return "done"


def captured(formatter: logging.Formatter) -> Iterator[io.StringIO]:
    """Lines of the runtime's logger, through the context filter and FORMATTER, as the
    console handler of settings.LOGGING writes them."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    handler.setFormatter(formatter)
    logger = logging.getLogger("tasks_app.runtime")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    yield from captured(JsonFormatter())


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
