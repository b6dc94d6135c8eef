"""A client cannot forge log lines: the JSON-RPC method and a task id it sends go to the text
log (LOG_FORMAT=text, tasks_app.logcontext.TextFormatter) with their control characters
escaped, so each request is one line however many newlines it sends."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
from django.conf import settings

from tasks_app.logcontext import TextFormatter, escaped
from tests.tasks_app.test_logcontext import captured

FORGED = "\n2026-12-04 23:59:59,000 INFO tasks_app.mcp mcp tools/call ok http=200 ms=1"


@pytest.fixture
def text_log() -> Iterator[io.StringIO]:
    """The MCP request log through the console handler's filter and text formatter."""
    assert settings.LOGGING["formatters"]["text"]["()"] == "tasks_app.logcontext.TextFormatter"
    yield from captured(TextFormatter(), "tasks_app.mcp", logging.DEBUG)


def test_a_method_with_a_newline_is_one_escaped_log_line(mcp, text_log) -> None:  # type: ignore[no-untyped-def]
    method = "tools/list" + FORGED

    response = mcp.call(method)

    assert response.status_code == 404  # no such method
    [line] = text_log.getvalue().splitlines()
    assert f"mcp {escaped(method)} -32601" in line
    assert f"method={escaped(method)}" in line
    assert "\\n2026-12-04 23:59:59,000 INFO" in line


def test_a_task_id_with_a_newline_is_one_escaped_log_line(mcp, text_log) -> None:  # type: ignore[no-untyped-def]
    task_id = "t-1" + FORGED + "\r\x1b[2J\u2028"

    response = mcp.call("tasks/get", {"taskId": task_id}, tasks=True)

    assert response.status_code == 400  # no such task
    [line] = text_log.getvalue().splitlines()
    assert "mcp tasks/get -32602" in line
    assert "task_id=t-1\\n2026-12-04 23:59:59,000 INFO tasks_app.mcp" in line
    assert "ms=1\\r\\x1b[2J\\u2028 code=-32602]" in line


def test_escaping_leaves_printable_text_alone() -> None:
    assert escaped('tasks/get ünïcode "quoted" \\ back') == 'tasks/get ünïcode "quoted" \\ back'
    assert escaped("a\nb\tc\x00d\x7fe\x85") == "a\\nb\\tc\\x00d\\x7fe\\x85"
