"""Honest error classes: what is not JSON-RPC is 400, a bug is -32603 with only a reference,
a tool's own error reaches the client. (Outages, 503, are proven against a PostgreSQL that
is really stopped: tests/integration/test_database_outage.py.)"""

from __future__ import annotations

import json
import logging
import re

import pytest

from tests.runtime_toolset import RUNTIME_TOOLSETS
from tests.wire import error_of, request, result_of

pytestmark = pytest.mark.django_db

LIST = {"Mcp-Method": "tools/list"}


def assert_refused(response, status: int, code: int) -> dict:  # type: ignore[no-untyped-def]
    assert response.status_code == status, response.content
    body = json.loads(response.content)
    assert body["error"]["code"] == code, body
    return body


def no_traceback(caplog) -> None:  # type: ignore[no-untyped-def]
    logged = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert logged == [], [r.getMessage() for r in logged]


def tools_list_with(value: str) -> bytes:
    """A tools/list request whose params carry VALUE as raw JSON text."""
    return (
        '{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": '
        + json.dumps(request("tools/list")["params"]["_meta"])
        + ', "x": '
        + value
        + "}}"
    ).encode()


# --- not JSON-RPC: 400, no traceback ---------------------------------------------------------


def test_a_300000_deep_array_is_refused_as_too_deep(mcp, caplog) -> None:  # type: ignore[no-untyped-def]
    body = assert_refused(mcp.post(raw=b"[" * 300_000 + b"]" * 300_000, headers=LIST), 400, -32600)

    assert "nests deeper than 64 levels" in body["error"]["message"]
    assert body["id"] is None
    no_traceback(caplog)


def test_nesting_just_past_the_limit_inside_the_arguments_is_refused(mcp, caplog) -> None:  # type: ignore[no-untyped-def]
    deep_ok = "[" * 60 + "]" * 60
    deep_bad = "[" * 64 + "]" * 64  # the params object and the message add two levels

    assert mcp.post(raw=tools_list_with(deep_ok), headers=LIST).status_code == 200
    assert_refused(mcp.post(raw=tools_list_with(deep_bad), headers=LIST), 400, -32600)
    no_traceback(caplog)


def test_the_depth_limit_is_a_setting(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_MAX_JSON_DEPTH = 8

    body = assert_refused(
        mcp.post(raw=tools_list_with("[" * 7 + "]" * 7), headers=LIST), 400, -32600
    )
    assert body["error"]["data"] == {"maxDepth": 8}


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(
            b'{"jsonrpc": "2.0", "id": "\xff", "method": "tools/list"}', id="invalid-utf8"
        ),
        pytest.param(
            b'{"jsonrpc": "2.0", "id": "\xed\xa0\x80", "method": "tools/list"}',
            id="utf8-encoded-surrogate",
        ),
        pytest.param(
            '{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}'.encode("utf-16"), id="utf-16"
        ),
        pytest.param(b'\xef\xbb\xbf{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}', id="bom"),
    ],
)
def test_a_body_that_is_not_utf8_is_a_parse_error(mcp, caplog, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    assert_refused(mcp.post(raw=raw, headers=LIST), 400, -32700)
    no_traceback(caplog)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(rb'{"jsonrpc": "2.0", "id": "\ud800", "method": "tools/list"}', id="id"),
        pytest.param(rb'{"jsonrpc": "2.0", "id": 1, "method": "tools/\udfff"}', id="method"),
        pytest.param(rb'{"jsonrpc": "2.0", "id": 1, "method": "x", "\udc00": 1}', id="key"),
        pytest.param(tools_list_with(r'"ok \ud83d"'), id="deep-string"),
        pytest.param(tools_list_with(r'{"\ude00": [1]}'), id="deep-key"),
    ],
)
def test_a_lone_surrogate_anywhere_is_a_parse_error(mcp, caplog, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    body = assert_refused(mcp.post(raw=raw, headers=LIST), 400, -32700)

    assert "lone surrogate" in body["error"]["message"]
    assert body["id"] is None  # the id cannot be echoed: it is not text
    no_traceback(caplog)


def test_nul_in_a_string_is_refused_before_anything_is_stored(mcp, caplog) -> None:  # type: ignore[no-untyped-def]
    from tasks_app.models import Task

    call = request("tools/call", {"name": "slow_echo", "arguments": {"text": "a\x00b"}}, tasks=True)
    error = assert_refused(mcp.post(call), 400, -32602)["error"]
    assert "U+0000" in error["message"]
    assert_refused(mcp.post(raw=rb'{"jsonrpc": "2.0", "id": "\u0000", "method": "x"}'), 400, -32600)
    assert Task.objects.count() == 0
    no_traceback(caplog)


def test_a_surrogate_pair_is_ordinary_text(mcp) -> None:  # type: ignore[no-untyped-def]
    raw = rb'{"jsonrpc": "2.0", "id": "\ud83d\ude00", "method": "tools/list", "params": '
    raw += json.dumps(request("tools/list")["params"]).encode() + b"}"

    response = mcp.post(raw=raw, headers=LIST)

    assert response.status_code == 200, response.content
    assert json.loads(response.content)["id"] == "\N{GRINNING FACE}"


# --- a tool's failure -------------------------------------------------------------------------


def call(mcp, how: str):  # type: ignore[no-untyped-def]
    return mcp.post(request("tools/call", {"name": "sync_outcome", "arguments": {"how": how}}))


def test_an_unexpected_exception_in_a_tool_reaches_the_client_only_as_a_reference(
    mcp, settings, caplog
) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_TOOLSETS = RUNTIME_TOOLSETS

    result = result_of(call(mcp, "exception"))

    assert result["isError"] is True
    told = json.dumps(result)
    assert "missing-thing" not in told and "KeyError" not in told
    reference = re.search(r"reference ([0-9a-f]{12})", result["content"][0]["text"])
    assert reference is not None, result
    [record] = [r for r in caplog.records if reference.group(1) in r.getMessage()]
    assert record.exc_info is not None and "missing-thing" in str(record.exc_info[1])


def test_a_tool_error_message_still_reaches_the_client(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_TOOLSETS = RUNTIME_TOOLSETS

    result = result_of(call(mcp, "tool_error"))

    assert result["isError"] is True
    assert result["content"][0]["text"] == "the payment provider said no"


def test_a_protocol_error_keeps_its_own_code(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_TOOLSETS = RUNTIME_TOOLSETS

    error = error_of(call(mcp, "protocol_error"))

    assert (error["code"], error["message"]) == (-32050, "bad upstream")


def test_a_bug_outside_any_tool_is_32603_with_only_a_reference(mcp, settings, caplog) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_TOOLSETS = RUNTIME_TOOLSETS

    # A tool whose result is not JSON is a bug in that tool, found after it ran.
    response = call(mcp, "not_json")

    assert response.status_code == 200
    error = error_of(response)
    assert error["code"] == -32603
    reference = error["data"]["reference"]
    assert error["message"] == (
        f"Internal error (reference {reference}); the server log has the details"
    )
    [record] = [r for r in caplog.records if reference in r.getMessage()]
    assert isinstance(record.exc_info[1], TypeError)
