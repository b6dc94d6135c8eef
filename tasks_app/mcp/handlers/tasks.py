"""``tasks/get``, ``tasks/update`` and ``tasks/cancel`` of the tasks extension (SEP-2663).

Each checks that its own request declares the extension before it looks the task up, so a
non-declaring client learns nothing about which ids exist (-32021 first, then -32602). A task
of another client answers exactly like an unknown one. Their ``Mcp-Name`` header is a routing
hint: one that disagrees with ``params.taskId`` is refused, a missing one is not
(``name_required=False``; see ``tasks_app.mcp.modern``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import transaction

from elicitations import transitions as elicitation_transitions
from elicitations.models import Channel, InputRequest
from elicitations.selectors import keys_asked, pending_for_client
from tasks_app import logcontext, selectors, transitions
from tasks_app.mcp import limits, wire
from tasks_app.mcp.auth import PollThrottle
from tasks_app.mcp.errors import InvalidParams, tasks_extension_required
from tasks_app.mcp.methods import methods
from tasks_app.mcp.params import TaskParams, TasksUpdateParams
from tasks_app.mcp.registry import Call
from tasks_app.models import Actor, Status, Task


def _task(call: Call) -> Task:
    if not call.envelope.declares_tasks:
        raise tasks_extension_required(call.method)
    task_id = call.data["taskId"]
    logcontext.update(task_id=task_id)
    try:
        return selectors.task_get_for_client(client=call.client, task_id=task_id)
    except selectors.TaskNotFound:
        raise InvalidParams(f"Task {task_id} not found", data={"taskId": task_id}) from None


@methods.method("tasks/get", params=TaskParams, name_param="taskId", name_required=False)
def tasks_get(call: Call) -> dict[str, Any]:
    task = _task(call)
    throttle = PollThrottle(task.pk)  # counted per client and task, in the shared cache
    if not throttle.allows(call.request, call.view):
        raise limits.poll_rate(throttle.wait())
    return task_as_got(task)


def task_as_got(task: Task) -> dict[str, Any]:
    """TASK as ``tasks/get`` returns it (also the ``data`` of its webhooks)."""
    pending = pending_for_client([task.pk]) if task.status == Status.INPUT_REQUIRED else {}
    return detailed(task, pending)


def detailed(task: Task, pending: Mapping[str, Sequence[InputRequest]]) -> dict[str, Any]:
    """The ``tasks/get`` body of TASK (``DetailedTask``), its requests taken from PENDING
    (``elicitations.selectors.pending_for_client``): also the params of a ``notifications/tasks``."""
    requests = pending.get(task.pk, ()) if task.status == Status.INPUT_REQUIRED else ()
    return wire.detailed_task(task, requests)


@methods.method("tasks/update", params=TasksUpdateParams, name_param="taskId", name_required=False)
def tasks_update(call: Call) -> dict[str, Any]:
    task = _task(call)
    # Unknown, already answered or invalid keys are ignored (the ack promises nothing); the
    # elicitations app records each outcome on the task's timeline, and the task resumes
    # once nothing is pending. At most TASKDESK_MAX_INPUT_RESPONSES keys (params.py), all in
    # one transaction; keys the task never asked are dropped with one query, not one lock each.
    responses = call.data["inputResponses"]
    if not responses:
        return {}
    with transaction.atomic():
        asked = keys_asked(task_id=task.pk, keys=responses)
        for key, response in responses.items():
            if key in asked:
                elicitation_transitions.answer(
                    task=task,
                    key=key,
                    response=response,
                    channel=Channel.TASKS_UPDATE,
                    client=call.client,
                )
    return {}


@methods.method("tasks/cancel", params=TaskParams, name_param="taskId", name_required=False)
def tasks_cancel(call: Call) -> dict[str, Any]:
    task = _task(call)
    # Acked for a terminal task too (it stays as it is): cancellation is cooperative.
    transitions.request_cancel(task_id=task.pk, actor_type=Actor.CLIENT, actor=call.client.name)
    return {}
