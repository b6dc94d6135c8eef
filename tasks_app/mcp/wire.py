"""Task rows as the tasks extension (SEP-2663, 2026-07-28) shows them on the wire."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from elicitations.models import InputRequest, Mode
from tasks_app.acceptance import Receipt
from tasks_app.models import Status, Task

RESULT_TYPE = "resultType"
REPLAYED_META = "dev.taskdesk/replayed"


def timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def task_fields(task: Task) -> dict[str, Any]:
    out: dict[str, Any] = {
        "taskId": task.pk,
        "status": task.status,
        "createdAt": timestamp(task.created_at),
        "lastUpdatedAt": timestamp(task.updated_at),
        # Required, null meaning unlimited (ext-tasks specification/2026-07-28/tasks.md, "Task").
        "ttlMs": task.ttl_ms,
        "pollIntervalMs": task.poll_interval_ms,
    }
    if task.status_message:
        out["statusMessage"] = task.status_message
    return out


def create_task_result(task: Task, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The flat ``CreateTaskResult`` (``Result & Task``): no result, error or inputRequests."""
    out = {RESULT_TYPE: "task", **task_fields(task)}
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
    if isinstance(meta, dict) and "io.modelcontextprotocol/related-task" in meta:
        meta = {k: v for k, v in meta.items() if k != "io.modelcontextprotocol/related-task"}
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
