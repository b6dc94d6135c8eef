"""Helpers of the worker tests: tasks submitted through acceptance and what their legs did.

Starting, waiting for and killing processes is in ``tests.live``.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tasks_app import acceptance
from tasks_app.models import Client, Era, Task
from tasks_app.tools import get_tool
from tests.live import LiveStack, kept_stack, live_stack, wait_for
from tests.runtime_toolset import RUNTIME_TOOLSETS


@contextlib.contextmanager
def runtime_stack(settings: Any, *, kept: bool = False, **env: str) -> Iterator[LiveStack]:
    """A live stack whose processes, and this test process, enable the runtime test tools;
    ENV overrides more of its processes' environment. KEPT: one that later tests may reuse
    (``tests.live.kept_stack``)."""
    settings.TASKDESK_TOOLSETS = RUNTIME_TOOLSETS
    start = kept_stack if kept else live_stack
    with start(env={"TASKDESK_TOOLSETS": ",".join(RUNTIME_TOOLSETS), **env}) as running:
        yield running


def submit(client: Client, tool: str, **arguments: Any) -> Task:
    """Accept a call as the MCP handlers do (committed, dispatched), with a fresh key."""
    spec = get_tool(tool)
    assert spec is not None, tool
    receipt = acceptance.accept(
        client=client,
        tool=spec,
        arguments=arguments,
        era=Era.MODERN,
        key=acceptance.IdempotencyKey(f"test-{uuid.uuid4().hex}", "header"),
    )
    return receipt.task


def terminal(task: Task, timeout: float = 60) -> Task:
    def check() -> Task | None:
        task.refresh_from_db()
        return task if task.is_terminal else None

    return wait_for(f"task {task.pk} ({task.tool_name}) to end", check, timeout)


def leg_pid(task: Task) -> int | None:
    """The process id of the leg holding TASK's lease (owner = host:pid:suffix)."""
    owner = Task.objects.filter(pk=task.pk).values_list("lease_owner", flat=True).first()
    return int(owner.split(":")[1]) if owner else None


def export_writes(stack: LiveStack, task: Task) -> list[dict[str, Any]]:
    """Lines of the export folder's write log for TASK (one per export renamed into place)."""
    log = Path(stack.env["TASKDESK_EXPORT_DIR"]) / "writes.log"
    if not log.exists():
        return []
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return [line for line in lines if line["task"] == task.pk]


def describe(tasks: list[Task]) -> str:
    """What each unfinished task is doing: for the failure message of a timed-out wait."""
    lines = []
    for task in Task.objects.filter(pk__in=[t.pk for t in tasks]).exclude(
        status__in=["completed", "failed", "cancelled"]
    ):
        kinds = list(task.events.order_by("created_at", "id").values_list("kind", flat=True))
        records = list(task.dispatches.values_list("reason", "published_at", "consumed_at"))
        lines.append(
            f"{task.pk} {task.tool_name} {task.status} leg={task.leg} "
            f"lease={task.lease_owner or '-'} until={task.lease_expires_at} "
            f"message={task.status_message[:80]!r} events={kinds} dispatches={records}"
        )
    return "\n".join(lines)
