"""Method params are checked strictly and come back as plain dicts of what was sent."""

from __future__ import annotations

import threading

import pytest

from tasks_app.mcp.errors import InvalidParams
from tasks_app.mcp.params import (
    CompletionParams,
    HandshakeToolsCallParams,
    InitializeParams,
    ListParams,
    PromptsGetParams,
    SetLevelParams,
    TaskParams,
    TasksUpdateParams,
    ToolsCallParams,
    validate,
)


def test_defaults_fill_in_and_null_arguments_count_as_none() -> None:
    assert validate(ToolsCallParams, {"name": "echo", "arguments": None}) == {
        "name": "echo",
        "arguments": {},
    }
    assert validate(ToolsCallParams, {"name": "echo"}) == {"name": "echo", "arguments": {}}
    assert validate(InitializeParams, {"protocolVersion": "2025-11-25"}) == {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {},
    }
    assert validate(ListParams, {}) == {"cursor": ""}


def test_optional_fields_appear_only_when_sent_and_unknown_keys_are_dropped() -> None:
    data = validate(ToolsCallParams, {"name": "echo", "extra": 1, "requestState": "s"})
    assert data == {"name": "echo", "arguments": {}, "requestState": "s"}
    assert "task" not in validate(HandshakeToolsCallParams, {"name": "echo"})
    assert validate(HandshakeToolsCallParams, {"name": "echo", "task": {"ttl": 5}})["task"] == {
        "ttl": 5
    }


def test_each_call_gets_its_own_default_arguments() -> None:
    first = validate(ToolsCallParams, {"name": "echo"})
    first["arguments"]["x"] = 1
    assert validate(ToolsCallParams, {"name": "echo"})["arguments"] == {}


@pytest.mark.parametrize(
    ("kind", "params", "message"),
    [
        (ToolsCallParams, {"name": 7}, r"^params\.name: Must be a string, not a number\.$"),
        (ToolsCallParams, {}, r"^params\.name: This field is required\.$"),
        (ToolsCallParams, {"name": ""}, r"^params\.name: This field may not be blank\.$"),
        (ToolsCallParams, {"name": "x" * 201}, r"no more than 200 characters"),
        (
            ToolsCallParams,
            {"name": "e", "arguments": [1]},
            r"^params\.arguments: Must be a JSON object, not an array\.$",
        ),
        (
            ToolsCallParams,
            {"name": "e", "requestState": None},
            r"^params\.requestState: Must be a string, not null\.$",
        ),
        (
            HandshakeToolsCallParams,
            {"name": "e", "task": None},
            r"^params\.task: Must be a JSON object, not null\.$",
        ),
        (
            PromptsGetParams,
            {"name": "p", "arguments": {"x": 1}},
            r"^params\.arguments\.x: Must be a string",
        ),
        (TaskParams, {"taskId": True}, r"^params\.taskId: Must be a string, not a boolean\.$"),
        (
            TasksUpdateParams,
            {"taskId": "t", "inputResponses": {"q": "yes"}},
            r"^params\.inputResponses\.q: Must be a JSON object, not a string\.$",
        ),
        (SetLevelParams, {"level": "loud"}, r"^params\.level: Must be one of 'debug', 'info'"),
        (
            CompletionParams,
            {"ref": {"type": "ref/prompt"}, "argument": {"name": "a", "value": 3}},
            r"^params\.argument\.value: Must be a string, not a number\.$",
        ),
        (
            CompletionParams,
            {"ref": "p", "argument": {"name": "a", "value": ""}},
            r"^params\.ref: Must be a JSON object, not a string\.$",
        ),
    ],
)
def test_a_bad_field_is_named_with_its_path(kind: type, params: dict, message: str) -> None:
    with pytest.raises(InvalidParams, match=message) as caught:
        validate(kind, params)
    assert caught.value.data["errors"][0]["field"].startswith("params")


def test_every_bad_field_is_listed_in_the_error_data() -> None:
    with pytest.raises(InvalidParams) as caught:
        validate(TasksUpdateParams, {"taskId": 1})
    assert [e["field"] for e in caught.value.data["errors"]] == [
        "params.taskId",
        "params.inputResponses",
    ]


def test_threads_validating_at_once_each_get_their_own_answer() -> None:
    errors: list[str] = []

    def work(n: int) -> None:
        for i in range(200):
            task_id = f"t{n}-{i}"
            if validate(TaskParams, {"taskId": task_id}) != {"taskId": task_id}:
                errors.append(task_id)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
