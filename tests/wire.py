"""The MCP 2026-07-28 wire as the tests write and read it.

Request bodies (``request``, and ``tools_call`` / ``tasks_get`` with their headers), the headers
a conforming client sends (``headers_for``), and what a response carries (``result_of``,
``error_of``, ``sse_messages``), for responses of Django's test client and of httpx alike.
``post`` and ``wait_terminal`` talk to a live server over HTTP.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.live import wait_for

VERSION = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
KEY_META = "dev.taskdesk/idempotencyKey"
REPLAYED_META = "dev.taskdesk/replayed"
TERMINAL = ("completed", "failed", "cancelled")
NAME_PARAM = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
}


def envelope(
    *, tasks: bool = False, meta_key: str | None = None, **capabilities: Any
) -> dict[str, Any]:
    """The request ``_meta`` of a client: with the tasks extension when TASKS, the
    idempotency key META_KEY, and the other CAPABILITIES."""
    caps: dict[str, Any] = dict(capabilities)
    if tasks:
        caps["extensions"] = {TASKS: {}}
    meta: dict[str, Any] = {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientInfo": {"name": "tests", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": caps,
    }
    if meta_key is not None:
        meta[KEY_META] = meta_key
    return meta


def request(
    method: str, params: dict[str, Any] | None = None, *, id: Any = 1, **env: Any
) -> dict[str, Any]:
    """A JSON-RPC request body; ENV goes to ``envelope``."""
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


def _sent(body: dict[str, Any], token: str) -> tuple[bytes, dict[str, Any]]:
    headers: dict[str, Any] = {
        "Content-Type": "application/json",
        **headers_for(body),
        "Authorization": f"Bearer {token}",
    }
    return json.dumps(body).encode(), headers


def tools_call(
    name: str,
    arguments: dict[str, Any],
    *,
    key: str | bytes | None = None,
    meta_key: str | None = None,
    tasks: bool = True,
    token: str,
    request_id: int = 1,
) -> tuple[bytes, dict[str, Any]]:
    """The body and headers of a ``tools/call`` (KEY goes in the Idempotency-Key header)."""
    body = request(
        "tools/call",
        {"name": name, "arguments": arguments},
        id=request_id,
        tasks=tasks,
        meta_key=meta_key,
    )
    raw, headers = _sent(body, token)
    if key is not None:
        headers["Idempotency-Key"] = key
    return raw, headers


def tasks_get(task_id: str, *, token: str) -> tuple[bytes, dict[str, Any]]:
    return _sent(request("tasks/get", {"taskId": task_id}, tasks=True), token)


def post(url: str, request: tuple[bytes, dict[str, Any]], timeout: float = 30) -> httpx.Response:
    body, headers = request
    return httpx.post(url, content=body, headers=headers, timeout=timeout)


def sse_messages(response: Any) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an event-stream response."""
    if getattr(response, "streaming", False):  # Django's StreamingHttpResponse
        raw = b"".join(response.streaming_content)
    else:
        raw = response.content
    text = raw.decode()
    # A priming event (2025 wire) has an id and an empty data line.
    return [
        json.loads(line[5:])
        for line in text.splitlines()
        if line.startswith("data:") and line[5:].strip()
    ]


def result_of(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.content
    if response.headers.get("Content-Type", "").startswith("text/event-stream"):
        body = sse_messages(response)[-1]
    else:
        body = json.loads(response.content)
    assert "result" in body, body
    result: dict[str, Any] = body["result"]
    return result


def error_of(response: Any) -> dict[str, Any]:
    body = json.loads(response.content)
    assert "error" in body, body
    error: dict[str, Any] = body["error"]
    return error


def wait_terminal(url: str, task_id: str, *, token: str, timeout: float = 60) -> dict[str, Any]:
    """Poll tasks/get until the task is terminal; return the last tasks/get result."""
    last: dict[str, Any] = {}

    def ended() -> dict[str, Any] | None:
        last.clear()
        last.update(result_of(post(url, tasks_get(task_id, token=token))))
        return dict(last) if last["status"] in TERMINAL else None

    return wait_for(
        f"task {task_id} to end", ended, timeout, every=0.1, explain=lambda: f"still {last}"
    )


# --- the 2025-11-25 handshake wire ----------------------------------------------------------

HANDSHAKE_VERSION = "2025-11-25"
SESSION_HEADER = "Mcp-Session-Id"
RELATED_TASK = "io.modelcontextprotocol/related-task"


def rpc(method: str, params: dict[str, Any] | None = None, *, id: Any = 1) -> dict[str, Any]:
    """A bare JSON-RPC request (no ``_meta`` envelope), as the handshake wire sends it."""
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        body["params"] = params
    return body


def initialize(
    version: str = HANDSHAKE_VERSION, capabilities: dict[str, Any] | None = None, *, id: Any = 0
) -> dict[str, Any]:
    return rpc(
        "initialize",
        {
            "protocolVersion": version,
            "capabilities": {"elicitation": {}} if capabilities is None else capabilities,
            "clientInfo": {"name": "tests", "version": "1"},
        },
        id=id,
    )


def handshake_headers(
    session_id: str | None = None, version: str | None = HANDSHAKE_VERSION
) -> dict[str, str | None]:
    """The headers of a handshake-wire POST (None: not sent; the 2026 ones are dropped)."""
    return {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": version,
        SESSION_HEADER: session_id,
        "Mcp-Method": None,
        "Mcp-Name": None,
    }


class HandshakeSession:
    """One client's session over raw HTTP on the handshake wire (``connect`` opens it)."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token
        self.session: str | None = None

    def post(self, body: dict[str, Any], timeout: float = 60, **extra: str) -> httpx.Response:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {self.token}",
            **extra,
        }
        if self.session is not None:
            headers[SESSION_HEADER] = self.session
            headers["MCP-Protocol-Version"] = HANDSHAKE_VERSION
        return httpx.post(self.url, content=json.dumps(body), headers=headers, timeout=timeout)

    def connect(self, capabilities: dict[str, Any] | None = None) -> dict[str, Any]:
        """Initialize a session whose client declares CAPABILITIES (by default elicitation);
        return the initialize result."""
        self.session = None
        response = self.post(initialize(capabilities=capabilities))
        assert response.status_code == 200, response.text
        self.session = response.headers[SESSION_HEADER]
        assert (
            self.post({"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202
        )
        return dict(response.json()["result"])

    def call(
        self, method: str, params: dict[str, Any] | None = None, **extra: str
    ) -> dict[str, Any]:
        response = self.post(rpc(method, params), **extra)
        assert response.status_code == 200, response.text
        return json_of(response)


def json_of(response: Any) -> dict[str, Any]:
    """The one JSON-RPC message of a response, JSON or event stream."""
    if response.headers.get("Content-Type", "").startswith("text/event-stream"):
        return sse_messages(response)[-1]
    body: dict[str, Any] = json.loads(response.content)
    return body
