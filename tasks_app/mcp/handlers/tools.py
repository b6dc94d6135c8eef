"""``tools/call``: run synchronously, or accept a durable task and hand back its receipt.

The decision is made per request, from that request's own ``_meta`` (SEP-2663, "Task
Creation": a server MUST NOT return a CreateTaskResult unless the request declares the
extension, regardless of earlier requests). The 2025-11-25 wire calls this function for a
call without ``params.task``; its envelope holds the session's ``initialize`` capabilities,
which never declare the extension (``Envelope.declares_tasks``), so such a call runs:

- ``forbidden`` tools run here; an idempotency key is not applied (and the result says so);
- tools declared ``escalate=True`` run here first (MRTR rounds) and become a task when the
  function calls ``ctx.escalate()``, carrying the answers collected so far;
- with the extension, ``optional`` and ``required`` tools become tasks (CreateTaskResult);
- without it, ``required`` tools are refused with -32021; ``optional`` tools run here, except
  that a keyed call (or a tool that requires a key or is declared ``durable_sync``) becomes a
  durable task whose outcome is awaited, so a retry with the same key answers from the same
  task.

A run here, and the wait for a keyed task, holds one of the process's synchronous slots
(``limits``; none free: 429 ``busy``). A run here is stopped at a checkpoint after
``TASKDESK_SYNC_MAX_SECONDS``: an ``escalate`` tool called with the extension becomes a task
there, anything else answers -32000 ``sync_time_limit`` saying how to run it as a task.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings

from tasks_app import acceptance, logcontext, selectors
from tasks_app.mcp import catalog, keys, limits, mrtr, wire
from tasks_app.mcp.errors import (
    InternalError,
    InvalidParams,
    from_code,
    is_outage,
    task_failed,
    tasks_extension_required,
)
from tasks_app.mcp.handlers import running
from tasks_app.mcp.headers import check_param_headers
from tasks_app.mcp.methods import methods
from tasks_app.mcp.params import ToolsCallParams
from tasks_app.mcp.registry import Call
from tasks_app.mcp.streaming import Streamed
from tasks_app.mcp.sync import Escalate, NeedInput, SyncContext, TimeUp
from tasks_app.models import NO_TASKS, Era, Status, Task
from tasks_app.oauth.access import Access
from tasks_app.tools import Cancelled, InvalidArguments, ProtocolError, ToolError, ToolSpec
from tasks_app.tools.results import (
    error_result,
    new_reference,
    text,
    to_call_tool_result,
    unexpected_error_result,
)

log = logging.getLogger("tasks_app.mcp")

IDEMPOTENCY_META = "dev.taskdesk/idempotency"
TASK_ID_META = "dev.taskdesk/taskId"
# What a client over its active-task limit is told to wait before it tries again.
ACTIVE_LIMIT_RETRY_SECONDS = 10


def tool_for(call: Call, name: str) -> ToolSpec:
    """The tool NAME, if the caller may call it. A tool outside the client's allowed tools
    (``Client.allowed_tools``, or the token's own) answers exactly as an unknown one: the
    tool is not in the caller's ``tools/list`` either, and asking for another scope would
    not help (the MCP tools specification's "Unknown tools", -32602)."""
    tool = catalog.current().tools.get(name)
    if tool is None or not call.access.may_call(name):
        raise InvalidParams(f"Unknown tool: {name}", data={"name": name})
    return tool


@methods.method("tools/call", params=ToolsCallParams, name_param="name")
def tools_call(call: Call) -> dict[str, Any] | Streamed:
    limits.check_call_rate(call.client.pk)
    name = call.data["name"]
    logcontext.update(tool=name if name in catalog.current().tools else None)
    tool = tool_for(call, name)
    arguments: dict[str, Any] = call.data["arguments"]
    mirrored = catalog.current().mirrored_arguments.get(name)
    if mirrored and call.era == Era.MODERN:  # Mcp-Param-* headers are 2026-07-28 (SEP-2243)
        check_param_headers(call.request, mirrored, arguments)
    with_tasks = call.envelope.declares_tasks
    if tool.task == "required" and not with_tasks:
        raise tasks_extension_required(f"Tool {name!r}")
    if tool.task == "forbidden" or tool.escalate:
        return _run_here(call, tool, arguments, can_escalate=tool.escalate and with_tasks)
    if with_tasks:
        receipt = accept(call, tool, arguments)
        return wire.create_task_result(receipt.task, wire.receipt_meta(receipt))
    if awaits_task(call, tool, arguments):
        # The wait holds a request thread as a synchronous run does: it takes a slot first,
        # so a refusal (busy) has written nothing.
        with limits.sync_slots.held(client=call.client.pk):
            return _await(accept(call, tool, arguments), call)
    return _run_here(call, tool, arguments)


def awaits_task(call: Call, tool: ToolSpec, arguments: dict[str, Any]) -> bool:
    """Whether a synchronous call of an ``optional`` TOOL runs as a durable task that the
    request waits for: the tool asks for it, needs a key, or the call sends one."""
    return tool.durable_sync or tool.requires_idempotency_key or _keyed(call, tool, arguments)


def _keyed(call: Call, tool: ToolSpec, arguments: dict[str, Any]) -> bool:
    return keys.sent(
        tool=tool,
        arguments=arguments,
        header_key=call.header(keys.HEADER),
        meta_key=call.envelope.meta.get(keys.META_KEY),
    )


def accept(
    call: Call,
    tool: ToolSpec,
    arguments: dict[str, Any],
    journal: list[dict[str, Any]] | None = None,
) -> acceptance.Receipt:
    """Resolve the call's idempotency key from its carriers and accept the task: the one
    call into ``acceptance`` of a ``tools/call``."""
    try:
        receipt = keys.accept(
            client=call.client,
            tool=tool,
            arguments=arguments,
            era=call.era,
            header_key=call.header(keys.HEADER),
            meta_key=call.envelope.meta.get(keys.META_KEY),
            journal=journal,
            client_answers=client_answers(call),
            started_by=started_by(call),
        )
    except acceptance.ActiveTaskLimit as exc:
        raise limits.over_limit(
            "active_task_limit",
            exc.message,
            retry_after=ACTIVE_LIMIT_RETRY_SECONDS,
            limit=exc.limit,
        ) from None
    except acceptance.StorageQuota as exc:
        raise limits.over_limit(
            "storage_quota",
            exc.message,
            retry_after=settings.TASKDESK_STORED_BYTES_RECOUNT_SECONDS,
            limit=exc.limit,
            bytes=exc.stored,
        ) from None
    except acceptance.AcceptanceError as exc:
        raise from_code(exc.code, exc.message, exc.data) from None
    except InvalidArguments as exc:
        raise InvalidParams(str(exc)) from None
    logcontext.update(task_id=receipt.task.pk)
    return receipt


def started_by(call: Call) -> acceptance.StartedBy | None:
    """The OAuth app and person behind the call, for its task's record; None for a static
    client token (``Access.app`` is empty then), which records nothing more."""
    auth = call.request.auth
    if not isinstance(auth, Access) or not auth.app:
        return None
    return acceptance.StartedBy(
        app=auth.app, person_id=auth.person_id, person_name=auth.person_name, grant_id=auth.grant_id
    )


def client_answers(call: Call) -> str:
    """How the calling client can answer the task's questions (``Task.client_answers``): the
    elicitation modes its request (2026) or its session's ``initialize`` (2025) declared,
    and NO_TASKS for a 2026 call without the tasks extension (no ``tasks/update``)."""
    ways = [mode for mode in ("form", "url") if call.envelope.declares("elicitation/create", mode)]
    if call.era == Era.MODERN and not call.envelope.declares_tasks:
        ways.append(NO_TASKS)
    return " ".join(ways)


def _run_here(
    call: Call, tool: ToolSpec, arguments: dict[str, Any], *, can_escalate: bool = False
) -> dict[str, Any] | Streamed:
    try:
        normalized = tool.normalize_arguments(arguments)
    except InvalidArguments as exc:
        raise InvalidParams(str(exc)) from None
    not_applied = tool.task == "forbidden" and _keyed(call, tool, arguments)

    def body(ctx: SyncContext) -> dict[str, Any]:
        try:
            value = tool.invoke(ctx, normalized)
        except Escalate:
            receipt = accept(call, tool, arguments, journal=ctx.journal)
            return wire.create_task_result(receipt.task, wire.receipt_meta(receipt))
        except ToolError as exc:
            result = error_result(str(exc))
        except Cancelled:
            raise limits.cancelled() from None
        except TimeUp as exc:
            raise limits.time_up(
                exc.seconds,
                can_be_task=tool.task != "forbidden",
                handshake=call.era == Era.LEGACY,
                by_key=not tool.escalate,  # a keyed call of an escalating tool runs here too
            ) from None
        except (NeedInput, ProtocolError):
            raise  # the next MRTR round, or the tool's own JSON-RPC error (running.run)
        except Exception as exc:
            if is_outage(exc):
                raise  # 503, not the tool's failure
            reference = new_reference()
            log.exception("tool %s raised (reference %s)", tool.name, reference)
            result = unexpected_error_result(reference)
        else:
            result = to_call_tool_result(value)
        if not_applied:
            result["_meta"] = {**result.get("_meta", {}), IDEMPOTENCY_META: "not-applied"}
        return result

    return running.run(
        call,
        subject=f"tool:{tool.name}",
        arguments_fp=mrtr.arguments_digest(normalized),
        body=body,
        can_escalate=can_escalate,
    )


def _await(receipt: acceptance.Receipt, call: Call) -> dict[str, Any]:
    """Wait for a keyed task and answer with its outcome, as a synchronous call would (only
    until the client has gone: the task goes on either way)."""
    try:
        task = selectors.wait_for_outcome(
            receipt.task.pk,
            settings.TASKDESK_SYNC_WAIT_SECONDS,
            stop=limits.disconnected(call.request),
        )
    except selectors.TaskNotFound:
        raise InternalError(f"The job {receipt.task.pk} disappeared before it finished") from None
    meta = {TASK_ID_META: task.pk, **wire.receipt_meta(receipt)}
    if task.status == Status.FAILED:
        raise task_failed(task, {TASK_ID_META: task.pk}, "The job failed")
    if task.status == Status.COMPLETED:
        result = wire.call_tool_result(task.result)
    elif task.status == Status.CANCELLED:
        result = error_result(f"The job {task.pk} was cancelled before it finished.")
    else:
        result = _still_running(task)
    result["_meta"] = {**result.get("_meta", {}), **meta}
    return result


def _still_running(task: Task) -> dict[str, Any]:
    waiting = "is waiting for input" if task.status == Status.INPUT_REQUIRED else "is still running"
    return {
        "content": [
            text(
                f"The job {task.pk} {waiting} on the server and continues there. Call this "
                "tool again with the same idempotency key to get its outcome once it has "
                "finished; the retry does not start the job again."
            )
        ],
        "isError": True,
    }
