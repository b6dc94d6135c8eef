"""The 2025-11-25 handshake era in-process: initialize, sessions, the header rules, tools and
tasks on the same store as the 2026 wire.

No worker runs here: tasks are moved along with the transitions the runtime calls. The live
test (tests/integration/test_handshake_http.py) runs the same flow through real processes.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from tasks_app import transitions
from tasks_app.mcp import stream_slots
from tasks_app.models import Era, McpSession, Status, Task
from tests.tasks_app.mcp.conftest import Session
from tests.wire import (
    RELATED_TASK,
    REPLAYED_META,
    SESSION_HEADER,
    handshake_headers,
    initialize,
    json_of,
    request,
    result_of,
    rpc,
)

pytestmark = pytest.mark.django_db(transaction=True)

VISIBLE_ASCII = re.compile(r"^[\x21-\x7e]+$")
EXPORT = {"quarter": "Q3", "format": "csv", "rows": 10}


def ok(response) -> dict:  # type: ignore[no-untyped-def]
    assert response.status_code == 200, response.content
    body = json_of(response)
    assert "result" in body, body
    assert "resultType" not in body["result"]
    return body["result"]  # type: ignore[no-any-return]


def rpc_error(response) -> dict:  # type: ignore[no-untyped-def]
    # Method errors travel with HTTP 200 on this wire: the SDKs read codes from 2xx bodies.
    assert response.status_code == 200, response.content
    body = json_of(response)
    assert "error" in body, body
    return body["error"]  # type: ignore[no-any-return]


def create(
    session: Session, name: str = "slow_echo", arguments: dict | None = None, **headers
) -> dict:  # type: ignore[no-untyped-def]
    params = {
        "name": name,
        "arguments": arguments or {"text": "hi", "seconds": 5},
        "task": {"ttl": 60000},
    }
    return ok(session.call("tools/call", params, **headers))["task"]  # type: ignore[no-any-return]


# --- initialize and sessions -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "answered"),
    [
        ("2025-11-25", "2025-11-25"),
        ("2025-06-18", "2025-06-18"),
        ("2025-03-26", "2025-03-26"),
        ("2024-11-05", "2025-11-25"),
        ("2099-01-01", "2025-11-25"),
    ],
)
def test_initialize_negotiates_the_version(mcp, asked, answered) -> None:  # type: ignore[no-untyped-def]
    session = Session(mcp, asked)
    assert session.version == answered
    assert VISIBLE_ASCII.match(session.id)
    stored = McpSession.objects.get(pk=session.id)
    assert stored.client.name == "alice" and stored.protocol_version == answered
    assert session.result["serverInfo"]["name"] == "taskdesk"
    capabilities = session.result["capabilities"]
    assert {"tools", "prompts", "resources", "logging", "completions"} <= set(capabilities)
    if answered == "2025-11-25":
        assert capabilities["tasks"] == {
            "list": {},
            "cancel": {},
            "requests": {"tools": {"call": {}}},
        }
    else:
        assert "tasks" not in capabilities  # tasks arrived in 2025-11-25


def test_initialized_notification_and_ping(mcp) -> None:  # type: ignore[no-untyped-def]
    session = Session(mcp)
    note = session.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert note.status_code == 202 and note.content == b""
    assert ok(session.call("ping")) == {}


def test_an_initialize_with_the_2026_envelope_is_the_stateless_eras(mcp) -> None:  # type: ignore[no-untyped-def]
    # The stateless wire has no initialize: 404 with -32601, as its conformance set asks.
    response = mcp.post(request("initialize", {}))
    assert response.status_code == 404 and json.loads(response.content)["error"]["code"] == -32601


def test_session_rules(mcp, bob_mcp, settings) -> None:  # type: ignore[no-untyped-def]
    session = Session(mcp)
    missing = mcp.post(rpc("ping"), headers=handshake_headers(None))
    assert missing.status_code == 400
    assert "Mcp-Session-Id" in json.loads(missing.content)["error"]["message"]
    unknown = mcp.post(rpc("ping"), headers=handshake_headers("no-such-session"))
    assert unknown.status_code == 404
    # Another client's session is unknown to this one.
    assert bob_mcp.post(rpc("ping"), headers=handshake_headers(session.id)).status_code == 404
    # Any handshake version is accepted in the header after any negotiation; no header
    # means 2025-03-26; another value is not this era's (400).
    assert ok(session.call("ping", **{"MCP-Protocol-Version": "2025-03-26"})) == {}
    assert ok(session.call("ping", **{"MCP-Protocol-Version": None})) == {}
    assert session.call("ping", **{"MCP-Protocol-Version": "1999-01-01"}).status_code == 400


def test_idle_sessions_expire(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_SESSION_IDLE_SECONDS = 1
    session = Session(mcp)
    assert ok(session.call("ping")) == {}
    McpSession.objects.filter(pk=session.id).update(
        last_seen_at=timezone.now() - timedelta(seconds=2)
    )
    assert session.call("ping").status_code == 404
    assert not McpSession.objects.filter(pk=session.id).exists()


def test_use_keeps_a_session_alive(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_SESSION_IDLE_SECONDS = 100
    session = Session(mcp)
    old = timezone.now() - timedelta(seconds=50)
    McpSession.objects.filter(pk=session.id).update(last_seen_at=old)
    assert ok(session.call("ping")) == {}
    assert McpSession.objects.get(pk=session.id).last_seen_at > old


def test_delete_ends_the_session_and_not_the_tasks(mcp) -> None:  # type: ignore[no-untyped-def]
    session = Session(mcp)
    task = create(session)
    ended = mcp.http.delete(
        "/mcp",
        headers={"Authorization": f"Bearer {mcp.token}", SESSION_HEADER: session.id},
    )
    assert ended.status_code == 204
    assert session.call("ping").status_code == 404
    # The task is the client's: a new session reads it.
    assert ok(Session(mcp).call("tasks/get", {"taskId": task["taskId"]}))["status"] == "working"


def test_get_and_delete_without_a_session_are_405(mcp) -> None:  # type: ignore[no-untyped-def]
    auth = {"Authorization": f"Bearer {mcp.token}"}
    assert mcp.http.get("/mcp", headers=auth).status_code == 405
    assert mcp.http.delete("/mcp", headers=auth).status_code == 405


def test_the_get_stream_is_bounded_per_process(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_MAX_STREAMS = 1
    session = Session(mcp)
    headers = session.stream_headers()
    with stream_slots.take():
        refused = mcp.http.get("/mcp", headers=headers)
        assert refused.status_code == 429 and refused["Retry-After"] == "1"
        assert json.loads(refused.content)["error"]["data"]["reason"] == "busy"
    # A stream the server closes without ever reading it gives its slot back.
    unread = mcp.http.get("/mcp", headers=headers)
    assert stream_slots.held() == 1
    unread.close()
    assert stream_slots.held() == 0
    settings.TASKDESK_STREAM_SECONDS = 1
    settings.TASKDESK_KEEPALIVE_SECONDS = 0.2
    stream = mcp.http.get("/mcp", headers=headers)
    assert stream.status_code == 200 and stream["Content-Type"] == "text/event-stream"
    body = b"".join(stream.streaming_content)
    assert b": ping" in body  # keep-alive comments; the stream then ends (the client resumes)
    assert stream_slots.held() == 0


def test_logging_set_level(mcp) -> None:  # type: ignore[no-untyped-def]
    session = Session(mcp)
    assert ok(session.call("logging/setLevel", {"level": "debug"})) == {}
    assert McpSession.objects.get(pk=session.id).log_level == "debug"
    assert rpc_error(session.call("logging/setLevel", {"level": "loud"}))["code"] == -32602


# --- tools -----------------------------------------------------------------------------------


def test_tools_list_marks_task_support(mcp) -> None:  # type: ignore[no-untyped-def]
    tools = {t["name"]: t for t in ok(Session(mcp).call("tools/list"))["tools"]}
    assert tools["export_report"]["execution"] == {"taskSupport": "required"}
    assert tools["slow_echo"]["execution"] == {"taskSupport": "optional"}
    assert tools["greet"]["execution"] == {"taskSupport": "forbidden"}
    assert "ttlMs" not in tools and all("inputSchema" in t for t in tools.values())


def test_a_task_call_returns_a_nested_create_task_result(mcp) -> None:  # type: ignore[no-untyped-def]
    session = Session(mcp)
    task = create(session)
    assert task["status"] == "working"
    assert task["ttl"] == 7 * 24 * 3600 * 1000 and task["pollInterval"] == 1000
    assert "ttlMs" not in task and "pollIntervalMs" not in task
    row = Task.objects.get(pk=task["taskId"])
    assert row.era == Era.LEGACY and row.client.name == "alice"


def test_task_support_is_enforced(mcp) -> None:  # type: ignore[no-untyped-def]
    session = Session(mcp)
    required = session.call("tools/call", {"name": "export_report", "arguments": EXPORT})
    assert rpc_error(required)["code"] == -32601
    forbidden = session.call(
        "tools/call", {"name": "greet", "arguments": {"name": "x"}, "task": {}}
    )
    assert rpc_error(forbidden)["code"] == -32601
    assert Task.objects.count() == 0
    # A synchronous call where the tool allows one.
    text = ok(session.call("tools/call", {"name": "greet", "arguments": {"name": "Ann"}}))
    assert text["content"][0]["text"] == "Hello, Ann!"
    unknown = session.call("tools/call", {"name": "nope", "arguments": {}})
    assert rpc_error(unknown)["code"] == -32602


def test_idempotency_keys_are_the_clients_not_the_sessions(mcp, bob_mcp) -> None:  # type: ignore[no-untyped-def]
    first = Session(mcp)
    params = {"name": "export_report", "arguments": EXPORT, "task": {}}
    created = ok(first.call("tools/call", params, **{"Idempotency-Key": "q3"}))
    assert created["_meta"][REPLAYED_META] is False
    # A retry in a new session: the same task, marked as a replay.
    again = ok(Session(mcp).call("tools/call", params, **{"Idempotency-Key": "q3"}))
    assert again["task"]["taskId"] == created["task"]["taskId"]
    assert again["_meta"][REPLAYED_META] is True
    # The same key in _meta is the same key.
    meta = {**params, "_meta": {"dev.taskdesk/idempotencyKey": "q3"}}
    assert ok(first.call("tools/call", meta))["task"]["taskId"] == created["task"]["taskId"]
    # Other arguments under the key: refused, nothing written.
    reused = first.call(
        "tools/call", {**params, "arguments": {**EXPORT, "rows": 11}}, **{"Idempotency-Key": "q3"}
    )
    assert rpc_error(reused)["data"]["reason"] == "idempotency_key_reused"
    # Keyless: a required key is asked for, saying how to send it.
    keyless = rpc_error(first.call("tools/call", params))
    assert "Idempotency-Key" in keyless["message"]
    # Another client's same key is its own task.
    other = ok(Session(bob_mcp).call("tools/call", params, **{"Idempotency-Key": "q3"}))
    assert other["task"]["taskId"] != created["task"]["taskId"]
    assert Task.objects.count() == 2


# --- tasks -------------------------------------------------------------------------------------


def test_tasks_get_result_and_cancel(mcp, bob_mcp) -> None:  # type: ignore[no-untyped-def]
    session = Session(mcp)
    task = create(session)
    got = ok(session.call("tasks/get", {"taskId": task["taskId"]}))
    assert got["taskId"] == task["taskId"] and got["status"] == "working"
    assert "result" not in got
    # Another client's task answers like an unknown one.
    foreign = Session(bob_mcp).call("tasks/get", {"taskId": task["taskId"]})
    assert rpc_error(foreign)["code"] == -32602
    transitions.complete(
        task_id=task["taskId"], result={"content": [{"type": "text", "text": "hi"}]}
    )
    assert ok(session.call("tasks/get", {"taskId": task["taskId"]}))["status"] == "completed"
    result = ok(session.call("tasks/result", {"taskId": task["taskId"]}))
    assert result["content"] == [{"type": "text", "text": "hi"}]
    assert result["_meta"][RELATED_TASK] == {"taskId": task["taskId"]}
    terminal = rpc_error(session.call("tasks/cancel", {"taskId": task["taskId"]}))
    assert terminal["code"] == -32602 and "completed" in terminal["message"]


def test_a_tool_error_is_failed_in_this_era_and_completed_in_2026(mcp) -> None:  # type: ignore[no-untyped-def]
    session = Session(mcp)
    task = create(session)
    error = {"content": [{"type": "text", "text": "no"}], "isError": True}
    transitions.complete(task_id=task["taskId"], result=error)
    assert ok(session.call("tasks/get", {"taskId": task["taskId"]}))["status"] == "failed"
    result = ok(session.call("tasks/result", {"taskId": task["taskId"]}))
    assert result["isError"] is True and result["content"][0]["text"] == "no"
    modern = result_of(mcp.call("tasks/get", {"taskId": task["taskId"]}, tasks=True))
    assert modern["status"] == "completed" and modern["result"]["isError"] is True


def test_a_failed_task_gives_its_error(mcp) -> None:  # type: ignore[no-untyped-def]
    session = Session(mcp)
    task = create(session)
    transitions.fail(task_id=task["taskId"], error={"code": -32603, "message": "broken"})
    error = rpc_error(session.call("tasks/result", {"taskId": task["taskId"]}))
    assert (error["code"], error["message"]) == (-32603, "broken")
    assert error["data"][RELATED_TASK] == {"taskId": task["taskId"]}


def test_cancel_moves_the_task_to_cancelled_before_answering(mcp) -> None:  # type: ignore[no-untyped-def]
    session = Session(mcp)
    task = create(session)
    cancelled = ok(session.call("tasks/cancel", {"taskId": task["taskId"]}))
    assert cancelled["status"] == "cancelled" and cancelled["taskId"] == task["taskId"]
    assert Task.objects.get(pk=task["taskId"]).status == Status.CANCELLED


def test_tasks_list_pages_through_the_clients_own_tasks(mcp, bob_mcp, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tasks_app.mcp.handlers import handshake as handlers

    monkeypatch.setattr(handlers, "TASKS_PAGE", 2)
    session = Session(mcp)
    made = [create(session)["taskId"] for _ in range(3)]
    # A task created on the 2026 wire is the same client's, and listed too.
    modern = result_of(
        mcp.call("tools/call", {"name": "slow_echo", "arguments": {"text": "x"}}, tasks=True)
    )
    made.append(modern["taskId"])
    first = ok(session.call("tasks/list"))
    assert len(first["tasks"]) == 2 and "nextCursor" in first
    second = ok(session.call("tasks/list", {"cursor": first["nextCursor"]}))
    assert "nextCursor" not in second
    listed = [t["taskId"] for t in first["tasks"] + second["tasks"]]
    assert sorted(listed) == sorted(made) and len(set(listed)) == 4
    assert ok(Session(bob_mcp).call("tasks/list")) == {"tasks": []}
    assert rpc_error(session.call("tasks/list", {"cursor": "garbage"}))["code"] == -32602


def test_tasks_are_read_from_either_era(mcp) -> None:  # type: ignore[no-untyped-def]
    session = Session(mcp)
    legacy = create(session)["taskId"]
    modern = result_of(
        mcp.call("tools/call", {"name": "slow_echo", "arguments": {"text": "x"}}, tasks=True)
    )["taskId"]
    assert ok(session.call("tasks/get", {"taskId": modern}))["status"] == "working"
    assert result_of(mcp.call("tasks/get", {"taskId": legacy}, tasks=True))["status"] == "working"


def test_blocking_result_waits_for_the_end(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    import threading

    settings.TASKDESK_KEEPALIVE_SECONDS = 0.2
    session = Session(mcp)
    task = create(session)
    done = {"content": [{"type": "text", "text": "late"}]}
    timer = threading.Timer(1.0, lambda: transitions.complete(task_id=task["taskId"], result=done))
    timer.start()
    try:
        response = session.call("tasks/result", {"taskId": task["taskId"]})
        # Still running after the keep-alive interval: the answer became an event stream,
        # with keep-alive comments until the result.
        assert response["Content-Type"] == "text/event-stream"
        raw = b"".join(response.streaming_content)
        assert b": ping" in raw and b"id: r." in raw  # resumable from its priming event
        last = events_of(raw)[-1]
        assert last["result"]["content"] == [{"type": "text", "text": "late"}]
        assert last["result"]["_meta"][RELATED_TASK] == {"taskId": task["taskId"]}
    finally:
        timer.join()
    assert stream_slots.held() == 0


def test_initialize_is_refused_clearly_without_params(mcp) -> None:  # type: ignore[no-untyped-def]
    body = initialize()
    del body["params"]["protocolVersion"]
    assert rpc_error(mcp.post(body, headers=handshake_headers(None, None)))["code"] == -32602


def test_the_purge_job_forgets_idle_sessions(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    from tasks_app.tasks import purge_expired_job

    settings.TASKDESK_SESSION_IDLE_SECONDS = 60
    idle, fresh = Session(mcp), Session(mcp)
    McpSession.objects.filter(pk=idle.id).update(last_seen_at=timezone.now() - timedelta(minutes=2))
    purge_expired_job()
    assert list(McpSession.objects.values_list("pk", flat=True)) == [fresh.id]


# --- questions -----------------------------------------------------------------------------


def open_question(task_id: str, key: str = "confirm", audience: str = "client") -> None:
    from elicitations import transitions as elicitation_transitions

    task = Task.objects.get(pk=task_id)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    elicitation_transitions.open_request(
        task=task, ask_key=key, message=f"{key}?", schema=schema, audience=audience
    )
    if task.status == Status.WORKING:
        transitions.require_input(task_id=task_id, message="waiting")


def events_of(chunks) -> list[dict]:  # type: ignore[no-untyped-def]
    lines = chunks.decode().splitlines()
    # Priming events carry an id and no data.
    return [json.loads(line[5:]) for line in lines if line.startswith("data:") and line[5:].strip()]


def test_a_question_goes_on_the_result_stream_and_the_response_answers_it(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    from elicitations.models import InputRequest

    settings.TASKDESK_KEEPALIVE_SECONDS = 0.2
    session = Session(mcp, capabilities={"elicitation": {"form": {}}})
    task_id = create(session)["taskId"]
    open_question(task_id, "confirm")
    open_question(task_id, "approve", audience="operator")  # stays in the inbox
    response = session.call("tasks/result", {"taskId": task_id})
    assert response["Content-Type"] == "text/event-stream"
    seen: list[dict] = []
    for chunk in response.streaming_content:
        for message in events_of(chunk):
            seen.append(message)
            if message.get("method") == "elicitation/create":
                answer = {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "result": {"action": "accept", "content": {"ok": True}},
                }
                assert session.post(answer).status_code == 202
                # A second answer changes nothing: the first one won.
                late = {**answer, "result": {"action": "decline"}}
                assert session.post(late).status_code == 202
                InputRequest.objects.filter(task_id=task_id, ask_key="approve").update(
                    status="answered"
                )
                transitions.complete(
                    task_id=task_id, result={"content": [{"type": "text", "text": "ok"}]}
                )
    questions = [m for m in seen if m.get("method") == "elicitation/create"]
    assert len(questions) == 1
    params = questions[0]["params"]
    assert params["mode"] == "form" and params["message"] == "confirm?"
    assert params["_meta"][RELATED_TASK] == {"taskId": task_id}
    answered = InputRequest.objects.get(task_id=task_id, ask_key="confirm")
    assert (answered.status, answered.channel, answered.answer["content"]) == (
        "answered",
        "elicitation/create",
        {"ok": True},
    )
    assert seen[-1]["result"]["content"] == [{"type": "text", "text": "ok"}]


def test_a_client_without_elicitation_is_not_asked(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    import threading

    settings.TASKDESK_KEEPALIVE_SECONDS = 0.2
    # Accepted in a session that declared elicitation, so the question is the client's; its
    # result is asked for in one that did not.
    task_id = create(Session(mcp, capabilities={"elicitation": {}}))["taskId"]
    open_question(task_id)
    session = Session(mcp, capabilities={})
    done = {"content": [{"type": "text", "text": "ok"}]}
    timer = threading.Timer(1.0, lambda: transitions.complete(task_id=task_id, result=done))
    timer.start()
    try:
        raw = b"".join(session.call("tasks/result", {"taskId": task_id}).streaming_content)
    finally:
        timer.join()
    assert b"elicitation/create" not in raw


def test_the_get_stream_carries_status_and_questions_no_result_stream_carries(
    mcp, settings
) -> None:  # type: ignore[no-untyped-def]
    import threading

    settings.TASKDESK_STREAM_SECONDS = 3
    settings.TASKDESK_KEEPALIVE_SECONDS = 0.5
    session = Session(mcp, capabilities={"elicitation": {}})
    waiting = create(session)["taskId"]
    open_question(waiting)
    running = create(session)["taskId"]
    done = {"content": [{"type": "text", "text": "ok"}]}
    timer = threading.Timer(0.5, lambda: transitions.complete(task_id=running, result=done))
    headers = session.stream_headers()
    stream = mcp.http.get("/mcp", headers=headers)
    timer.start()
    try:
        messages = events_of(b"".join(stream.streaming_content))
    finally:
        timer.join()
    statuses = [m["params"] for m in messages if m.get("method") == "notifications/tasks/status"]
    assert {"taskId": running, "status": "completed"}.items() <= statuses[-1].items()
    questions = [m for m in messages if m.get("method") == "elicitation/create"]
    assert len(questions) == 1 and questions[0]["id"].startswith(f"taskdesk-q:{waiting}:")


def test_a_result_stream_closes_and_resumes_by_get_with_last_event_id(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    import threading

    settings.TASKDESK_KEEPALIVE_SECONDS = 0.1
    settings.TASKDESK_STREAM_SECONDS = 0.5
    session = Session(mcp)
    task_id = create(session)["taskId"]
    body = rpc("tasks/result", {"taskId": task_id})
    body["id"] = "result-7"
    first = b"".join(session.post(body).streaming_content).decode()
    # A priming event (id, retry, empty data), then the close: no answer on this stream.
    event_id = next(line[4:] for line in first.splitlines() if line.startswith("id: "))
    assert "retry: 1000" in first and '"result"' not in first
    settings.TASKDESK_STREAM_SECONDS = 30
    done = {"content": [{"type": "text", "text": "resumed"}]}
    timer = threading.Timer(0.5, lambda: transitions.complete(task_id=task_id, result=done))
    headers = session.stream_headers(**{"Last-Event-ID": event_id})
    timer.start()
    try:
        resumed = mcp.http.get("/mcp", headers=headers)
        assert resumed["Content-Type"] == "text/event-stream"
        messages = events_of(b"".join(resumed.streaming_content))
    finally:
        timer.join()
    assert messages[-1]["id"] == "result-7"
    assert messages[-1]["result"]["content"] == [{"type": "text", "text": "resumed"}]
    # A made-up event id is refused; another client's task is not found.
    assert mcp.http.get("/mcp", headers={**headers, "Last-Event-ID": "nope"}).status_code == 400
    assert stream_slots.held() == 0


def test_a_question_goes_to_a_session_once_and_again_only_to_a_stream_resumed_before_it(
    mcp, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_KEEPALIVE_SECONDS = 0.1
    settings.TASKDESK_STREAM_SECONDS = 0.5
    session = Session(mcp, capabilities={"elicitation": {"form": {}}})
    task_id = create(session)["taskId"]
    open_question(task_id, "confirm")

    def sse(raw: bytes) -> list[tuple[str | None, dict | None]]:
        """(event id, message) per event of RAW."""
        out = []
        for block in raw.decode().split("\n\n"):
            fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
            data = fields.get("data", "").strip()
            if "id" in fields or data:
                out.append((fields.get("id"), json.loads(data) if data else None))
        return out

    def asked(events: list[tuple[str | None, dict | None]]) -> list[str | None]:
        return [i for i, m in events if m and m.get("method") == "elicitation/create"]

    def resume(event_id: str) -> list[tuple[str | None, dict | None]]:
        headers = session.stream_headers(**{"Last-Event-ID": event_id})
        return sse(b"".join(mcp.http.get("/mcp", headers=headers).streaming_content))

    body = rpc("tasks/result", {"taskId": task_id})
    body["id"] = "result-1"
    first = sse(b"".join(session.post(body).streaming_content))
    priming = first[0][0]
    [question_id] = asked(first)  # the question, with an event id of its own
    assert priming and question_id and question_id != priming

    # Resumed after the question: the client has it, and it is not sent again.
    assert asked(resume(question_id)) == []
    # Resumed from before it (the question was lost with the stream): sent again.
    assert len(asked(resume(priming))) == 1
    # The session's other streams leave it alone: a second tasks/result, the GET stream.
    body["id"] = "result-2"
    assert asked(sse(b"".join(session.post(body).streaming_content))) == []
    stream = mcp.http.get("/mcp", headers=session.stream_headers())
    assert asked(sse(b"".join(stream.streaming_content))) == []
    # Another session of the same client is asked on its own stream.
    other = Session(mcp, capabilities={"elicitation": {"form": {}}})
    assert len(asked(sse(b"".join(other.post(body).streaming_content)))) == 1


def test_responses_to_the_server_are_accepted_and_kept_once(mcp) -> None:  # type: ignore[no-untyped-def]
    from tasks_app import sessions
    from tasks_app.models import McpReply

    session = Session(mcp)
    sessions.await_replies(session_id=session.id, request_ids=["taskdesk-s:abc:key"])
    reply = {"jsonrpc": "2.0", "id": "taskdesk-s:abc:key", "result": {"action": "accept"}}
    assert session.post(reply).status_code == 202
    assert session.post({**reply, "result": {"action": "decline"}}).status_code == 202
    kept = McpReply.objects.get()
    assert (kept.request_id, kept.body["result"]) == ("taskdesk-s:abc:key", {"action": "accept"})
    # A response to an id the server is not waiting for is accepted and dropped.
    assert session.post({**reply, "id": "taskdesk-s:abc:other"}).status_code == 202
    assert McpReply.objects.count() == 1
    # An error response with a null id (the client could not read a request) is accepted too.
    failed = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse"}}
    assert session.post(failed).status_code == 202
    assert session.post({"jsonrpc": "2.0", "id": 5}).status_code == 400


# --- synchronous calls that run as durable tasks, and streams the client resumes ------------


def test_a_durable_synchronous_call_outlives_its_stream_and_resumes_by_get(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    import threading

    settings.TASKDESK_KEEPALIVE_SECONDS = 0.1
    session = Session(mcp)
    body = rpc("tools/call", {"name": "test_reconnection", "arguments": {}})
    body["id"] = 1
    first = session.post(body)
    assert first["Content-Type"] == "text/event-stream"
    raw = b"".join(first.streaming_content).decode()
    # The priming event comes first; the stream then closes (stream_seconds=0.3) unanswered.
    assert raw.startswith("id: r.") and "retry: 1000" in raw and '"result"' not in raw
    event_id = raw.splitlines()[0][4:]
    task = Task.objects.get()  # the call is a durable task of this client
    assert (task.tool_name, task.client.name, task.status) == (
        "test_reconnection",
        "alice",
        Status.WORKING,
    )
    done = {"content": [{"type": "text", "text": "after the reconnect"}]}
    timer = threading.Timer(0.3, lambda: transitions.complete(task_id=task.pk, result=done))
    headers = session.stream_headers(**{"Last-Event-ID": event_id})
    timer.start()
    try:
        resumed = events_of(b"".join(mcp.http.get("/mcp", headers=headers).streaming_content))
    finally:
        timer.join()
    assert resumed[-1]["id"] == 1
    assert resumed[-1]["result"]["content"] == done["content"]
    assert stream_slots.held() == 0


def test_a_keyed_synchronous_call_answers_from_its_task_in_any_session(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    from tasks_app.mcp import limits

    session = Session(mcp)
    params = {"name": "slow_compute", "arguments": {"seconds": 0}}
    settings.TASKDESK_STREAM_SECONDS = 1
    settings.TASKDESK_KEEPALIVE_SECONDS = 5
    waiting = session.call("tools/call", params, **{"Idempotency-Key": "sync-k"})
    assert waiting["Content-Type"] == "text/event-stream"
    assert '"result"' not in b"".join(waiting.streaming_content).decode()  # no worker here
    task = Task.objects.get(idempotency_key="sync-k")
    transitions.complete(
        task_id=task.pk, result={"content": [{"type": "text", "text": "done"}], "isError": False}
    )
    # A retry in a new session is answered at once from the same task, marked as a replay.
    again = ok(Session(mcp).call("tools/call", params, **{"Idempotency-Key": "sync-k"}))
    assert again["content"] == [{"type": "text", "text": "done"}]
    assert again["_meta"]["dev.taskdesk/taskId"] == task.pk
    assert again["_meta"][REPLAYED_META] is True
    assert again["_meta"][RELATED_TASK] == {"taskId": task.pk}
    assert Task.objects.count() == 1
    # No synchronous slot free: refused at once, and nothing is written.
    settings.TASKDESK_SYNC_CONCURRENCY = 1
    release = limits.sync_slots.take()
    try:
        busy = session.call("tools/call", params, **{"Idempotency-Key": "sync-busy"})
    finally:
        release()
    assert busy.status_code == 429 and json_of(busy)["error"]["data"]["reason"] == "busy"
    assert not Task.objects.filter(idempotency_key="sync-busy").exists()
    assert limits.sync_slots.used == 0


def test_a_result_is_one_event_when_the_client_lists_event_streams_first(mcp) -> None:  # type: ignore[no-untyped-def]
    session = Session(mcp)
    listed = session.call("tools/list", {}, Accept="text/event-stream, application/json")
    assert listed["Content-Type"] == "text/event-stream"
    (message,) = events_of(listed.content)
    assert any(tool["name"] == "test_reconnection" for tool in message["result"]["tools"])
    plain = session.call("tools/list", {})  # application/json first: plain JSON
    assert plain["Content-Type"] == "application/json"
    assert json.loads(plain.content)["result"] == message["result"]


def test_the_get_stream_ends_when_its_session_is_deleted(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    import time

    settings.TASKDESK_STREAM_SECONDS = 30
    session = Session(mcp)
    headers = session.stream_headers()
    stream = iter(mcp.http.get("/mcp", headers=headers).streaming_content)
    assert next(stream) == b": stream open\n\n"
    assert stream_slots.held() == 1
    deleted = mcp.http.delete("/mcp", headers=headers)
    assert deleted.status_code == 204
    started = time.monotonic()
    rest = b"".join(stream)
    assert time.monotonic() - started < 3 and b"data:" not in rest
    assert stream_slots.held() == 0


# --- notifications/cancelled -------------------------------------------------------------------


def test_a_cancelled_tasks_result_stops_waiting_and_leaves_the_task(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    import time

    settings.TASKDESK_KEEPALIVE_SECONDS = 0.1
    session = Session(mcp)
    task_id = create(session)["taskId"]
    body = rpc("tasks/result", {"taskId": task_id})
    body["id"] = "wait-1"
    waiting = session.post(body)
    assert waiting["Content-Type"] == "text/event-stream"
    note = {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": "wait-1", "reason": "the user moved on"},
    }
    assert session.post(note).status_code == 202
    started = time.monotonic()
    raw = b"".join(waiting.streaming_content).decode()
    assert time.monotonic() - started < 3
    assert '"result"' not in raw and '"error"' not in raw  # a cancelled request is not answered
    assert Task.objects.get(pk=task_id).status == Status.WORKING  # the task goes on
    assert stream_slots.held() == 0
    # Malformed or unknown cancellations are accepted and ignored.
    for params in ({"requestId": True}, {}, None, {"requestId": "never-sent"}):
        assert session.post({**note, "params": params}).status_code == 202


def test_a_cancelled_synchronous_run_stops_at_its_next_checkpoint(mcp) -> None:  # type: ignore[no-untyped-def]
    import threading
    import time

    from tasks_app import sessions

    session = Session(mcp)
    body = rpc("tools/call", {"name": "slow_compute", "arguments": {"seconds": 30}})
    body["id"] = 41
    cancel = threading.Timer(
        0.3, lambda: sessions.cancel_request(session_id=session.id, request_id=41)
    )
    started = time.monotonic()
    cancel.start()
    try:
        response = session.post(body)
    finally:
        cancel.join()
    assert time.monotonic() - started < 5
    assert json_of(response)["error"]["data"]["reason"] == "cancelled"
    assert not Task.objects.exists()  # it ran in the request, as a synchronous call does
