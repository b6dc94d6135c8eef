"""Raw 2026-07-28 requests to a live server, for the idempotency tests and the benchmark."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

VERSION = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
KEY_META = "dev.taskdesk/idempotencyKey"
REPLAYED_META = "dev.taskdesk/replayed"


def envelope(*, tasks: bool = True, meta_key: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientInfo": {"name": "idempotency-tests", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": (
            {"extensions": {TASKS: {}}} if tasks else {}
        ),
    }
    if meta_key is not None:
        meta[KEY_META] = meta_key
    return meta


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
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {
            "name": name,
            "arguments": arguments,
            "_meta": envelope(tasks=tasks, meta_key=meta_key),
        },
    }
    headers: dict[str, Any] = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": "tools/call",
        "Mcp-Name": name,
        "Authorization": f"Bearer {token}",
    }
    if key is not None:
        headers["Idempotency-Key"] = key
    return json.dumps(body).encode(), headers


def tasks_get(task_id: str, *, token: str) -> tuple[bytes, dict[str, Any]]:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tasks/get",
        "params": {"taskId": task_id, "_meta": envelope()},
    }
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": "tasks/get",
        "Mcp-Name": task_id,
        "Authorization": f"Bearer {token}",
    }
    return json.dumps(body).encode(), headers


def post(url: str, request: tuple[bytes, dict[str, Any]], timeout: float = 30) -> httpx.Response:
    body, headers = request
    return httpx.post(url, content=body, headers=headers, timeout=timeout)


def result_of(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body = response.json()
    assert "error" not in body, body
    result: dict[str, Any] = body["result"]
    return result


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert "error" in body, body
    error: dict[str, Any] = body["error"]
    return error


def wait_terminal(url: str, task_id: str, *, token: str, timeout: float = 60) -> dict[str, Any]:
    """Poll tasks/get until the task is terminal; return the last tasks/get result."""
    deadline = time.monotonic() + timeout
    while True:
        got = result_of(post(url, tasks_get(task_id, token=token)))
        if got["status"] in {"completed", "failed", "cancelled"}:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"task {task_id} still {got['status']} after {timeout} s")
        time.sleep(0.1)
