"""Bounded web work: the synchronous slots of a process and the time cap of a synchronous run.

(The same under real load, with real disconnects, against live gunicorn processes:
tests/integration/test_web_limits.py.)"""

from __future__ import annotations

import json
import time

import pytest

from tasks_app.mcp import client_slots, limits
from tasks_app.models import Task
from tests.runtime_toolset import RUNTIME_TOOLSETS
from tests.tasks_app.mcp.conftest import Session
from tests.wire import error_of, request, result_of, rpc, sse_messages

pytestmark = pytest.mark.django_db


def echo(mcp, *, seconds: float = 0, key: str | None = None, **env):  # type: ignore[no-untyped-def]
    headers = {"Idempotency-Key": key} if key else None
    body = request(
        "tools/call", {"name": "slow_echo", "arguments": {"text": "hi", "seconds": seconds}}, **env
    )
    return mcp.post(body, headers=headers)


def assert_busy(response) -> None:  # type: ignore[no-untyped-def]
    assert response.status_code == 429, response.content
    assert response["Retry-After"] == "1"
    error = error_of(response)
    assert error["code"] == -32000
    assert error["data"]["reason"] == "busy"
    assert "TASKDESK_SYNC_CONCURRENCY" in error["message"]


@pytest.fixture
def one_slot(settings):  # type: ignore[no-untyped-def]
    settings.TASKDESK_SYNC_CONCURRENCY = 1
    yield
    assert limits.sync_slots.used == 0


def test_a_synchronous_call_with_no_free_slot_is_refused_at_once(mcp, one_slot) -> None:  # type: ignore[no-untyped-def]
    release = limits.sync_slots.take()
    try:
        assert_busy(echo(mcp))
        # A receipt needs no slot: with the extension the call becomes a task.
        assert result_of(echo(mcp, tasks=True))["resultType"] == "task"
    finally:
        release()

    assert result_of(echo(mcp))["content"][0]["text"] == "hi"


def test_a_keyed_call_that_would_wait_is_refused_before_anything_is_written(mcp, one_slot) -> None:  # type: ignore[no-untyped-def]
    release = limits.sync_slots.take()
    try:
        assert_busy(echo(mcp, key="wait-1"))
    finally:
        release()

    assert not Task.objects.exists()


