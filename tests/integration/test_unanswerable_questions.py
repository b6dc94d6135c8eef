"""Questions a client cannot answer, against a live server and real workers, on both wires.

A client that declares no elicitation capability (a 2026-07-28 request without it, a
2025-11-25 session whose ``initialize`` declared none) calls the demo ``confirm_action``,
whose question only the client may answer: the task fails within a second, naming the
missing capability. A question an operator may answer too (``asks_anyone``) waits in the
inbox within a second, and the live inbox answers it. The second is measured on the server's
clock, from the task's acceptance; the first task of each stack warms its worker up.

Runs on the database of the run: CI runs it on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest

from elicitations import selectors
from elicitations.models import InputRequest
from tasks_app.models import Status, Task
from tests.live import LiveStack, wait_for
from tests.wire import (
    HandshakeSession,
    post,
    result_of,
    tasks_get,
    tools_call,
    wait_terminal,
)

pytestmark = pytest.mark.live

# What the demo's confirm_action fails with for a client that declared no elicitation.
NO_FORM = (
    "Question 'confirm' cannot be asked: the client declared no elicitation capability "
    "(form mode); this question can only be answered by the client"
)
PASSWORD = "pw-olga-123"
# How long a task may take to reach the inbox or fail once it is accepted, on the server's
# clock (the accepted task's created_at to its finished_at, or to its question's created_at).
AT_ONCE = timedelta(seconds=1)
# How long the test waits to see it through the client's polls (which the machine's load
# may slow down; what is asserted is AT_ONCE).
SEEN_WITHIN = 15


@pytest.fixture
def operator(operator, settings):  # type: ignore[no-untyped-def]
    """The ``operator`` persona (olga), whose password the live server can check: it uses the
    production hashers, not the tests' MD5."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    operator.set_password(PASSWORD)
    operator.save(update_fields=["password"])
    return operator


def warmed_up(stack: LiveStack, token: str) -> None:
    """Run one task through STACK first: what is measured is the question's way, not how long
    a freshly started worker takes to its first message."""
    created = result_of(post(stack.mcp_url, tools_call("noop", {}, token=token)))
    wait_terminal(stack.mcp_url, created["taskId"], token=token, timeout=60)


def failed_at_once(task_id: str, status: Any) -> dict[str, Any]:
    """Wait until STATUS() (the client's view) reports task TASK_ID failed; check that it
    failed within AT_ONCE of its acceptance; return the report."""

    def failed() -> dict[str, Any] | None:
        got: dict[str, Any] = status()
        return got if got["status"] == "failed" else None

    report = wait_for(f"task {task_id} to fail", failed, SEEN_WITHIN, every=0.05)
    task = Task.objects.get(pk=task_id)
    assert task.finished_at is not None
    took = task.finished_at - task.created_at
    assert took <= AT_ONCE, f"failed {took} after it was accepted"
    return report


def in_the_inbox_at_once(task_id: str, operator: Any) -> InputRequest:
    """Wait until task TASK_ID's question is in OPERATOR's inbox; check that it was asked
    within AT_ONCE of the task's acceptance."""

    def listed() -> InputRequest | None:
        return selectors.inbox_for(user=operator).filter(task_id=task_id).first()

    question = wait_for(f"task {task_id}'s question in the inbox", listed, SEEN_WITHIN)
    took = question.created_at - Task.objects.get(pk=task_id).created_at
    assert took <= AT_ONCE, f"in the inbox {took} after the task was accepted"
    return question


def answer_in_the_live_inbox(stack: LiveStack, request: InputRequest) -> None:
    """Log in to the live server as olga (the ``operator`` persona) and accept REQUEST with
    ok=true through the inbox's answer form."""
    with httpx.Client(base_url=stack.url, timeout=30) as browser:
        browser.get("/accounts/login/")
        logged_in = browser.post(
            "/accounts/login/",
            data={
                "username": "olga",
                "password": PASSWORD,
                "csrfmiddlewaretoken": browser.cookies["csrftoken"],
            },
        )
        assert logged_in.status_code == 302, logged_in.text
        assert request.message in browser.get("/inbox/").text
        answered = browser.post(
            f"/inbox/{request.pk}/",
            data={
                "_action": "accept",
                "ok": "true",  # the Yes of its Yes/No choice
                "csrfmiddlewaretoken": browser.cookies["csrftoken"],
            },
        )
        assert answered.status_code == 302, answered.text


def waits_for_an_operator(task_id: str) -> None:
    task = Task.objects.get(pk=task_id)
    assert task.status == Status.WORKING  # never input_required: the client cannot answer
    assert task.status_message == "Waiting for an operator in the inbox: Let it through?"


def test_a_2026_client_without_elicitation_is_never_left_waiting(
    stack, alice_token, operator
) -> None:
    url = stack.mcp_url
    warmed_up(stack, alice_token)
    # The request declares the tasks extension and nothing else.
    created = result_of(
        post(url, tools_call("confirm_action", {"action": "deploy"}, token=alice_token))
    )
    failed = failed_at_once(
        created["taskId"],
        lambda: result_of(post(url, tasks_get(created["taskId"], token=alice_token))),
    )
    assert failed["error"]["code"] == -32021
    assert failed["error"]["message"] == NO_FORM
    assert failed["error"]["data"]["requiredCapabilities"] == {"elicitation": {"form": {}}}

    asked = result_of(post(url, tools_call("asks_anyone", {}, token=alice_token)))
    question = in_the_inbox_at_once(asked["taskId"], operator)
    waits_for_an_operator(asked["taskId"])
    got = result_of(post(url, tasks_get(asked["taskId"], token=alice_token)))
    assert got["status"] == "working" and "inputRequests" not in got
    answer_in_the_live_inbox(stack, question)
    done = wait_terminal(url, asked["taskId"], token=alice_token, timeout=30)
    assert done["result"]["content"][0]["text"] == "accept {'ok': True}"


def test_a_2025_session_without_elicitation_is_never_left_waiting(
    stack, alice_token, operator
) -> None:
    warmed_up(stack, alice_token)
    session = HandshakeSession(stack.mcp_url, alice_token)
    session.connect(capabilities={})
    task = {"task": {"ttl": 60000}}
    confirm = {"name": "confirm_action", "arguments": {"action": "deploy"}, **task}
    task_id = session.call("tools/call", confirm)["result"]["task"]["taskId"]
    failed_at_once(task_id, lambda: session.call("tasks/get", {"taskId": task_id})["result"])
    error = session.call("tasks/result", {"taskId": task_id})["error"]
    assert (error["code"], error["message"]) == (-32021, NO_FORM)

    asks = {"name": "asks_anyone", "arguments": {}, **task}
    asked_id = session.call("tools/call", asks)["result"]["task"]["taskId"]
    question = in_the_inbox_at_once(asked_id, operator)
    waits_for_an_operator(asked_id)
    assert session.call("tasks/get", {"taskId": asked_id})["result"]["status"] == "working"
    answer_in_the_live_inbox(stack, question)
    result = session.call("tasks/result", {"taskId": asked_id})["result"]
    assert result["content"][0]["text"] == "accept {'ok': True}"
