"""Helpers for the MCP endpoint tests: raw bytes in, HTTP status and JSON-RPC code out."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client as HttpClient

VERSION = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
NAME_PARAM = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
}


def envelope(*, tasks: bool = False, **capabilities: Any) -> dict[str, Any]:
    caps: dict[str, Any] = dict(capabilities)
    if tasks:
        caps["extensions"] = {TASKS: {}}
    return {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientInfo": {"name": "tests", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": caps,
    }


def request(
    method: str, params: dict[str, Any] | None = None, *, id: Any = 1, **env: Any
) -> dict[str, Any]:
    body_params = dict(params or {})
    body_params.setdefault("_meta", envelope(**env))
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": body_params}


def headers_for(body: Any) -> dict[str, str]:
    """The headers a conforming client sends for BODY."""
    out = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": VERSION}
    if isinstance(body, dict) and isinstance(body.get("method"), str):
        out["Mcp-Method"] = body["method"]
        key = NAME_PARAM.get(body["method"])
        value = (body.get("params") or {}).get(key) if key else None
        if isinstance(value, str):
            out["Mcp-Name"] = value
    return out


class Mcp:
    """Posts to /mcp through Django's test client."""

    def __init__(self, http: HttpClient, token: str | None) -> None:
        self.http = http
        self.token = token

    def post(
        self,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str | None] | None = None,
        token: str | None = "default",
        content_type: str = "application/json",
    ) -> Any:
        hdrs: dict[str, str | None] = headers_for(body)
        token = self.token if token == "default" else token
        if token:
            hdrs["Authorization"] = f"Bearer {token}"
        hdrs.update(headers or {})
        sent = {k: v for k, v in hdrs.items() if v is not None}
        data = raw if raw is not None else json.dumps(body).encode()
        return self.http.post("/mcp", data=data, content_type=content_type, headers=sent)

    def call(self, method: str, params: dict[str, Any] | None = None, **env: Any) -> Any:
        return self.post(request(method, params, **env))


def error_of(response: Any) -> dict[str, Any]:
    body = json.loads(response.content)
    assert "error" in body, body
    return body["error"]


def result_of(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.content
    if response["Content-Type"].startswith("text/event-stream"):
        messages = sse_messages(response)
        body = messages[-1]
    else:
        body = json.loads(response.content)
    assert "result" in body, body
    return body["result"]


def sse_messages(response: Any) -> list[dict[str, Any]]:
    text = b"".join(response.streaming_content).decode()
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


@pytest.fixture
def mcp(client: HttpClient, alice_token: str) -> Mcp:
    return Mcp(client, alice_token)


@pytest.fixture
def bob_mcp(client: HttpClient, bob_token: str) -> Mcp:
    return Mcp(client, bob_token)
