"""tools/call, MRTR rounds, prompts, resources and discovery, through raw requests."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import time_machine

from tests.wire import TASKS, error_of, request, result_of, sse_messages

pytestmark = pytest.mark.django_db

CALL = "tools/call"


def call(mcp, name: str, arguments: dict | None = None, **extra):  # type: ignore[no-untyped-def]
    env = {
        k: extra.pop(k) for k in list(extra) if k in ("tasks", "elicitation", "sampling", "roots")
    }
    params = {"name": name, "arguments": arguments or {}, **extra}
    return mcp.post(request(CALL, params, **env))


def text_of(result: dict) -> str:
    return result["content"][0]["text"]


# --- discovery ---------------------------------------------------------------------------


def test_discover_advertises_the_tasks_extension(mcp) -> None:  # type: ignore[no-untyped-def]
    result = result_of(mcp.call("server/discover"))
    assert result["supportedVersions"] == ["2026-07-28"]
    assert result["capabilities"]["extensions"] == {TASKS: {}}
    assert "tasks" not in result["capabilities"]
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "taskdesk"
    assert result["resultType"] == "complete"


def test_tools_list_describes_every_tool_with_caching_hints(mcp) -> None:  # type: ignore[no-untyped-def]
    result = result_of(mcp.call("tools/list"))
    assert isinstance(result["ttlMs"], int) and result["cacheScope"] in ("public", "private")
    names = [tool["name"] for tool in result["tools"]]
    assert {"greet", "slow_compute", "slow_echo"} <= set(names)
    for tool in result["tools"]:
        assert tool["description"] and tool["inputSchema"]["type"] == "object"


# --- synchronous calls -------------------------------------------------------------------


def test_a_forbidden_tool_answers_synchronously(mcp) -> None:  # type: ignore[no-untyped-def]
    result = result_of(call(mcp, "greet", {"name": "Ada"}, tasks=True))
    assert result == {
        "content": [{"type": "text", "text": "Hello, Ada!"}],
        "isError": False,
        "resultType": "complete",
    }


def test_a_legacy_task_param_is_ignored(mcp) -> None:  # type: ignore[no-untyped-def]
    result = result_of(call(mcp, "greet", {"name": "Ada"}, task={"ttl": 1000}, tasks=True))
    assert "taskId" not in result and text_of(result) == "Hello, Ada!"


def test_an_optional_tool_without_the_extension_runs_inline(mcp) -> None:  # type: ignore[no-untyped-def]
    result = result_of(call(mcp, "slow_compute", {"seconds": 0, "label": "now"}))
    assert result["resultType"] == "complete" and "taskId" not in result
    assert "now finished" in text_of(result)


def test_a_key_on_a_forbidden_tool_is_not_applied(mcp) -> None:  # type: ignore[no-untyped-def]
    body = request(CALL, {"name": "greet", "arguments": {"name": "Ada"}})
    result = result_of(mcp.post(body, headers={"Idempotency-Key": "k-1"}))
    assert result["_meta"]["dev.taskdesk/idempotency"] == "not-applied"


def test_a_tool_error_is_an_error_result(mcp) -> None:  # type: ignore[no-untyped-def]
    result = result_of(call(mcp, "test_error_handling"))
    assert result["isError"] is True and "intentionally" in text_of(result)


def test_a_protocol_error_of_an_inline_call_is_a_jsonrpc_error(mcp) -> None:  # type: ignore[no-untyped-def]
    response = call(mcp, "protocol_error_job")
    assert response.status_code == 200
    assert error_of(response)["code"] == -32603


def test_unknown_tool_and_bad_arguments_are_invalid_params(mcp) -> None:  # type: ignore[no-untyped-def]
    for response in (call(mcp, "nope"), call(mcp, "greet", {"name": 5}), call(mcp, "greet", {})):
        assert response.status_code == 400
        assert error_of(response)["code"] == -32602


def test_a_required_tool_without_the_extension_is_refused(mcp) -> None:  # type: ignore[no-untyped-def]
    response = call(mcp, "failing_job")
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == -32021
    assert error["data"] == {"requiredCapabilities": {"extensions": {TASKS: {}}}}


def test_content_types(mcp) -> None:  # type: ignore[no-untyped-def]
    image = result_of(call(mcp, "test_image_content"))["content"][0]
    assert image["type"] == "image" and image["mimeType"] == "image/png" and image["data"]
    audio = result_of(call(mcp, "test_audio_content"))["content"][0]
    assert audio["mimeType"] == "audio/wav"
    kinds = [c["type"] for c in result_of(call(mcp, "test_multiple_content_types"))["content"]]
    assert kinds == ["text", "image", "resource"]


# --- MRTR -----------------------------------------------------------------------------


def test_an_input_round_trip(mcp) -> None:  # type: ignore[no-untyped-def]
    first = result_of(call(mcp, "test_input_required_result_elicitation", elicitation={}))
    assert first["resultType"] == "input_required"
    question = first["inputRequests"]["user_name"]
    assert question["method"] == "elicitation/create"
    assert question["params"]["requestedSchema"]["required"] == ["name"]
    answer = {"user_name": {"action": "accept", "content": {"name": "Alice"}}}
    second = result_of(
        call(
            mcp,
            "test_input_required_result_elicitation",
            elicitation={},
            inputResponses=answer,
            requestState=first["requestState"],
        )
    )
    assert text_of(second) == "Hello, Alice!"


def test_a_missing_or_invalid_answer_is_asked_again(mcp) -> None:  # type: ignore[no-untyped-def]
    for responses in (
        {"wrong_key": {"action": "accept", "content": {"name": "x"}}},
        {"user_name": {"action": "accept", "content": {"name": 42}}},
        {"user_name": {"action": "maybe"}},
    ):
        result = result_of(
            call(
                mcp,
                "test_input_required_result_elicitation",
                elicitation={},
                inputResponses=responses,
            )
        )
        assert result["resultType"] == "input_required"
        assert list(result["inputRequests"]) == ["user_name"]


def test_answers_of_earlier_rounds_travel_in_the_signed_state(mcp) -> None:  # type: ignore[no-untyped-def]
    name = "test_input_required_result_multi_round"
    first = result_of(call(mcp, name, elicitation={}))
    second = result_of(
        call(
            mcp,
            name,
            elicitation={},
            inputResponses={"step1": {"action": "accept", "content": {"name": "Alice"}}},
            requestState=first["requestState"],
        )
    )
    assert list(second["inputRequests"]) == ["step2"]
    assert second["requestState"] != first["requestState"]
    third = result_of(
        call(
            mcp,
            name,
            elicitation={},
            inputResponses={"step2": {"action": "accept", "content": {"color": "blue"}}},
            requestState=second["requestState"],
        )
    )
    assert text_of(third) == "Alice likes blue"


def _state(mcp, name: str = "test_input_required_result_tampered_state") -> str:  # type: ignore[no-untyped-def]
    return result_of(call(mcp, name, elicitation={}))["requestState"]


def _retry(
    mcp, state: str, name: str = "test_input_required_result_tampered_state", arguments=None
):  # type: ignore[no-untyped-def]
    return call(
        mcp,
        name,
        arguments,
        elicitation={},
        inputResponses={"confirm": {"action": "accept", "content": {"ok": True}}},
        requestState=state,
    )


def _refused(response, reason: str) -> None:  # type: ignore[no-untyped-def]
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == -32602
    assert error["data"]["reason"] == reason


def test_a_tampered_state_is_refused(mcp) -> None:  # type: ignore[no-untyped-def]
    state = _state(mcp)
    assert result_of(_retry(mcp, state))["resultType"] == "complete"
    _refused(_retry(mcp, state + "-TAMPERED"), "request_state_invalid")
    _refused(_retry(mcp, state[:-3] + "abc"), "request_state_invalid")


def test_an_expired_state_is_refused(mcp) -> None:  # type: ignore[no-untyped-def]
    state = _state(mcp)
    with time_machine.travel(timedelta(hours=1)):
        _refused(_retry(mcp, state), "request_state_expired")


def test_a_state_of_another_client_or_call_is_refused(mcp, bob_mcp) -> None:  # type: ignore[no-untyped-def]
    state = _state(mcp)
    _refused(_retry(bob_mcp, state), "request_state_mismatch")
    _refused(
        _retry(mcp, state, name="test_input_required_result_request_state"),
        "request_state_mismatch",
    )
    greeting = result_of(call(mcp, "confirm_delete", {"filename": "a.txt"}, elicitation={}))
    _refused(
        call(
            mcp,
            "confirm_delete",
            {"filename": "b.txt"},
            elicitation={},
            inputResponses={"confirm": {"action": "accept", "content": {"confirm": True}}},
            requestState=greeting["requestState"],
        ),
        "request_state_mismatch",
    )


def test_only_declared_input_kinds_are_requested(mcp) -> None:  # type: ignore[no-untyped-def]
    result = result_of(call(mcp, "test_input_required_result_capabilities", sampling={}))
    assert [r["method"] for r in result["inputRequests"].values()] == ["sampling/createMessage"]
    response = call(mcp, "test_input_required_result_elicitation")
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == -32021
    assert error["data"]["requiredCapabilities"] == {"elicitation": {"form": {}}}
    error = error_of(call(mcp, "test_missing_capability"))
    assert error["data"]["requiredCapabilities"] == {"sampling": {}}


def test_several_kinds_of_input_in_one_round(mcp) -> None:  # type: ignore[no-untyped-def]
    name = "test_input_required_result_multiple_inputs"
    caps = {"elicitation": {}, "sampling": {}, "roots": {}}
    first = result_of(call(mcp, name, **caps))
    methods = {k: v["method"] for k, v in first["inputRequests"].items()}
    assert methods == {
        "user_name": "elicitation/create",
        "greeting": "sampling/createMessage",
        "client_roots": "roots/list",
    }
    answers = {
        "user_name": {"action": "accept", "content": {"name": "Ada"}},
        "greeting": {"role": "assistant", "content": {"type": "text", "text": "Hi"}, "model": "m"},
        "client_roots": {"roots": [{"uri": "file:///a"}]},
    }
    done = result_of(
        call(mcp, name, inputResponses=answers, requestState=first["requestState"], **caps)
    )
    assert text_of(done) == "Hi Ada (1 roots)"


def test_an_escalating_tool_becomes_a_task_with_the_answers_journaled(
    mcp, transactional_db
) -> None:  # type: ignore[no-untyped-def]
    from tasks_app.models import JournalEntry, Task

    first = result_of(call(mcp, "test_tool_with_task", elicitation={}, tasks=True))
    assert first["resultType"] == "input_required" and "taskId" not in first
    second = result_of(
        call(
            mcp,
            "test_tool_with_task",
            elicitation={},
            tasks=True,
            inputResponses={"user_name": {"action": "accept", "content": {"name": "Alice"}}},
            requestState=first["requestState"],
        )
    )
    assert second["resultType"] == "task"
    assert "requestState" not in second and "inputRequests" not in second
    task = Task.objects.get(pk=second["taskId"])
    entry = JournalEntry.objects.get(task=task)
    assert (entry.kind, entry.name) == ("ask", "user_name")
    assert entry.outcome == {"action": "accept", "content": {"name": "Alice"}}


# --- streaming ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_progress_streams_as_server_sent_events(mcp) -> None:  # type: ignore[no-untyped-def]
    body = request(CALL, {"name": "test_tool_with_progress", "arguments": {}})
    body["params"]["_meta"]["progressToken"] = "p-1"
    response = mcp.post(body)
    assert response["Content-Type"] == "text/event-stream"
    messages = sse_messages(response)
    progress = [m["params"]["progress"] for m in messages[:-1]]
    assert progress == [0, 50, 100]
    assert all(m["params"]["progressToken"] == "p-1" for m in messages[:-1])
    assert messages[-1]["id"] == 1 and messages[-1]["result"]["resultType"] == "complete"


@pytest.mark.django_db(transaction=True)
def test_log_lines_go_only_to_clients_that_set_a_level(mcp) -> None:  # type: ignore[no-untyped-def]
    quiet = call(mcp, "test_tool_with_logging")
    assert quiet["Content-Type"] == "application/json"
    body = request(CALL, {"name": "test_tool_with_logging", "arguments": {}})
    body["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = "debug"
    messages = sse_messages(mcp.post(body))
    logs = [m for m in messages if m.get("method") == "notifications/message"]
    assert len(logs) == 3 and logs[0]["params"]["level"] == "info"
    body["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = "error"
    assert mcp.post(body)["Content-Type"] == "application/json"


# --- prompts, resources, completion ---------------------------------------------------------


def test_prompts(mcp) -> None:  # type: ignore[no-untyped-def]
    listed = result_of(mcp.call("prompts/list"))
    assert "test_prompt_with_arguments" in [p["name"] for p in listed["prompts"]]
    got = result_of(
        mcp.call(
            "prompts/get",
            {"name": "test_prompt_with_arguments", "arguments": {"arg1": "x", "arg2": "y"}},
        )
    )
    assert "'x'" in got["messages"][0]["content"]["text"]
    missing = mcp.call("prompts/get", {"name": "test_prompt_with_arguments", "arguments": {}})
    assert missing.status_code == 400 and error_of(missing)["code"] == -32602
    asked = result_of(
        mcp.call("prompts/get", {"name": "test_input_required_result_prompt"}, elicitation={})
    )
    assert list(asked["inputRequests"]) == ["user_context"]


def test_resources(mcp) -> None:  # type: ignore[no-untyped-def]
    listed = result_of(mcp.call("resources/list"))
    assert {"test://static-text", "test://static-binary"} <= {r["uri"] for r in listed["resources"]}
    templates = result_of(mcp.call("resources/templates/list"))["resourceTemplates"]
    assert templates[0]["uriTemplate"] == "test://template/{id}/data"
    text = result_of(mcp.call("resources/read", {"uri": "test://static-text"}))
    assert text["contents"][0]["text"] and "ttlMs" in text
    blob = result_of(mcp.call("resources/read", {"uri": "test://static-binary"}))["contents"][0]
    assert blob["mimeType"] == "image/png" and blob["blob"]
    data = result_of(mcp.call("resources/read", {"uri": "test://template/123/data"}))
    assert json.loads(data["contents"][0]["text"])["id"] == "123"
    missing = mcp.call("resources/read", {"uri": "test://nope"})
    assert missing.status_code == 400
    assert error_of(missing)["data"] == {"uri": "test://nope"}


def test_completion(mcp) -> None:  # type: ignore[no-untyped-def]
    params = {
        "ref": {"type": "ref/prompt", "name": "test_prompt_with_arguments"},
        "argument": {"name": "arg1", "value": "par"},
    }
    result = result_of(mcp.call("completion/complete", params))
    assert result["completion"] == {
        "values": ["paris", "park", "party"],
        "total": 3,
        "hasMore": False,
    }


def test_a_step_before_escalation_is_journaled_and_not_run_again_by_the_task(
    mcp, transactional_db, settings
) -> None:  # type: ignore[no-untyped-def]
    from tasks_app.models import JournalEntry, Task
    from tests import runtime_toolset
    from tests.runtime_toolset import RUNTIME_TOOLSETS
    from tests.tasks_app.runtime.helpers import leg, text_of

    settings.TASKDESK_TOOLSETS = RUNTIME_TOOLSETS
    runtime_toolset.RUNS.clear()

    created = result_of(call(mcp, "escalating_step", tasks=True))

    assert created["resultType"] == "task"
    task = Task.objects.get(pk=created["taskId"])
    entry = JournalEntry.objects.get(task=task)
    assert (entry.kind, entry.name, entry.outcome) == ("step", "roll", {"value": 1})
    leg(task)
    assert task.status == "completed"
    assert text_of(task.result) == "rolled 1"
    assert runtime_toolset.RUNS["escalating_step.roll"] == 1


def test_an_effect_before_escalation_is_refused(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    from tests.runtime_toolset import RUNTIME_TOOLSETS

    settings.TASKDESK_TOOLSETS = RUNTIME_TOOLSETS

    result = result_of(call(mcp, "escalating_effect", tasks=True))

    assert result["isError"] is True
    assert "starts the effect 'early' before ctx.escalate()" in result["content"][0]["text"]


@pytest.mark.parametrize("every_task", [False, True])
def test_a_successful_call_logs_at_debug_unless_every_task_is_logged(
    mcp, settings, caplog, every_task
) -> None:  # type: ignore[no-untyped-def]
    import logging

    settings.TASKDESK_LOG_EVERY_TASK = every_task
    body = request("tools/call", {"name": "slow_echo", "arguments": {"text": "hi"}}, tasks=True)
    with caplog.at_level(logging.DEBUG, logger="tasks_app.mcp"):
        assert mcp.post(body).status_code == 200
        mcp.post(request("tools/call", {"name": "no_such_tool", "arguments": {}}, tasks=True))
    lines = {r.getMessage().split(" http=")[0]: r.levelname for r in caplog.records}
    assert lines["mcp tools/call ok"] == ("INFO" if every_task else "DEBUG")
    assert lines["mcp tools/call -32602"] == "INFO"  # an error is always INFO
