"""The ``Mcp-Name`` header of tasks/get, tasks/update and tasks/cancel (SEP-2663, "Streamable
HTTP: Routing Headers"): a missing one is served from ``params.taskId`` and counted, unless
``TASKDESK_STRICT_ROUTING_HEADERS``; one that disagrees with the body is -32020 either way.
The core's required headers (``MCP-Protocol-Version``, ``Mcp-Method``, and ``Mcp-Name`` of
tools/call, prompts/get and resources/read) stay required."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from elicitations import transitions as elicitation_transitions
from elicitations.models import InputRequest, RequestStatus
from tasks_app import transitions
from tasks_app.models import Status, Task
from tests.tasks_app.test_metrics import scrape, value
from tests.wire import error_of, request, result_of

pytestmark = pytest.mark.django_db(transaction=True)

METRIC = "taskdesk_mcp_routing_header_missing_total"
TASK_METHODS = ["tasks/get", "tasks/update", "tasks/cancel"]
CONFIRM = {
    "type": "object",
    "properties": {"confirm": {"type": "boolean"}},
    "required": ["confirm"],
}
YES = {"action": "accept", "content": {"confirm": True}}


def create(mcp) -> str:  # type: ignore[no-untyped-def]
    # The client answers questions (elicitation), so one can be asked of it below.
    arguments = {"name": "slow_compute", "arguments": {"seconds": 30}}
    body = request("tools/call", arguments, tasks=True, elicitation={})
    task_id: str = result_of(mcp.post(body))["taskId"]
    return task_id


def waiting_for_an_answer(mcp) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """A task that asks the client one question: its id and the question's key."""
    task_id = create(mcp)
    question = elicitation_transitions.open_request(
        task=Task.objects.get(pk=task_id), ask_key="confirm", message="Sure?", schema=CONFIRM
    )
    transitions.require_input(task_id=task_id, message="waiting for an answer")
    return task_id, question.key


def params_for(method: str, task_id: str, key: str) -> dict[str, Any]:
    if method == "tasks/update":
        return {"taskId": task_id, "inputResponses": {key: YES}}
    return {"taskId": task_id}


def assert_done(method: str, task_id: str, key: str, result: dict[str, Any]) -> None:
    """The request did what its method does."""
    task = Task.objects.get(pk=task_id)
    if method == "tasks/get":
        assert result["taskId"] == task_id and result["status"] == "input_required"
        assert list(result["inputRequests"]) == [key]
        return
    assert result == {"resultType": "complete"}
    if method == "tasks/update":
        assert InputRequest.objects.get(key=key).answer == YES
    else:
        assert task.status == Status.CANCELLED


def assert_untouched(task_id: str, key: str) -> None:
    assert Task.objects.get(pk=task_id).status == Status.INPUT_REQUIRED
    assert InputRequest.objects.get(key=key).status == RequestStatus.PENDING
    assert not Task.objects.get(pk=task_id).events.filter(kind="cancel_requested").exists()


def counted(client, method: str) -> float:  # type: ignore[no-untyped-def]
    return value(scrape(client), METRIC, method=method)


@pytest.mark.parametrize("method", TASK_METHODS)
def test_a_missing_mcp_name_is_served_from_the_task_id_and_counted(mcp, client, method) -> None:  # type: ignore[no-untyped-def]
    task_id, key = waiting_for_an_answer(mcp)
    before = counted(client, method)

    body = request(method, params_for(method, task_id, key), tasks=True)
    response = mcp.post(body, headers={"Mcp-Name": None})

    assert_done(method, task_id, key, result_of(response))
    assert counted(client, method) - before == 1


@pytest.mark.parametrize("method", TASK_METHODS)
@pytest.mark.parametrize("strict", [False, True])
def test_a_mcp_name_that_disagrees_is_refused(mcp, client, settings, method, strict) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_STRICT_ROUTING_HEADERS = strict
    task_id, key = waiting_for_an_answer(mcp)
    other_id, _ = waiting_for_an_answer(mcp)
    before = counted(client, method)

    body = request(method, params_for(method, task_id, key), tasks=True)
    for sent in (other_id, "", f" {task_id}x"):
        response = mcp.post(body, headers={"Mcp-Name": sent})
        assert response.status_code == 400, response.content
        error = error_of(response)
        assert error["code"] == -32020
        assert error["message"] == "The Mcp-Name header must equal params.taskId"

    assert_untouched(task_id, key)
    assert_untouched(other_id, InputRequest.objects.get(task_id=other_id).key)
    assert counted(client, method) == before


@pytest.mark.parametrize("method", TASK_METHODS)
def test_the_strict_setting_refuses_a_missing_mcp_name(mcp, client, settings, method) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_STRICT_ROUTING_HEADERS = True
    task_id, key = waiting_for_an_answer(mcp)
    before = counted(client, method)

    body = request(method, params_for(method, task_id, key), tasks=True)
    response = mcp.post(body, headers={"Mcp-Name": None})

    assert response.status_code == 400, response.content
    error = error_of(response)
    assert error["code"] == -32020
    assert "missing" in error["message"] and "params.taskId" in error["message"]
    assert_untouched(task_id, key)
    assert counted(client, method) == before
    # With the header, the strict server serves it.
    assert_done(method, task_id, key, result_of(mcp.post(body)))


def test_a_base64_mcp_name_equal_to_the_task_id_is_served(mcp) -> None:  # type: ignore[no-untyped-def]
    task_id = create(mcp)
    body = request("tasks/get", {"taskId": task_id}, tasks=True)
    encoded = "=?base64?" + base64.b64encode(task_id.encode()).decode() + "?="
    assert result_of(mcp.post(body, headers={"Mcp-Name": encoded}))["taskId"] == task_id


def test_the_extension_is_still_required_without_the_header(mcp) -> None:  # type: ignore[no-untyped-def]
    # A missing header changes nothing else: without the extension in _meta it is -32021.
    task_id = create(mcp)
    response = mcp.post(request("tasks/get", {"taskId": task_id}), headers={"Mcp-Name": None})
    assert response.status_code == 400 and error_of(response)["code"] == -32021


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("tools/call", {"name": "greet", "arguments": {"name": "Ada"}}),
        ("prompts/get", {"name": "test_simple_prompt"}),
        ("resources/read", {"uri": "test://static-text"}),
    ],
)
def test_the_cores_mcp_name_stays_required(mcp, client, method, params) -> None:  # type: ignore[no-untyped-def]
    # streamable-http.mdx lists a missing required standard header as a validation failure.
    before = counted(client, method)
    response = mcp.post(request(method, params), headers={"Mcp-Name": None})
    assert response.status_code == 400, response.content
    assert error_of(response)["code"] == -32020
    assert counted(client, method) == before
    assert result_of(mcp.post(request(method, params)))


@pytest.mark.parametrize("method", ["tasks/get", "tools/list"])
@pytest.mark.parametrize("missing", ["Mcp-Method", "MCP-Protocol-Version"])
def test_the_other_routing_headers_stay_required(mcp, method, missing) -> None:  # type: ignore[no-untyped-def]
    params = {"taskId": create(mcp)} if method == "tasks/get" else {}
    response = mcp.post(request(method, params, tasks=True), headers={missing: None})
    assert response.status_code == 400, response.content
    assert error_of(response)["code"] == -32020
