"""MCP clients Taskdesk did not write, against a live stack as `make run` starts it (gunicorn,
the leg worker, the control worker and beat) on PostgreSQL and the run's broker (Redis in CI):

- FastMCP 4.1.4 with fastmcp-tasks 4.1.4 (its own virtualenv, tests/clients/__init__.py),
  driven one command at a time by tests/clients/fastmcp_drive.py: on 2026-07-28
  ``call_tool_task`` then ``status()``, ``result()`` and ``cancel()``, a question answered by
  its elicitation handler, and a keyed call through plain ``call_tool``; in its legacy mode
  (2025-11-25), where FastMCP has no tasks runtime, synchronous and keyed calls and a
  question on the call's own stream;
- the MCP Inspector 2.12.0's CLI (``--cli``, tests/clients/node), on both eras: ``tools/list``
  and ``tools/call`` of each demo tool;
- the official Python SDK (``mcp``) where test_sdk_client.py and test_handshake_clients.py
  leave gaps: without the tasks extension on 2026-07-28, and keyed and refused calls in its
  legacy mode.

Every call is followed by a count of the tasks in the database: a call that makes a task
makes exactly one (the one the client was told about), and a synchronous call makes none.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import mcp_types
import pytest
from django.db import connection
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from elicitations import selectors as inbox
from elicitations import transitions as answers
from tasks_app.models import Task
from tests import clients
from tests.integration.test_sdk_client import Tasks, confirm_everything
from tests.live import LiveStack, live_stack, wait_for

pytestmark = [pytest.mark.live, pytest.mark.postgres]

KEY = "dev.taskdesk/idempotencyKey"
RELATED = "io.modelcontextprotocol/related-task"
T = TypeVar("T")
DEMO_TOOLS = {"export_report", "refund_payment", "confirm_action", "slow_echo", "send_notice"}


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker) -> Iterator[LiveStack]:  # type: ignore[no-untyped-def]
    """One running stack for this module; each test writes (and loses) its own rows. Its
    tasks ask to be polled every 200 ms (the clients follow pollIntervalMs), not every second."""
    with (
        django_db_blocker.unblock(),
        live_stack(env={"TASKDESK_POLL_INTERVAL_MS": "200"}) as running,
    ):
        yield running


class Ledger:
    """The tasks in the database, to tell which ones each call made."""

    def __init__(self) -> None:
        self.seen = set(Task.objects.values_list("pk", flat=True))

    def new(self) -> list[Task]:
        made = list(Task.objects.exclude(pk__in=self.seen).order_by("created_at"))
        self.seen |= {task.pk for task in made}
        return made

    def made_one(self) -> Task:
        made = self.new()
        assert len(made) == 1, f"expected one new task, found {[(t.pk, t.tool_name) for t in made]}"
        return made[0]

    def made_none(self) -> None:
        made = self.new()
        assert made == [], (
            f"expected no new task, found {[(t.pk, t.tool_name, t.status) for t in made]}"
        )


@pytest.fixture
def ledger(transactional_db) -> Ledger:  # type: ignore[no-untyped-def]
    return Ledger()


def text_of(result: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in result["content"])


# --- FastMCP ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def fastmcp_python() -> Path:
    return clients.fastmcp_python()


class FastMCP:
    """tests/clients/fastmcp_drive.py in the FastMCP virtualenv: one connected client."""

    def __init__(self, python: Path, url: str, token: str, mode: str, log: Path) -> None:
        self.log = log
        with log.open("wb") as stderr:
            self.proc = subprocess.Popen(
                [str(python), str(clients.FASTMCP_DRIVER), url, token, mode],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self._answer() == {"ok": "connected"}

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")  # the driver ended

    def _answer(self, timeout: float = 60) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            line = ""
        assert line, f"the FastMCP client did not answer:\n{self.stderr()}"
        return json.loads(line)  # type: ignore[no-any-return]

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def __call__(self, op: str, **arguments: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **arguments}) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def ok(self, op: str, **arguments: Any) -> Any:
        answer = self(op, **arguments)
        assert "ok" in answer, f"{op} {arguments}: {answer}\n{self.stderr()}"
        return answer["ok"]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@contextlib.contextmanager
def fastmcp(python: Path, stack: LiveStack, token: str, mode: str) -> Iterator[FastMCP]:
    client = FastMCP(python, stack.mcp_url, token, mode, stack.tmp / f"fastmcp-{mode}.log")
    try:
        yield client
    finally:
        client.close()


def test_fastmcp_client_follows_answers_and_cancels_tasks_on_2026(  # type: ignore[no-untyped-def]
    stack, alice_token, ledger, fastmcp_python
) -> None:
    with fastmcp(fastmcp_python, stack, alice_token, "auto") as client:
        assert client.ok("hello") == {"protocolVersion": "2026-07-28"}
        assert set(client.ok("list_tools")) >= DEMO_TOOLS
        ledger.made_none()

        # call_tool_task returns at the receipt; status() and result() follow the task.
        created = client.ok(
            "call_tool_task", name="slow_echo", arguments={"text": "hi", "seconds": 1}
        )
        task = ledger.made_one()
        assert created["taskId"] == task.pk and task.era == "2026-07-28"
        assert created["created"]["resultType"] == "task"
        assert created["created"]["status"] == "working"
        status = client.ok("status", task=task.pk)
        assert status["taskId"] == task.pk and status["status"] in ("working", "completed")
        result = client.ok("result", task=task.pk)
        assert result["content"] == [{"type": "text", "text": "hi"}] and not result["isError"]
        ledger.made_none()

        # The task's question goes to the client's elicitation handler; its answer (sent with
        # tasks/update) resumes the task.
        client.ok("answer_with", action="accept", content={"confirm": True})
        created = client.ok("call_tool_task", name="confirm_action", arguments={"action": "deploy"})
        task = ledger.made_one()
        assert created["taskId"] == task.pk
        result = client.ok("result", task=task.pk)
        assert result["structuredContent"] == {"confirmed": True}
        assert text_of(result) == "Confirmed: deploy"
        (asked,) = client.ok("asked")
        assert asked["message"] == "Confirm: deploy"
        assert asked["requestedSchema"]["properties"]["confirm"]["type"] == "boolean"
        question = task.input_requests.get()
        assert (question.status, question.channel) == ("answered", "tasks/update")
        ledger.made_none()

        # cancel() stops a long task at its next checkpoint; result() then raises.
        created = client.ok(
            "call_tool_task", name="slow_echo", arguments={"text": "long", "seconds": 60}
        )
        task = ledger.made_one()
        asked_at = time.monotonic()
        client.ok("cancel", task=task.pk)
        final = client.ok("wait", task=task.pk, timeout=15)
        assert final["status"] == "cancelled" and time.monotonic() - asked_at < 10
        outcome = client("result", task=task.pk)
        assert outcome["error"]["type"] == "ToolError"
        assert outcome["error"]["message"] == f"Task {task.pk} was cancelled"
        task.refresh_from_db()
        assert task.status == "cancelled"

        # Plain call_tool follows the task it gets by itself (a keyed one, here).
        result = client.ok(
            "call_tool",
            name="export_report",
            arguments={"quarter": "Q3", "rows": 5},
            meta={KEY: "fastmcp-export-q3"},
        )
        task = ledger.made_one()
        assert (task.idempotency_key, task.status) == ("fastmcp-export-q3", "completed")
        assert result["structuredContent"]["rows"] == 5
        # The result names the file in the server's export folder, not a server path.
        assert result["structuredContent"]["file"] == f"{task.pk}.csv"
        ledger.made_none()


def test_fastmcp_client_in_its_legacy_mode(stack, alice_token, ledger, fastmcp_python) -> None:  # type: ignore[no-untyped-def]
    """FastMCP has no runtime for the 2025-11-25 tasks: in legacy mode it calls tools
    synchronously, and a keyed call of an optional tool waits for its durable task."""
    with fastmcp(fastmcp_python, stack, alice_token, "legacy") as client:
        assert client.ok("hello") == {"protocolVersion": "2025-11-25"}
        tools = client.ok("list_tools")
        assert tools["export_report"] == "required" and tools["slow_echo"] == "optional"
        assert tools["greet"] == "forbidden"
        ledger.made_none()

        result = client.ok(
            "call_tool", name="slow_echo", arguments={"text": "in the call", "seconds": 0.2}
        )
        assert text_of(result) == "in the call"
        ledger.made_none()

        result = client.ok(
            "call_tool",
            name="slow_echo",
            arguments={"text": "durable", "seconds": 0.2},
            meta={KEY: "fastmcp-legacy-durable"},
        )
        task = ledger.made_one()
        assert text_of(result) == "durable"
        assert result["_meta"][RELATED] == {"taskId": task.pk}
        assert (task.era, task.idempotency_key, task.status) == (
            "2025-11-25",
            "fastmcp-legacy-durable",
            "completed",
        )

        # A synchronous call's question comes on the call's stream, to the handler.
        client.ok("answer_with", action="accept", content={"username": "ada", "email": "a@b.c"})
        result = client.ok("call_tool", name="test_elicitation", arguments={"message": "Who?"})
        assert "a@b.c" in text_of(result) and not result["isError"]
        (asked,) = client.ok("asked")
        assert asked["message"] == "Who?"
        ledger.made_none()

        # A tool that runs only as a task is refused, naming what is missing; nothing is made.
        refused = client("call_tool", name="confirm_action", arguments={"action": "deploy"})
        assert refused["error"]["code"] == -32601, refused
        assert "params.task" in refused["error"]["message"], refused
        ledger.made_none()

        # call_tool_task needs the 2026 wire: the call ran synchronously and FastMCP says so.
        refused = client("call_tool_task", name="slow_echo", arguments={"text": "x", "seconds": 0})
        assert refused["error"]["type"] == "ToolError"
        assert "did not run as a task" in refused["error"]["message"]
        ledger.made_none()


# --- The MCP Inspector's CLI --------------------------------------------------------------------


def inspector(
    stack: LiveStack, token: str, era: str, home: Path, *args: str
) -> subprocess.Popen[str]:
    """The Inspector CLI (``--cli``) against STACK in ERA (legacy or modern), started."""
    launcher = clients.INSPECTOR / "clients" / "launcher" / "build" / "index.js"
    command = [str(clients.node()), str(launcher), "--cli", stack.mcp_url, "--transport", "http"]
    command += ["--header", f"Authorization: Bearer {token}", "--protocol-era", era]
    return subprocess.Popen(
        [*command, "--format", "json", *args],
        cwd=clients.NODE_DIR,
        env={**os.environ, "HOME": str(home)},  # its settings folder: a fresh one
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(
            f"the Inspector did not finish in {timeout} s:\n{out}\n{err}"
        ) from None
    return proc.returncode, out, err


def run_inspector(stack: LiveStack, token: str, era: str, home: Path, *args: str) -> dict[str, Any]:
    """Run the Inspector CLI; return its JSON result (it must succeed)."""
    code, out, err = finished(inspector(stack, token, era, home, *args))
    assert code == 0 and out.strip(), f"exit {code}:\n{out}\n{err}"
    answer: dict[str, Any] = json.loads(out)
    assert "result" in answer, answer
    return answer["result"]  # type: ignore[no-any-return]


def call(tool: str, arguments: dict[str, Any], key: str | None = None) -> list[str]:
    args = [
        "--method",
        "tools/call",
        "--tool-name",
        tool,
        "--tool-args-json",
        json.dumps(arguments),
    ]
    return [*args, "--tool-metadata", f"{KEY}={key}"] if key else args


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_the_inspector_cli_lists_and_calls_each_demo_tool(  # type: ignore[no-untyped-def]
    stack, alice_token, operator, ledger, era, tmp_path
) -> None:
    version = "2025-11-25" if era == "legacy" else "2026-07-28"

    tools = run_inspector(stack, alice_token, era, tmp_path, "--method", "tools/list")["tools"]
    listed = {tool["name"]: tool for tool in tools}
    assert set(listed) >= DEMO_TOOLS
    if era == "legacy":  # the 2026 wire does not show a tool's task policy
        assert listed["export_report"]["execution"] == {"taskSupport": "required"}
        assert listed["slow_echo"]["execution"] == {"taskSupport": "optional"}
    ledger.made_none()

    # An optional tool without a key: a task on 2026 (the Inspector declares the tasks
    # extension and follows it), a synchronous call on 2025-11-25 (it sends no params.task).
    result = run_inspector(
        stack, alice_token, era, tmp_path, *call("slow_echo", {"text": "hi", "seconds": 0.3})
    )
    assert result["content"] == [{"type": "text", "text": "hi"}] and not result["isError"]
    if era == "legacy":
        ledger.made_none()
    else:
        assert ledger.made_one().status == "completed"

    # With a key: one durable task on either era.
    key = f"inspector-{era}-echo"
    result = run_inspector(
        stack, alice_token, era, tmp_path, *call("slow_echo", {"text": "kept", "seconds": 0.2}, key)
    )
    task = ledger.made_one()
    assert text_of(result) == "kept"
    assert (task.idempotency_key, task.era, task.status) == (key, version, "completed")

    key = f"inspector-{era}-export"
    result = run_inspector(
        stack, alice_token, era, tmp_path, *call("export_report", {"quarter": "Q2", "rows": 7}, key)
    )
    task = ledger.made_one()
    assert (task.idempotency_key, task.status) == (key, "completed")
    assert result["structuredContent"]["rows"] == 7
    assert result["structuredContent"]["file"] == f"{task.pk}.csv"

    # The key in an argument of the tool's own (request_key).
    arguments = {"payment_id": f"p-{era}", "amount_cents": 500, "reason": "interop"}
    result = run_inspector(
        stack,
        alice_token,
        era,
        tmp_path,
        *call("refund_payment", arguments | {"request_key": f"inspector-{era}-refund"}),
    )
    task = ledger.made_one()
    assert result["structuredContent"]["amount_cents"] == 500
    assert result["structuredContent"]["refund_id"].startswith("rf_")
    assert (task.idempotency_key, task.status) == (f"inspector-{era}-refund", "completed")

    arguments = {"to": "ada@example.com", "subject": "Interop", "body": "Hello"}
    result = run_inspector(
        stack,
        alice_token,
        era,
        tmp_path,
        *call("send_notice", arguments | {"request_key": f"inspector-{era}-notice"}),
    )
    task = ledger.made_one()
    assert result["structuredContent"]["to"] == "ada@example.com"
    assert task.status == "completed"

    # A large refund waits for an operator's approval in the inbox; the Inspector waits too.
    arguments = {"payment_id": f"big-{era}", "amount_cents": 20000, "reason": "interop"}
    big = call("refund_payment", arguments | {"request_key": f"inspector-{era}-big"})
    how, code, out, err = answered_in_inbox(
        inspector(stack, alice_token, era, tmp_path, *big),
        operator,
        ledger,
        "refund_payment",
        {"decision": "approve"},
    )
    assert how == "inbox", f"exit {code}, stdout {out!r}, stderr {err!r}"
    assert code == 0, f"{out}\n{err}"
    assert json.loads(out)["result"]["structuredContent"]["amount_cents"] == 20000
    task = ledger.made_one()
    assert task.status == "completed"
    assert task.input_requests.get().channel == "inbox"

    # confirm_action asks the client, and the Inspector's CLI declares no elicitation
    # capability: the question goes to the inbox (answered here by an operator), or the
    # task fails naming the capability. It must not wait where nobody can answer it.
    how, code, out, err = answered_in_inbox(
        inspector(stack, alice_token, era, tmp_path, *call("confirm_action", {"action": "ship"})),
        operator,
        ledger,
        "confirm_action",
        {"confirm": True},
    )
    made = ledger.new()
    assert len(made) <= 1, made
    if how == "inbox":
        assert code == 0, f"{out}\n{err}"
        assert json.loads(out)["result"]["structuredContent"] == {"confirmed": True}
        assert made[0].status == "completed"
    else:
        assert "elicitation" in out + err, f"exit {code}, stdout {out!r}, stderr {err!r}"
        assert all(task.status == "failed" for task in made), [t.status for t in made]


def answered_in_inbox(
    proc: subprocess.Popen[str],
    operator: Any,
    ledger: Ledger,
    tool: str,
    content: dict[str, Any],
) -> tuple[str, int, str, str]:
    """Wait until the Inspector's call of TOOL (PROC) has ended ("exited") or its question
    waits in OPERATOR's inbox ("inbox"), in which case the operator accepts it with CONTENT
    and the call is waited for; return how, and the Inspector's exit code and output."""

    def reached() -> str | None:
        if proc.poll() is not None:
            return "exited"
        if inbox.inbox_for(user=operator).filter(task__tool_name=tool).exists():
            return "inbox"
        return None

    try:
        how = wait_for(
            "the question to reach someone who can answer it",
            reached,
            20,
            0.1,
            lambda: stuck(ledger, tool),
        )
        if how == "inbox":
            question = inbox.inbox_for(user=operator).get(task__tool_name=tool)
            answers.answer(
                task=question.task,
                key=question.key,
                response={"action": "accept", "content": content},
                channel="inbox",
                user=operator,
            )
        code, out, err = finished(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return how, code, out, err


def stuck(ledger: Ledger, tool: str) -> str:
    tasks = Task.objects.filter(tool_name=tool).exclude(pk__in=ledger.seen)
    return "; ".join(
        f"task {task.pk} is {task.status}, its questions: "
        f"{list(task.input_requests.values('audience', 'status', 'channel'))}"
        for task in tasks
    )


# --- The official Python SDK --------------------------------------------------------------------


def sdk(url: str, token: str, **options: Any) -> Client:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    return Client(streamable_http_client(url, http_client=http), **options)


async def not_here(context: Any, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
    raise AssertionError("a task's question comes in tasks/get, not as elicitation/create")


def first_text(result: mcp_types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, mcp_types.TextContent)
    return block.text


def test_the_python_sdk_without_the_tasks_extension_and_in_legacy_mode(  # type: ignore[no-untyped-def]
    stack, alice_token, ledger
) -> None:
    """What test_sdk_client.py and test_handshake_clients.py leave out: the SDK as it comes
    (no tasks extension) on 2026-07-28, keyed and refused calls in legacy mode, and on both a
    count of the tasks each call made."""

    def closing(check: Callable[[], T]) -> Callable[[], T]:
        def run() -> T:
            try:
                return check()
            finally:
                connection.close()  # this worker thread's own connection

        return run

    async def made_one() -> Task:
        return await anyio.to_thread.run_sync(closing(ledger.made_one))

    async def made_none() -> None:
        await anyio.to_thread.run_sync(closing(ledger.made_none))

    async def scenario() -> None:
        async with sdk(stack.mcp_url, alice_token) as client:
            assert client.protocol_version == "2026-07-28"
            # An optional tool runs in the call; with a key, as a durable task it waits for.
            result = await client.call_tool("slow_echo", {"text": "now", "seconds": 0.2})
            assert first_text(result) == "now"
            await made_none()
            result = await client.call_tool(
                "slow_echo", {"text": "kept", "seconds": 0.2}, meta={KEY: "sdk-plain-kept"}
            )
            task = await made_one()
            assert first_text(result) == "kept" and task.idempotency_key == "sdk-plain-kept"
            assert (result.meta or {})["dev.taskdesk/taskId"] == task.pk
            # A tool that runs only as a task names the extension the client did not declare.
            with pytest.raises(MCPError) as refused:
                await client.call_tool("confirm_action", {"action": "deploy"})
            assert refused.value.error.code == -32021
            assert "io.modelcontextprotocol/tasks" in refused.value.error.message
            await made_none()

        # With a tasks extension (test_sdk_client.py's) and an elicitation callback, which
        # declares that the client answers questions (Tasks answers them with tasks/update).
        tasks = Tasks(confirm_everything)
        async with sdk(
            stack.mcp_url, alice_token, extensions=[tasks], elicitation_callback=not_here
        ) as client:
            result = await client.call_tool("confirm_action", {"action": "deploy"})
            assert result.structured_content == {"confirmed": True}
            assert (await made_one()).status == "completed"

        async with sdk(stack.mcp_url, alice_token, mode="legacy") as client:
            assert client.protocol_version == "2025-11-25"
            result = await client.call_tool(
                "slow_echo", {"text": "durable", "seconds": 0.2}, meta={KEY: "sdk-legacy-kept"}
            )
            task = await made_one()
            assert first_text(result) == "durable"
            assert (result.meta or {})[RELATED] == {"taskId": task.pk}
            assert (task.era, task.status) == ("2025-11-25", "completed")
            with pytest.raises(MCPError) as refused:
                await client.call_tool("export_report", {"quarter": "Q1"}, meta={KEY: "sdk-x"})
            assert "params.task" in refused.value.error.message
            await made_none()

    anyio.run(scenario)
