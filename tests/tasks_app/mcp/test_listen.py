"""``subscriptions/listen`` with ``notifications/tasks`` (2026-07-28, tasks extension), through
Django's test client: the stream is read event by event while the test moves tasks along
with the transitions the runtime and the inbox use. The live test (test_listen_live.py) runs
the same flow against a real server and worker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from elicitations import transitions as elicitation_transitions
from elicitations.models import Channel
from tasks_app import transitions
from tasks_app.mcp import session_streams
from tasks_app.models import Task
from tests.tasks_app.mcp.test_tasks import ask
from tests.wire import envelope, error_of, request, result_of

pytestmark = pytest.mark.django_db(transaction=True)

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"


@pytest.fixture(autouse=True)
def short_streams(settings):  # type: ignore[no-untyped-def]
    settings.TASKDESK_STREAM_SECONDS = 3
    settings.TASKDESK_KEEPALIVE_SECONDS = 0.5
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"mcp_poll": "1000/second"},
    }


class Stream:
    """A listen response, read one message at a time (keep-alive comments skipped)."""

    def __init__(self, response: Any) -> None:
        assert response.status_code == 200, response.content
        assert response["Content-Type"] == "text/event-stream"
        self.response = response
        self.chunks: Iterator[bytes] = iter(response.streaming_content)

    def next(self) -> dict[str, Any]:
        for chunk in self.chunks:
            for line in chunk.decode().splitlines():
                if line.startswith("data:"):
                    return dict(json.loads(line[5:]))
        raise AssertionError("the stream ended")

    def rest(self) -> list[dict[str, Any]]:
        out = []
        for chunk in self.chunks:
            for line in chunk.decode().splitlines():
                if line.startswith("data:"):
                    out.append(json.loads(line[5:]))
        return out

    def close(self) -> None:
        self.response.close()


def create(mcp) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """A task of a client that can answer questions (it declares form elicitation)."""
    params = {"name": "slow_compute", "arguments": {"seconds": 30}}
    return result_of(mcp.post(request("tools/call", params, tasks=True, elicitation={})))


def listen(mcp, task_ids: list[str] | None, *, id: Any = 7, tasks: bool = True) -> Any:  # type: ignore[no-untyped-def]
    notifications: dict[str, Any] = {} if task_ids is None else {"taskIds": task_ids}
    return mcp.post(
        request("subscriptions/listen", {"notifications": notifications}, id=id, tasks=tasks)
    )


def get(mcp, task_id: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    body = result_of(mcp.call("tasks/get", {"taskId": task_id}, tasks=True))
    body.pop("resultType")
    return body


def task_note(message: dict[str, Any], listen_id: Any = 7) -> dict[str, Any]:
    """The DetailedTask of a notifications/tasks, checked to carry the subscription id."""
    assert message["method"] == "notifications/tasks", message
    params = dict(message["params"])
    assert params.pop("_meta") == {SUBSCRIPTION_ID: listen_id}
    return params


def test_a_listen_stream_acknowledges_the_clients_tasks_and_follows_each_status(
    mcp, bob_mcp, operator
) -> None:  # type: ignore[no-untyped-def]
    mine = [create(mcp)["taskId"] for _ in range(3)]
    theirs = create(bob_mcp)["taskId"]
    stream = Stream(listen(mcp, [mine[0], theirs, mine[1], "no-such-task", mine[2], mine[0]]))

    ack = stream.next()
    assert ack == {
        "jsonrpc": "2.0",
        "method": "notifications/subscriptions/acknowledged",
        "params": {"_meta": {SUBSCRIPTION_ID: 7}, "notifications": {"taskIds": mine}},
    }
    # The current state of every watched task first, each the body tasks/get returns.
    for task_id in mine:
        assert task_note(stream.next()) == get(mcp, task_id)

    watched = mine[1]
    ask(watched, "confirm", audience="any")  # working -> input_required, with its request
    note = task_note(stream.next())
    assert note["taskId"] == watched and note["status"] == "input_required"
    assert note == get(mcp, watched) and len(note["inputRequests"]) == 1

    # Answered in the inbox: the task resumes.
    key = next(iter(note["inputRequests"]))
    outcome = elicitation_transitions.answer(
        task=Task.objects.get(pk=watched),
        key=key,
        response={"action": "accept", "content": {"confirm": True}},
        channel=Channel.INBOX,
        user=operator,
    )
    assert outcome.recorded and outcome.resumed, outcome
    note = task_note(stream.next())
    assert note["status"] == "working" and note == get(mcp, watched)

    transitions.complete(
        task_id=watched, result={"content": [{"type": "text", "text": "done"}], "isError": False}
    )
    note = task_note(stream.next())
    assert note["status"] == "completed" and note == get(mcp, watched)
    assert note["result"]["content"][0]["text"] == "done"

    # Another client's task changing sends nothing; the stream ends with the listen result.
    transitions.complete(task_id=theirs, result={"content": [], "isError": False})
    assert stream.rest() == [
        {
            "jsonrpc": "2.0",
            "id": 7,
            "result": {"_meta": {SUBSCRIPTION_ID: 7}, "resultType": "complete"},
        }
    ]


def test_a_second_request_of_the_same_task_sends_a_new_set_of_input_requests(mcp) -> None:  # type: ignore[no-untyped-def]
    task_id = create(mcp)["taskId"]
    stream = Stream(listen(mcp, [task_id], id="s-1"))
    stream.next()
    assert task_note(stream.next(), "s-1")["status"] == "working"
    ask(task_id, "first")
    assert len(task_note(stream.next(), "s-1")["inputRequests"]) == 1
    ask(task_id, "second")  # the status stays input_required; the set of requests grows
    note = task_note(stream.next(), "s-1")
    assert len(note["inputRequests"]) == 2 and note == get(mcp, task_id)
    stream.close()


def test_a_reconnecting_client_gets_the_current_state_first(mcp) -> None:  # type: ignore[no-untyped-def]
    task_id = create(mcp)["taskId"]
    first = Stream(listen(mcp, [task_id], id=1))
    first.next()
    first.next()
    first.close()
    # Completed while no stream was open.
    transitions.complete(task_id=task_id, result={"content": [], "isError": False})
    again = Stream(listen(mcp, [task_id], id=2))
    assert again.next()["params"]["notifications"] == {"taskIds": [task_id]}
    note = task_note(again.next(), 2)
    assert note["status"] == "completed" and note == get(mcp, task_id)
    again.close()


def test_only_task_notifications_and_nothing_else_go_on_the_stream(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_STREAM_SECONDS = 1.5
    task_id = create(mcp)["taskId"]
    body = request(
        "subscriptions/listen",
        {
            "notifications": {
                "taskIds": [task_id],
                "toolsListChanged": True,
                "resourcesListChanged": True,
                "resourceSubscriptions": ["taskdesk://nothing"],
            },
            "_meta": {
                **envelope(tasks=True),
                "progressToken": "p",
                "io.modelcontextprotocol/logLevel": "debug",
            },
        },
    )
    stream = Stream(mcp.post(body))
    # Only taskIds is acknowledged: the lists change only on redeploy.
    assert stream.next()["params"]["notifications"] == {"taskIds": [task_id]}
    transitions.set_status_message(task_id=task_id, message="half way")  # no status change
    messages = stream.rest()
    assert [m.get("method") for m in messages] == ["notifications/tasks", None]
    assert "result" in messages[-1]


def test_without_the_tasks_extension_task_notifications_are_refused(mcp) -> None:  # type: ignore[no-untyped-def]
    task_id = create(mcp)["taskId"]
    response = listen(mcp, [task_id], tasks=False)
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == -32021
    assert error["data"] == {
        "requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}
    }


def test_a_listen_without_task_ids_needs_no_extension(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_STREAM_SECONDS = 1
    stream = Stream(listen(mcp, None, tasks=False))
    assert stream.next()["params"] == {"_meta": {SUBSCRIPTION_ID: 7}, "notifications": {}}
    assert stream.rest()[-1]["id"] == 7


def test_too_many_task_ids_are_refused(mcp) -> None:  # type: ignore[no-untyped-def]
    response = listen(mcp, [f"t{i}" for i in range(101)])
    assert error_of(response)["code"] == -32602


def test_streams_hold_a_slot_each_up_to_the_clients_cap(mcp, bob_mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_MAX_STREAMS_PER_CLIENT = 1
    task_id = create(mcp)["taskId"]
    held = Stream(listen(mcp, [task_id], id=1))
    busy = listen(mcp, [task_id], id=2)
    assert busy.status_code == 429 and busy["Retry-After"]
    # Another client's cap is its own.
    other = Stream(listen(bob_mcp, [], id=3))
    other.close()
    held.next()
    held.close()  # the client leaves: its slot is free again
    again = Stream(listen(mcp, [task_id], id=4))
    again.close()


def test_a_listen_tick_builds_the_bodies_from_the_watchers_reads(
    alice, bob, django_assert_num_queries
) -> None:  # type: ignore[no-untyped-def]
    from tests.tasks_app.mcp.test_handshake import open_question
    from tests.tasks_app.mcp.test_session_streams import make_task

    done, waiting, untouched = make_task(alice), make_task(alice), make_task(alice)
    theirs = make_task(bob)
    transitions.complete(task_id=done.pk, result={"content": [], "isError": False})
    open_question(waiting.pk)
    since = timezone.now() + timedelta(seconds=1)  # changes within the slack are read again
    watches = [
        session_streams._Watch(
            client_id=alice.pk,
            session_id=None,
            since=since,
            task_ids=frozenset({done.pk, waiting.pk, theirs.pk}),
        )
        for _ in range(20)
    ]
    with django_assert_num_queries(3):  # changed tasks, waiting tasks, their requests
        session_streams._Watcher()._tick(watches)
    for watch in watches:
        states = watch.ticks.get_nowait().states
        assert set(states) == {done.pk, waiting.pk}
        assert states[done.pk]["status"] == "completed"
        assert list(states[waiting.pk]["inputRequests"]) and untouched.pk not in states


def test_the_watcher_outlives_a_database_error_of_its_listen(alice, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import psycopg

    from tests.tasks_app.mcp.test_session_streams import make_task

    task = make_task(alice)
    failures = iter([psycopg.OperationalError("the server closed the connection")])

    def listen(self) -> bool:  # type: ignore[no-untyped-def]
        for error in failures:
            raise error
        return False

    monkeypatch.setattr(session_streams._Watcher, "_listen", listen)
    watcher = session_streams._Watcher()
    watch = watcher.watch(alice.pk, None, timezone.now(), frozenset({task.pk}))
    try:
        transitions.complete(task_id=task.pk, result={"content": [], "isError": False})
        # The first tick failed; a later one hands the change over.
        while watch.ticks.get(timeout=5).states.get(task.pk, {}).get("status") != "completed":
            pass
    finally:
        watcher.forget(watch)
