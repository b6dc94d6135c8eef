"""Shared helpers of the runtime tests: tasks created as acceptance would, and their legs."""

from __future__ import annotations

from typing import Any

from elicitations import transitions as elicitations
from elicitations.models import Channel, InputRequest, RequestStatus
from tasks_app import dispatch, runtime
from tasks_app.models import Client, Dispatch, Task
from tasks_app.tools import get_tool


def submit(client: Client, tool: str, **arguments: Any) -> Task:
    """A working task of CLIENT with one unpublished dispatch record, as acceptance makes."""
    spec = get_tool(tool)
    assert spec is not None, f"tool {tool} is not enabled"
    task = Task.objects.create(
        client=client, tool_name=tool, arguments=spec.normalize_arguments(arguments)
    )
    dispatch.enqueue(task, reason="accepted")
    return task


def next_dispatch(task: Task) -> int:
    """The newest dispatch record of TASK that no leg has consumed yet."""
    record = Dispatch.objects.filter(task=task, consumed_at__isnull=True).order_by("-pk").first()
    assert record is not None, f"task {task.pk} has no pending dispatch"
    return record.pk


def leg(task: Task) -> runtime.LegOutcome:
    """Run the leg the newest dispatch record of TASK asks for, and refresh TASK."""
    outcome = runtime.run_leg(task_id=task.pk, dispatch_id=next_dispatch(task))
    task.refresh_from_db()
    return outcome


def events(task: Task) -> list[str]:
    return list(task.events.order_by("created_at", "id").values_list("kind", flat=True))


def pending(task: Task) -> list[InputRequest]:
    return list(task.input_requests.filter(status=RequestStatus.PENDING).order_by("id"))


def answer(task: Task, ask_key: str, response: dict[str, Any], **kwargs: Any) -> None:
    request = task.input_requests.get(ask_key=ask_key, status=RequestStatus.PENDING)
    kwargs.setdefault("channel", Channel.TASKS_UPDATE)
    outcome = elicitations.answer(task=task, key=request.key, response=response, **kwargs)
    assert outcome.recorded, outcome


def text_of(result: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in result["content"])
