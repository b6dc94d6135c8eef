"""The 2025-11-25 handshake wire over raw HTTP, against a live multi-process server and real
workers: initialize, a task-augmented export, tasks/get, blocking tasks/result, tasks/list,
tasks/cancel on the finished task, a keyed retry from a new session, an unknown session.

Runs on the database of the run: CI runs it on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import httpx
import pytest

from tasks_app.models import Task
from tests.wire import (
    HANDSHAKE_VERSION,
    RELATED_TASK,
    REPLAYED_META,
    SESSION_HEADER,
    HandshakeSession,
    rpc,
)

pytestmark = pytest.mark.live

EXPORT = {"quarter": "Q2", "format": "json", "rows": 200}


def test_a_task_from_initialize_to_cancel(live, alice_token, bob_token) -> None:  # type: ignore[no-untyped-def]
    alice = HandshakeSession(live.mcp_url, alice_token)
    assert alice.connect()["protocolVersion"] == HANDSHAKE_VERSION
    # Bob has a task of his own, which alice must never see.
    bob = HandshakeSession(live.mcp_url, bob_token)
    bob.connect()
    params = {"name": "export_report", "arguments": EXPORT, "task": {"ttl": 60000}}
    bobs = bob.call("tools/call", params, **{"Idempotency-Key": "bob-q2"})["result"]["task"]

    created = alice.call("tools/call", params, **{"Idempotency-Key": "alice-q2"})["result"]
    task_id = created["task"]["taskId"]
    assert created["task"]["status"] == "working" and created["_meta"][REPLAYED_META] is False

    got = alice.call("tasks/get", {"taskId": task_id})["result"]
    assert got["taskId"] == task_id and got["status"] in ("working", "completed")
    assert "content" not in got
    # A JSON answer goes out with its length, not in chunks (the server's own framing).
    answer = alice.post(rpc("tasks/get", {"taskId": task_id}))
    assert answer.headers["Content-Length"] == str(len(answer.content))
    assert "Transfer-Encoding" not in answer.headers

    # Blocking: answers once the worker has finished, with exactly the tool's result.
    result = alice.call("tasks/result", {"taskId": task_id})["result"]
    assert result["structuredContent"]["rows"] == 200
    assert result["_meta"][RELATED_TASK] == {"taskId": task_id}
    assert alice.call("tasks/get", {"taskId": task_id})["result"]["status"] == "completed"

    listed = [t["taskId"] for t in alice.call("tasks/list")["result"]["tasks"]]
    assert listed == [task_id] and bobs["taskId"] not in listed

    refused = alice.call("tasks/cancel", {"taskId": task_id})["error"]
    assert refused["code"] == -32602 and "completed" in refused["message"]

    # A retry with the key in a new session is the same task (the key is the client's).
    alice.connect()
    again = alice.call("tools/call", params, **{"Idempotency-Key": "alice-q2"})["result"]
    assert again["task"]["taskId"] == task_id and again["_meta"][REPLAYED_META] is True
    assert Task.objects.filter(client__name="alice").count() == 1

    # An unknown session is 404; the client initializes again.
    alice.session = "not-a-session"
    assert alice.post(rpc("ping")).status_code == 404


@pytest.mark.postgres
def test_held_get_streams_hold_no_database_connection(transactional_db, alice_token) -> None:  # type: ignore[no-untyped-def]
    import threading
    import time

    from django.db import connection

    from tests.live import live_stack

    def connections() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
            return int(cursor.fetchone()[0])

    streams = 8
    env = {
        "WEB_THREADS": "16",
        "TASKDESK_MAX_STREAMS": "12",
        "TASKDESK_MAX_STREAMS_PER_CLIENT": "12",
        "DB_CONN_MAX_AGE": "600",
    }
    with live_stack(env=env, worker=False, beat=False) as stack:
        wires = []
        for _ in range(streams):
            wire = HandshakeSession(stack.mcp_url, alice_token)
            wire.connect()
            wires.append(wire)
        before = connections()
        opened, stop = threading.Semaphore(0), threading.Event()

        def hold(wire: HandshakeSession) -> None:
            headers = {
                "Authorization": f"Bearer {wire.token}",
                "Accept": "text/event-stream",
                SESSION_HEADER: str(wire.session),
                "MCP-Protocol-Version": HANDSHAKE_VERSION,
            }
            try:
                with httpx.stream("GET", stack.mcp_url, headers=headers, timeout=30) as response:
                    assert response.status_code == 200
                    opened.release()
                    for _ in response.iter_lines():
                        if stop.is_set():
                            return
            except httpx.HTTPError:
                assert stop.is_set()  # the stack stopped under the stream

        holders = [threading.Thread(target=hold, args=(w,), daemon=True) for w in wires]
        for holder in holders:
            holder.start()
        for _ in holders:
            assert opened.acquire(timeout=30)
        time.sleep(2.5)  # every stream past its session lookup, the watchers ticking
        during = connections()
        stop.set()
    # Each stream's request thread looked its session up and then gave its connection back;
    # what is left is one watcher per web process (and the idle connections of before).
    assert during - before <= 2, (before, during)
