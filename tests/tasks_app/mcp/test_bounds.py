"""What one client's requests can make the server hold: answers per ``tasks/update``,
sessions and replies of the 2025-11-25 wire, and the sizes kept per session."""

from __future__ import annotations

import json
import secrets
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from elicitations.models import InputRequest, RequestStatus
from tasks_app.models import McpReply, McpSession, Task, TaskEvent
from tasks_app.testing import leg, submit
from tests.tasks_app.mcp.conftest import Session
from tests.tasks_app.mcp.test_tasks import ask
from tests.wire import (
    SESSION_HEADER,
    error_of,
    handshake_headers,
    initialize,
    request,
    result_of,
    rpc,
)

pytestmark = pytest.mark.django_db(transaction=True)

YES = {"action": "accept", "content": {"confirm": True}}


def create(mcp) -> str:  # type: ignore[no-untyped-def]
    """A task of a client that answers questions (elicitation), so one can be asked of it."""
    body = request(
        "tools/call",
        {"name": "slow_compute", "arguments": {"seconds": 30}},
        tasks=True,
        elicitation={},
    )
    task_id: str = result_of(mcp.post(body))["taskId"]
    return task_id


def test_tasks_update_with_60000_keys_is_refused_at_once_naming_the_limit(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    # Every request looks its token up: a remembered token that ages out between the two
    # requests compared below would add a query to one of them.
    settings.TASKDESK_TOKEN_CACHE_SECONDS = 0
    task_id = create(mcp)
    question = ask(task_id, "confirm")

    def update(count: int) -> tuple[dict, int]:
        """Send COUNT answers, the first of them not even an object; return the error and how
        many queries the request made."""
        responses: dict = {f"k{i:05d}": {} for i in range(count)}
        responses["k00000"] = "not an object"
        responses[question.key] = YES
        body = request("tasks/update", {"taskId": task_id, "inputResponses": responses}, tasks=True)
        raw = json.dumps(body).encode()
        with CaptureQueriesContext(connection) as queries:
            response = mcp.post(raw=raw, body=body)
        assert response.status_code == 400
        return error_of(response), len(queries.captured_queries)

    error, queries = update(60_000)
    assert error["code"] == -32602
    assert "TASKDESK_MAX_INPUT_RESPONSES" in error["message"]
    assert "100" in error["message"] and "60001" in error["message"]
    # At once: before any answer is looked at (the malformed one is not what is named), and
    # with no more queries than a request just over the limit makes (none per key).
    assert "not an object" not in json.dumps(error) and "k00000" not in json.dumps(error)
    _, just_over = update(101)
    assert queries == just_over
    # Nothing was answered.
    assert InputRequest.objects.get(pk=question.pk).status == RequestStatus.PENDING


def test_tasks_update_at_the_limit_answers_in_one_transaction(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_MAX_INPUT_RESPONSES = 5
    task_id = create(mcp)
    first, second = ask(task_id, "first"), ask(task_id, "second")
    responses = {first.key: YES, second.key: YES, "nope-1": YES, "nope-2": YES, "nope-3": YES}
    with CaptureQueriesContext(connection) as queries:
        ack = mcp.call("tasks/update", {"taskId": task_id, "inputResponses": responses}, tasks=True)
    assert result_of(ack) == {"resultType": "complete"}
    assert set(InputRequest.objects.filter(task_id=task_id).values_list("status", flat=True)) == {
        RequestStatus.ANSWERED
    }
    assert TaskEvent.objects.filter(task_id=task_id, kind="input_answered").count() == 2
    # The keys the task never asked cost one query together, not a locked lookup each.
    if connection.features.has_select_for_update:
        locked = [
            q["sql"]
            for q in queries.captured_queries
            if "FOR UPDATE" in q["sql"]
            and q["sql"].startswith('SELECT "elicitations_inputrequest"')
        ]
        assert len(locked) == 2, locked  # one per question asked; none for the others
    responses["nope-4"] = YES
    refused = mcp.call("tasks/update", {"taskId": task_id, "inputResponses": responses}, tasks=True)
    assert error_of(refused)["code"] == -32602


# --- sessions and replies of the 2025-11-25 wire -------------------------------------------


def _initialize(mcp, **params: object) -> object:  # type: ignore[no-untyped-def]
    body = initialize()
    body["params"].update(params)
    return mcp.post(body, headers=handshake_headers(None, None))


def test_a_client_at_its_session_cap_loses_its_least_recently_used_session(  # type: ignore[no-untyped-def]
    mcp, bob_mcp, settings
) -> None:
    settings.TASKDESK_MAX_SESSIONS_PER_CLIENT = 3
    first, second, third = Session(mcp), Session(mcp), Session(mcp)
    bobs = Session(bob_mcp)
    # The first is used again, so the second is now the least recently used.
    McpSession.objects.filter(pk=second.id).update(
        last_seen_at=timezone.now() - timedelta(minutes=5)
    )
    assert first.call("ping").status_code == 200
    fourth = Session(mcp)
    assert McpSession.objects.filter(client__name="alice").count() == 3
    assert second.call("ping").status_code == 404  # gone: the client initializes again
    for kept in (first, third, fourth):
        assert kept.call("ping").status_code == 200
    assert bobs.call("ping").status_code == 200  # another client's sessions are not touched


def test_initialize_refuses_capabilities_or_client_info_over_the_size_cap(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_MAX_SESSION_INFO_BYTES = 16 * 1024
    big = {"x": "a" * (16 * 1024)}
    for field in ("capabilities", "clientInfo"):
        response = _initialize(mcp, **{field: big})
        assert response.status_code == 400
        error = error_of(response)
        assert error["code"] == -32602
        assert f"params.{field}" in error["message"]
        assert "TASKDESK_MAX_SESSION_INFO_BYTES" in error["message"]
        assert error["data"]["limit"] == 16 * 1024
    assert not McpSession.objects.exists()
    fits = {"x": "a" * (16 * 1024 - 100)}
    assert _initialize(mcp, capabilities=fits).status_code == 200


def test_initialize_keeps_client_info_without_its_icons(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    # An icon may be a data: URI of any size (2025-11-25 Implementation.icons): not kept, so
    # a client with a large one still connects.
    settings.TASKDESK_MAX_SESSION_INFO_BYTES = 16 * 1024
    icon = {"src": "data:image/png;base64," + "A" * (64 * 1024), "mimeType": "image/png"}
    info = {"name": "desk-client", "version": "1.0", "icons": [icon]}
    response = _initialize(mcp, clientInfo=info)
    assert response.status_code == 200, response.content
    session = McpSession.objects.get(pk=response[SESSION_HEADER])
    assert session.client_info == {"name": "desk-client", "version": "1.0"}


def _stored_bytes() -> int:
    tables = [McpSession._meta.db_table, McpReply._meta.db_table]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sum(pg_total_relation_size(t::regclass)) FROM unnest(%s::text[]) t", [tables]
        )
        return int(cursor.fetchone()[0])


def test_one_client_cannot_grow_the_session_store(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    """300 initializes and 50 unsolicited 900 KB replies from one client: its sessions stay
    at the cap and the session and reply tables grow by less than 5 MB (on PostgreSQL)."""
    settings.TASKDESK_MAX_SESSIONS_PER_CLIENT = 100
    postgres = connection.vendor == "postgresql"
    before = _stored_bytes() if postgres else 0
    # 10 KB that does not compress (under the 16 KiB cap), so the table sizes are honest.
    capabilities = {"elicitation": {}, "padding": secrets.token_urlsafe(7_500)}
    ids = []
    for _ in range(300):
        response = _initialize(mcp, capabilities=capabilities)
        assert response.status_code == 200
        ids.append(response[SESSION_HEADER])
    assert McpSession.objects.filter(client__name="alice").count() == 100
    session = McpSession.objects.get(pk=ids[-1])
    headers = handshake_headers(session.pk, session.protocol_version)
    padding = "r" * (900 * 1024)
    for i in range(50):
        reply = {"jsonrpc": "2.0", "id": f"made-up-{i}", "result": {"padding": padding}}
        assert mcp.post(reply, headers=headers).status_code == 202
    assert not McpReply.objects.exists()
    if postgres:
        grown = _stored_bytes() - before
        print(f"session and reply tables grew by {grown} bytes")
        assert grown < 5 * 1024 * 1024, f"the session tables grew by {grown} bytes"


def test_a_synchronous_call_keeps_only_the_reply_it_waits_for(mcp) -> None:  # type: ignore[no-untyped-def]
    session = Session(mcp, capabilities={"elicitation": {"form": {}}})
    body = rpc(
        "tools/call", {"name": "test_input_required_result_elicitation", "arguments": {}}, id=7
    )
    response = session.post(body)
    assert response["Content-Type"] == "text/event-stream"
    seen: list[dict] = []
    for chunk in response.streaming_content:
        for line in chunk.decode().splitlines():
            if not line.startswith("data:") or not line[5:].strip():
                continue
            message = json.loads(line[5:])
            seen.append(message)
            if message.get("method") == "elicitation/create":
                # While the call waits, its id is awaited; a made-up one is dropped.
                assert McpReply.objects.filter(request_id=message["id"]).exists()
                stray = {"jsonrpc": "2.0", "id": "taskdesk-s:other:x", "result": {}}
                assert session.post(stray).status_code == 202
                answer = {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "result": {"action": "accept", "content": {"name": "Alice"}},
                }
                assert session.post(answer).status_code == 202
    assert seen[-1]["id"] == 7 and "result" in seen[-1], seen[-1]
    assert "Alice" in json.dumps(seen[-1]["result"])
    # Nothing is left behind: the answer was read, the stray never kept.
    assert not McpReply.objects.exists()


@pytest.mark.parametrize("meta", [{}, {"progressToken": "p"}], ids=["plain", "streamed"])
def test_an_answer_that_never_fits_ends_the_call_naming_it(mcp, monkeypatch, meta) -> None:  # type: ignore[no-untyped-def]
    from tasks_app.mcp import handshake, limits

    monkeypatch.setattr(handshake, "MAX_ROUNDS", 3)
    session = Session(mcp, capabilities={"elicitation": {"form": {}}})
    params = {"name": "test_input_required_result_elicitation", "arguments": {}, "_meta": meta}
    body = rpc("tools/call", params, id=7)
    response = session.post(body)
    seen: list[dict] = []
    for chunk in response.streaming_content:
        for line in chunk.decode().splitlines():
            if not line.startswith("data:") or not line[5:].strip():
                continue
            message = json.loads(line[5:])
            seen.append(message)
            if message.get("method") == "elicitation/create":
                # A name must be a string: the question is asked again, each time.
                answer = {
                    "jsonrpc": "2.0",
                    "id": message["id"],
                    "result": {"action": "accept", "content": {"name": 5}},
                }
                assert session.post(answer).status_code == 202
    assert len([m for m in seen if m.get("method") == "elicitation/create"]) == 3
    error = seen[-1]["error"]
    assert error["code"] == -32602
    assert "user_name" in error["message"]
    assert error["data"] == {"inputRequests": ["user_name"], "rounds": 3}
    assert limits.sync_slots.used == 0


# --- what one task keeps ------------------------------------------------------------------


def test_arguments_over_the_limit_are_refused_naming_it(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_MAX_ARGUMENT_BYTES = 2048
    big = {"text": "a" * 3000, "seconds": 0}
    response = mcp.call("tools/call", {"name": "slow_echo", "arguments": big}, tasks=True)
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == -32602
    assert "TASKDESK_MAX_ARGUMENT_BYTES" in error["message"] and "2048" in error["message"]
    assert error["data"]["reason"] == "arguments_too_large"
    assert not Task.objects.exists()
    fits = {"text": "a" * 1000, "seconds": 0}
    created = result_of(
        mcp.call("tools/call", {"name": "slow_echo", "arguments": fits}, tasks=True)
    )
    assert created["status"] == "working"


def test_a_result_over_the_limit_fails_the_task_naming_it(alice, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_MAX_RESULT_BYTES = 2048
    too_big = submit(alice, "slow_echo", text="r" * 3000, seconds=0)
    fits = submit(alice, "slow_echo", text="r" * 1000, seconds=0)
    leg(too_big)
    leg(fits)
    assert too_big.status == "failed" and too_big.result is None
    assert too_big.error["data"]["reason"] == "result_too_large"
    assert too_big.error["data"]["limit"] == 2048
    assert "TASKDESK_MAX_RESULT_BYTES" in too_big.error["message"]
    assert fits.status == "completed"


@pytest.mark.postgres
def test_racing_initializes_of_one_client_stay_at_the_cap(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_MAX_SESSIONS_PER_CLIENT = 5

    def opener() -> list[int]:
        try:
            return [_initialize(mcp).status_code for _ in range(10)]
        finally:
            connection.close()

    with ThreadPoolExecutor(4) as pool:
        statuses = [s for codes in pool.map(lambda _: opener(), range(4)) for s in codes]
    assert statuses == [200] * 40
    assert McpSession.objects.filter(client__name="alice").count() == 5