def test_a_streamed_call_holds_its_slot_until_its_thread_ends(mcp, one_slot, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_TOOLSETS = RUNTIME_TOOLSETS
    body = request("tools/call", {"name": "test_tool_with_progress", "arguments": {}})
    body["params"]["_meta"]["progressToken"] = "p1"

    response = mcp.post(body)

    messages = sse_messages(response) if response.streaming else [json.loads(response.content)]
    assert "result" in messages[-1], messages
    assert limits.sync_slots.used == 0


def test_a_streamed_call_on_the_handshake_wire_gives_its_slot_back(mcp, one_slot, settings) -> None:  # type: ignore[no-untyped-def]
    # The 2025 wire runs the call's rounds itself: each round's slot is given back when the
    # round ends, so one slot serves one streamed call after another.
    settings.TASKDESK_TOOLSETS = RUNTIME_TOOLSETS
    session = Session(mcp)
    for token in ("p1", "p2", "p3"):
        params = {
            "name": "test_tool_with_progress",
            "arguments": {},
            "_meta": {"progressToken": token},
        }
        response = session.post(rpc("tools/call", params))
        messages = sse_messages(response) if response.streaming else [json.loads(response.content)]
        assert "result" in messages[-1], messages
        assert limits.sync_slots.used == 0


def test_a_synchronous_run_past_the_time_cap_is_stopped_with_a_clear_error(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_SYNC_MAX_SECONDS = 0.3
    started = time.monotonic()

    response = echo(mcp, seconds=60)

    assert time.monotonic() - started < 30  # stopped, not run to its end
    assert response.status_code == 200
    error = error_of(response)
    assert error["code"] == -32000
    assert error["data"] == {"reason": "sync_time_limit", "limitSeconds": 0.3}
    assert "with the tasks extension declared, or with an idempotency key" in error["message"]
    assert limits.sync_slots.used == 0


def test_on_the_handshake_wire_the_time_cap_error_names_params_task(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    # A 2025-11-25 session asks for a task with params.task, not the 2026 extension.
    settings.TASKDESK_SYNC_MAX_SECONDS = 0.3
    session = Session(mcp)
    params = {"name": "slow_echo", "arguments": {"text": "hi", "seconds": 60}}

    response = session.post(rpc("tools/call", params))

    error = error_of(response)
    assert error["data"] == {"reason": "sync_time_limit", "limitSeconds": 0.3}
    assert "call it again with params.task, or with an idempotency key," in error["message"]
    assert "extension" not in error["message"]
    assert limits.sync_slots.used == 0


def test_an_escalating_tool_past_the_time_cap_becomes_a_task(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_TOOLSETS = RUNTIME_TOOLSETS
    settings.TASKDESK_SYNC_MAX_SECONDS = 0.3
    body = request("tools/call", {"name": "slow_then_escalate", "arguments": {}}, tasks=True)

    created = result_of(mcp.post(body))

    assert created["resultType"] == "task"
    assert Task.objects.get(pk=created["taskId"]).tool_name == "slow_then_escalate"


def test_without_the_extension_the_same_tool_gets_the_error(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_TOOLSETS = RUNTIME_TOOLSETS
    settings.TASKDESK_SYNC_MAX_SECONDS = 0.3
    body = request("tools/call", {"name": "slow_then_escalate", "arguments": {}})

    error = error_of(mcp.post(body))

    assert error["data"]["reason"] == "sync_time_limit"
    # A key would not make it a task either: an escalating tool runs here, keyed or not.
    assert "idempotency key" not in error["message"]
    assert not Task.objects.exists()


def test_slots_are_counted_per_process_and_given_back_once(settings) -> None:
    settings.TASKDESK_SYNC_CONCURRENCY = 2
    first, second = limits.sync_slots.take(), limits.sync_slots.take()
    with pytest.raises(limits.RetryLater):
        limits.sync_slots.take()

    first()
    first()  # a second call gives nothing back twice

    assert limits.sync_slots.used == 1
    third = limits.sync_slots.take()
    second()
    third()
    assert limits.sync_slots.used == 0


def test_all_held_work_together_leaves_the_reserved_threads(settings) -> None:
    # Four threads, two reserved: two held requests at most, whatever their kinds.
    settings.TASKDESK_HELD_PER_PROCESS = 2
    settings.TASKDESK_SYNC_CONCURRENCY = 2
    settings.TASKDESK_MAX_STREAMS = 2
    run = limits.sync_slots.take()
    stream = limits.stream_slots.take()
    with pytest.raises(limits.RetryLater) as refused:
        limits.sync_slots.take()
    assert refused.value.http_status == 429 and refused.value.data["reason"] == "busy"
    assert "TASKDESK_RESERVED_THREADS" in str(refused.value)
    with pytest.raises(limits.RetryLater):
        limits.stream_slots.take()
    # A refusal gives back what it took on the way.
    assert (limits.sync_slots.used, limits.stream_slots.used, limits.held_slots.used) == (1, 1, 2)
    run()
    stream()
    assert limits.held_slots.used == 0


def test_held_work_is_bounded_per_client_across_processes(settings) -> None:
    settings.TASKDESK_SYNC_CONCURRENCY = 10
    settings.TASKDESK_HELD_PER_PROCESS = 10
    settings.TASKDESK_SYNC_PER_CLIENT = 2
    first, second = limits.sync_slots.take(client=1), limits.sync_slots.take(client=1)
    with pytest.raises(limits.RetryLater) as refused:
        limits.sync_slots.take(client=1)
    assert "TASKDESK_SYNC_PER_CLIENT" in str(refused.value)
    assert refused.value.data["reason"] == "busy" and refused.value.data["limit"] == 2
    other = limits.sync_slots.take(client=2)  # another client has slots of its own
    # The count is in the shared cache, not in this process: another process sees it.
    assert client_slots.taken("sync", 1, 2) == 2
    first()
    assert client_slots.taken("sync", 1, 2) == 1
    again = limits.sync_slots.take(client=1)
    for release in (second, other, again):
        release()
    assert client_slots.taken("sync", 1, 2) == 0
    assert limits.sync_slots.used == 0 and limits.held_slots.used == 0


def test_the_slots_of_a_killed_process_come_back_when_their_leases_run_out(
    settings, monkeypatch
) -> None:
    # (The database cache keeps expiry times in whole seconds, hence the margins.)
    monkeypatch.setattr(client_slots, "LEASE_SECONDS", 3)
    lease = client_slots.take("stream", 7, 1)
    assert lease is not None
    assert client_slots.take("stream", 7, 1) is None
    time.sleep(2)
    client_slots.renew()  # a live process renews its leases...
    time.sleep(1.5)
    assert client_slots.take("stream", 7, 1) is None  # ...so they outlast LEASE_SECONDS
    # A killed process renews nothing (nor gives back): its slot is free once it runs out.
    client_slots._leases.clear()
    time.sleep(4.2)
    taker = client_slots.take("stream", 7, 1)
    assert taker is not None
    lease.close()  # the old holder's late give-back does not free the new holder's slot
    assert client_slots.take("stream", 7, 1) is None
    taker.close()
    assert client_slots.taken("stream", 7, 1) == 0


def test_a_call_that_asks_the_client_holds_its_slot_while_it_waits(
    transactional_db, mcp, one_slot
) -> None:  # type: ignore[no-untyped-def]
    # On the 2025 wire the call waits for the client's answer inside its request: held work
    # as much as the run itself, so it keeps its synchronous slot meanwhile.
    session = Session(mcp)
    params = {"name": "test_elicitation", "arguments": {"message": "Who are you?"}}
    response = session.call("tools/call", params)
    assert response.streaming, response.content
    chunks = iter(response.streaming_content)
    seen = b""
    while b"elicitation/create" not in seen:
        seen += next(chunks, b"") or pytest.fail(seen.decode())
    asked = json.loads(seen.split(b"data: ", 1)[1].split(b"\n", 1)[0])
    assert asked["method"] == "elicitation/create"

    assert limits.sync_slots.used == 1
    assert_busy(echo(mcp))
    content = {"username": "ada", "email": "ada@example.com"}
    reply = {
        "jsonrpc": "2.0",
        "id": asked["id"],
        "result": {"action": "accept", "content": content},
    }
    assert session.post(reply).status_code == 202
    rest = b"".join(chunks)

    assert b"ada@example.com" in rest
    assert limits.sync_slots.used == 0


def test_a_client_slot_is_found_without_trying_the_slots_this_process_holds(
    settings, monkeypatch
) -> None:
    held = [client_slots.take("sync", 9, 4) for _ in range(3)]
    tried: list[str] = []
    shared = client_slots.cache

    class Counting:
        def add(self, key, *args, **kwargs):  # type: ignore[no-untyped-def]
            tried.append(key)
            return shared.add(key, *args, **kwargs)

        def __getattr__(self, name):  # type: ignore[no-untyped-def]
            return getattr(shared, name)

    monkeypatch.setattr(client_slots, "cache", Counting())
    fourth = client_slots.take("sync", 9, 4)
    assert fourth is not None and fourth.key == "held:sync:9:3"
    assert tried == ["held:sync:9:3"]
    assert client_slots.take("sync", 9, 4) is None  # all four are taken
    for lease in [*held, fourth]:
        assert lease is not None
        lease.close()
    assert client_slots.taken("sync", 9, 4) == 0


def test_a_lease_that_ran_out_given_back_late_leaves_the_new_holder_renewed() -> None:
    first = client_slots.take("stream", 8, 1)
    assert first is not None and first.key is not None
    client_slots.cache.delete(first.key)  # it ran out (its renewals failed meanwhile)
    second = client_slots.take("stream", 8, 1)
    assert second is not None and second.key == first.key
    first.close()
    # The new holder's lease is still this process's to renew, and still in the cache.
    assert client_slots._leases.get(second.key) == second.token
    assert client_slots.cache.get(second.key) == second.token
    second.close()
    assert second.key not in client_slots._leases
    assert client_slots.taken("stream", 8, 1) == 0
