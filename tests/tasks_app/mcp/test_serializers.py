"""Params serializers copy their declared fields shallowly, each bound to its own use."""

from __future__ import annotations

import threading

import pytest

from tasks_app.mcp.errors import InvalidParams
from tasks_app.mcp.registry import validate
from tasks_app.mcp.serializers import PromptsGetParams, TaskParams, ToolsCallParams


def test_each_use_gets_its_own_bound_fields() -> None:
    first, second = ToolsCallParams(data={}), ToolsCallParams(data={})

    for name in ("name", "arguments"):
        assert first.fields[name] is not second.fields[name]
        assert first.fields[name].parent is first
        assert second.fields[name].parent is second
        assert ToolsCallParams._declared_fields[name].parent is None  # never bound itself


def test_a_field_with_a_child_is_copied_whole() -> None:
    first, second = PromptsGetParams(data={}), PromptsGetParams(data={})

    assert first.fields["arguments"].child is not second.fields["arguments"].child
    assert first.fields["arguments"].child.parent is first.fields["arguments"]


def test_validation_is_unchanged() -> None:
    assert validate(ToolsCallParams, {"name": "echo", "arguments": None}) == {
        "name": "echo",
        "arguments": {},
    }
    with pytest.raises(InvalidParams, match=r"params\.name: Must be a string, not a number"):
        validate(ToolsCallParams, {"name": 7})
    with pytest.raises(InvalidParams, match=r"params\.arguments\.x"):
        validate(PromptsGetParams, {"name": "p", "arguments": {"x": 1}})


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
