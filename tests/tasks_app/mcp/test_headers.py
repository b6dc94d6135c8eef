"""Reading request headers straight from the WSGI environ (``tasks_app.mcp.headers.sent``)."""

from __future__ import annotations

import pytest
from django.test import RequestFactory
from rest_framework.request import Request

from tasks_app.mcp.headers import sent

NAMES = [
    "Content-Type",
    "content-length",
    "Accept",
    "Origin",
    "MCP-Protocol-Version",
    "Mcp-Method",
    "mcp-session-id",
    "Last-Event-ID",
    "X-Request-ID",
    "Mcp-Param-Region",
]


@pytest.mark.parametrize("name", NAMES)
def test_a_header_reads_as_django_reads_it(name: str) -> None:
    request = RequestFactory().post(
        "/mcp",
        data=b"{}",
        content_type="application/json; charset=utf-8",
        headers={
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tasks/get",
            "Mcp-Param-Region": " eu-west ",
            "X-Request-ID": "abc",
        },
    )

    assert sent(request, name) == request.headers.get(name)
    assert sent(Request(request), name) == request.headers.get(name)  # through DRF's wrapper


def test_a_header_not_sent_is_none() -> None:
    request = RequestFactory().post("/mcp", data=b"{}", content_type="application/json")

    assert sent(request, "Origin") is None
    assert sent(request, "Mcp-Session-Id") is None
    assert sent(request, "Content-Type") == "application/json"
