"""``subscriptions/listen`` against a live stack on PostgreSQL: a raw 2026-07-28 client (httpx,
reading the event stream itself) hears its tasks change in the worker processes within a
second of the change, and hears the current state first when it listens again."""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
from typing import Any

import httpx
import pytest
from django.db import connection

from tasks_app.models import Task
from tests.live import live_stack, wait_for
from tests.wire import headers_for, request

pytestmark = [pytest.mark.live, pytest.mark.broker]

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
STREAM_SECONDS = 30


class Listener:
    """One subscriptions/listen stream, read in a thread: (arrival time, message) pairs."""

    def __init__(self, url: str, token: str, task_ids: list[str], listen_id: int) -> None:
        body = request(
            "subscriptions/listen",
            {"notifications": {"taskIds": task_ids}},
            id=listen_id,
            tasks=True,
        )
        self.headers = {
            "Content-Type": "application/json",
            **headers_for(body),
            "Authorization": f"Bearer {token}",
        }
        self.body = json.dumps(body).encode()
        self.url = url
        self.status = 0
        self.media_type = ""
        self.messages: queue.SimpleQueue[tuple[float, dict[str, Any] | None]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._read, name=f"listen-{listen_id}", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            with httpx.stream(
                "POST", self.url, content=self.body, headers=self.headers, timeout=None
            ) as response:
                self.status = response.status_code
                self.media_type = response.headers["content-type"]
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        self.messages.put((time.time(), json.loads(line[5:])))
        except httpx.HTTPError:
            pass  # the stack stopped while the stream was open
        finally:
            self.messages.put((time.time(), None))

    def next(self, timeout: float = 20) -> tuple[float, dict[str, Any]]:
        try:
            at, message = self.messages.get(timeout=timeout)
        except queue.Empty:
            states = list(Task.objects.values_list("pk", "status", "updated_at"))
            raise AssertionError(f"nothing came in {timeout} s; the tasks: {states}") from None
        assert message is not None, f"the stream ended (HTTP {getattr(self, 'status', None)})"
        assert self.status == 200 and self.media_type.startswith("text/event-stream")
        return at, message


def open_raw(
    stack: Any, token: str, task_ids: list[str], listen_id: int
) -> tuple[socket.socket, int]:
    """A listen request on a socket of its own: the socket (still open) and the HTTP status."""
    body = request(
        "subscriptions/listen", {"notifications": {"taskIds": task_ids}}, id=listen_id, tasks=True
    )
    data = json.dumps(body).encode()
    headers = {
        **headers_for(body),
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Content-Length": str(len(data)),
        "Host": f"127.0.0.1:{stack.port}",
    }
    sock = socket.create_connection(("127.0.0.1", stack.port), timeout=10)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall(f"POST /mcp HTTP/1.1\r\n{head}\r\n".encode() + data)
    status = int(sock.recv(64).split(b" ", 2)[1])
    return sock, status


def result(stack: Any, token: str, method: str, params: dict[str, Any], **env: Any) -> Any:
    body = request(method, params, tasks=True, **env)
    response = stack.post(body, token=token, headers=headers_for(body))
    assert response.status_code == 200, response.text
    return response.json()["result"]


def detailed(stack: Any, token: str, task_id: str) -> dict[str, Any]:
    body = result(stack, token, "tasks/get", {"taskId": task_id})
    body.pop("resultType")
    return dict(body)


def task_params(message: dict[str, Any], listen_id: int) -> dict[str, Any]:
    assert message.get("method") == "notifications/tasks", message
    params = dict(message["params"])
    assert params.pop("_meta") == {SUBSCRIPTION_ID: listen_id}
    return params


def lag(task_id: str, arrived: float) -> float:
    """Seconds from the task row's last update (the transition) to the notification."""
    return arrived - Task.objects.get(pk=task_id).updated_at.timestamp()


def test_a_raw_client_hears_its_tasks_change_in_the_workers_within_a_second(
    transactional_db: None, alice_token: str, bob_token: str
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the cross-process notifications are PostgreSQL's (LISTEN/NOTIFY)")
    env = {
        "TASKDESK_STREAM_SECONDS": str(STREAM_SECONDS),
        "TASKDESK_POLL_THROTTLE": "100/second",
        "TASKDESK_MAX_STREAMS_PER_CLIENT": "2",
    }
    with live_stack(env=env, worker_concurrency=4) as stack:  # two legs run all along
        quick = result(
            stack, alice_token, "tools/call", {"name": "slow_compute", "arguments": {"seconds": 4}}
        )
        asking = result(
            stack,
            alice_token,
            "tools/call",
            {"name": "confirm_action", "arguments": {"action": "ship it"}},
            elicitation={},
        )
        slow = result(
            stack, alice_token, "tools/call", {"name": "slow_compute", "arguments": {"seconds": 60}}
        )
        theirs = result(
            stack, bob_token, "tools/call", {"name": "slow_compute", "arguments": {"seconds": 60}}
        )
        mine = [quick["taskId"], asking["taskId"], slow["taskId"]]

        stream = Listener(stack.mcp_url, alice_token, [*mine, theirs["taskId"]], listen_id=41)
        _, ack = stream.next()
        assert ack["method"] == "notifications/subscriptions/acknowledged"
        assert ack["params"] == {"_meta": {SUBSCRIPTION_ID: 41}, "notifications": {"taskIds": mine}}
        answered = False

        def answer(note: dict[str, Any]) -> None:
            """Answer the asking task's question, the first time a notification shows it."""
            nonlocal answered
            if note["status"] != "input_required" or answered:
                return
            (key,) = note["inputRequests"]
            answers = {key: {"action": "accept", "content": {"confirm": True}}}
            result(
                stack,
                alice_token,
                "tasks/update",
                {"taskId": note["taskId"], "inputResponses": answers},
            )
            answered = True

        seen: dict[str, list[dict[str, Any]]] = {task_id: [] for task_id in mine}
        for _ in mine:
            note = task_params(stream.next()[1], 41)
            seen[note["taskId"]].append(note)
        assert all(len(notes) == 1 for notes in seen.values())
        # A worker that is already up may run the asking task's first leg before the stream
        # opens: its question then comes with the first states.
        answer(seen[asking["taskId"]][0])

        # The asking task: one notification per status, each the body tasks/get returns.
        lags: list[float] = []
        while "completed" not in [n["status"] for n in seen[asking["taskId"]]] or not any(
            n["status"] == "completed" for n in seen[quick["taskId"]]
        ):
            arrived, message = stream.next()
            note = task_params(message, 41)
            assert note["taskId"] != theirs["taskId"]
            seen[note["taskId"]].append(note)
            if note["status"] in ("input_required", "completed"):
                assert note == detailed(stack, alice_token, note["taskId"])
                lags.append(lag(note["taskId"], arrived))
            answer(note)
        statuses = [n["status"] for n in seen[asking["taskId"]]]
        # It may have asked before the stream opened; and the leg standing by may finish
        # within the watcher's least gap between reads (a tenth of a second) of the answer,
        # so that its "working" is never read: each notification is the state then read.
        assert statuses in (
            ["working", "input_required", "working", "completed"],
            ["working", "input_required", "completed"],
            ["input_required", "working", "completed"],
            ["input_required", "completed"],
        )
        assert [n["status"] for n in seen[quick["taskId"]]] == ["working", "completed"]
        assert seen[quick["taskId"]][-1]["result"]["content"][0]["text"].startswith(
            "computation finished"
        )
        assert [n["status"] for n in seen[slow["taskId"]]] == ["working"]
        print(f"notification lags after the commit (s): {[round(x, 3) for x in lags]}")
        assert max(lags) < 1.0, lags

        # The stream ends with the listen request's result.
        while True:
            _, message = stream.next(timeout=STREAM_SECONDS + 5)
            if "method" not in message:
                break
            assert message["method"] == "notifications/tasks"  # nothing else goes on it
        assert message == {
            "jsonrpc": "2.0",
            "id": 41,
            "result": {"_meta": {SUBSCRIPTION_ID: 41}, "resultType": "complete"},
        }

        # Listening again: the current state of every watched task comes first.
        again = Listener(stack.mcp_url, alice_token, mine, listen_id=42)
        assert again.next()[1]["params"]["notifications"] == {"taskIds": mine}
        current = {}
        for _ in mine:
            note = task_params(again.next()[1], 42)
            current[note["taskId"]] = note
        assert [current[t]["status"] for t in mine] == ["completed", "completed", "working"]
        for task_id in mine[:2]:
            assert current[task_id] == detailed(stack, alice_token, task_id)

        # Each stream holds a slot of the client's two: a third is busy, and a client that
        # leaves gives its slot back.
        held, status = open_raw(stack, alice_token, mine, 43)
        assert status == 200
        busy, status = open_raw(stack, alice_token, mine, 44)
        assert status == 429
        busy.close()
        held.close()  # the client goes away without a word

        def reopened() -> socket.socket | None:
            sock, status = open_raw(stack, alice_token, mine, 45)
            if status == 200:
                return sock
            sock.close()
            return None

        wait_for("the slot of the client that left", reopened, timeout=5, every=0.2).close()
