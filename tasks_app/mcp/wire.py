"""Task rows on the wire: as the tasks extension (SEP-2663, 2026-07-28) shows them, and as
the 2025-11-25 experimental tasks (SEP-1686) do. The shapes differ in field names
(``ttlMs`` / ``ttl``), nesting (flat / ``{task: ...}``) and in what a tool error is
(``completed`` with ``isError`` / ``failed``); each builder takes the era."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from elicitations.models import InputRequest, Mode
from tasks_app.acceptance import Receipt
from tasks_app.models import Era, Status, Task

RESULT_TYPE = "resultType"
REPLAYED_META = "dev.taskdesk/replayed"
RELATED_TASK_META = "io.modelcontextprotocol/related-task"


def timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def status_in(task: Task, era: str) -> str:
    """TASK's status as ERA names it: 2025-11-25 reports a tool error (a result with
    ``isError``) as ``failed`` (basic/utilities/tasks.mdx, "Tool errors"); 2026-07-28 as
    ``completed``."""
    if (
        era == Era.LEGACY
        and task.status == Status.COMPLETED
        and isinstance(task.result, dict)
        and task.result.get("isError") is True
    ):
        return Status.FAILED
    return str(task.status)


def task_fields(task: Task, era: str = Era.MODERN) -> dict[str, Any]:
    out: dict[str, Any] = {
        "taskId": task.pk,
        "status": status_in(task, era),
        "createdAt": timestamp(task.created_at),
        "lastUpdatedAt": timestamp(task.updated_at),
    }
    if era == Era.LEGACY:
        # 2025-11-25 Task: ttl (ms, null = unlimited) and pollInterval (ms).
        out["ttl"] = task.ttl_ms
        out["pollInterval"] = task.poll_interval_ms
    else:
        # Required, null meaning unlimited (ext-tasks specification/2026-07-28/tasks.md, "Task").
        out["ttlMs"] = task.ttl_ms
        out["pollIntervalMs"] = task.poll_interval_ms
    if task.status_message:
        out["statusMessage"] = task.status_message
    return out


def create_task_result(
    task: Task, meta: dict[str, Any] | None = None, era: str = Era.MODERN
) -> dict[str, Any]:
    """The ``CreateTaskResult``: flat (``Result & Task``) in 2026-07-28, ``{task: Task}`` in
    2025-11-25; never a result, error or inputRequests."""
    out: dict[str, Any]
    if era == Era.LEGACY:
        out = {"task": task_fields(task, era)}
    else:
        out = {RESULT_TYPE: "task", **task_fields(task, era)}
    if meta:
        out["_meta"] = meta
    return out


def receipt_meta(receipt: Receipt) -> dict[str, Any]:
    """The ``_meta`` entries of a receipt: keyed receipts say whether they are a replay."""
    if receipt.key is None:
        return {}
    return {REPLAYED_META: receipt.replayed}


def input_request(request: InputRequest) -> dict[str, Any]:
    params: dict[str, Any] = {"mode": request.mode, "message": request.message}
    if request.mode == Mode.URL:
        params["url"] = request.url
    else:
        # form_schema: the properties in the order the tool asked them (jsonb reorders keys).
        params["requestedSchema"] = request.form_schema or {"type": "object", "properties": {}}
    return {"method": "elicitation/create", "params": params}


def call_tool_result(stored: dict[str, Any] | None) -> dict[str, Any]:
    """A stored CallToolResult as ``tasks/get`` inlines it: exactly what the call would have
    returned, with ``resultType`` and without 2025-era related-task metadata."""
    result = dict(stored or {"content": [], "isError": False})
    meta = result.get("_meta")
    if isinstance(meta, dict) and RELATED_TASK_META in meta:
        meta = {k: v for k, v in meta.items() if k != RELATED_TASK_META}
        if meta:
            result["_meta"] = meta
        else:
            del result["_meta"]
    result[RESULT_TYPE] = "complete"
    return result


def detailed_task(task: Task, requests: Sequence[InputRequest] = ()) -> dict[str, Any]:
    """The ``tasks/get`` result: the task plus the field its status calls for."""
    out = {RESULT_TYPE: "complete", **task_fields(task)}
    if task.status == Status.COMPLETED:
        out["result"] = call_tool_result(task.result)
    elif task.status == Status.FAILED:
        out["error"] = task.error or {"code": -32603, "message": task.status_message or "failed"}
    elif task.status == Status.INPUT_REQUIRED:
        out["inputRequests"] = {r.key: input_request(r) for r in requests}
    return out


def related_task(task_id: str) -> dict[str, Any]:
    """The 2025-11-25 ``_meta`` entry tying a message to its task."""
    return {RELATED_TASK_META: {"taskId": task_id}}


def task_result(task: Task) -> dict[str, Any]:
    """The 2025-11-25 ``tasks/result`` of a completed task: exactly the tool's
    CallToolResult, with the related-task ``_meta``."""
    result = dict(task.result or {"content": [], "isError": False})
    result.pop(RESULT_TYPE, None)
    meta = result.get("_meta")
    result["_meta"] = {**(meta if isinstance(meta, dict) else {}), **related_task(task.pk)}
    return result
