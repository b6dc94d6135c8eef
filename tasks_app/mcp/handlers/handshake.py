"""The methods of the 2025-11-25 handshake wire (``handshake_methods``).

The lists, ``prompts/get``, ``resources/read`` and ``completion/complete`` are the 2026
functions themselves (``share``); the era shapes their results. What differs gets its own
function here, over the same store and the same helpers:

- ``tools/list`` marks each tool's ``execution.taskSupport`` (the tool's own ``task``
  declaration, which the 2026 wire applies as server policy);
- ``tools/call`` with ``params.task`` accepts a task through the same ``accept`` (same
  idempotency keys, scope and replay marker) and answers ``{task: {...}}``; without it, the
  2026 synchronous path runs. ``forbidden`` with a task, or ``required`` without one, is
  -32601 (basic/utilities/tasks.mdx, "Tool-Level Negotiation");
- ``tasks/get`` (the task, never its result), blocking ``tasks/result``, ``tasks/list``
  (cursor-paginated, the caller's tasks only) and ``tasks/cancel`` (-32602 on a terminal
  task; otherwise the task is ``cancelled`` before the answer).

A task belongs to its client, not to the session, and either era reads it.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.conf import settings
from django.core.cache import cache

from elicitations.models import InputRequest, Mode
from elicitations.selectors import pending_for_client
from tasks_app import selectors, sessions, transitions
from tasks_app.mcp import catalog, limits, stream_slots, wire
from tasks_app.mcp.auth import PollThrottle
from tasks_app.mcp.envelope import Envelope
from tasks_app.mcp.errors import InternalError, InvalidParams, MethodNotFound, task_failed

# discovery, prompts and resources register the methods shared below.
from tasks_app.mcp.handlers import discovery, prompts, resources, tasks, tools  # noqa: F401
from tasks_app.mcp.methods import handshake_methods, methods
from tasks_app.mcp.params import (
    HandshakeToolsCallParams,
    ListParams,
    ResourcesReadParams,
    SetLevelParams,
    TaskParams,
)
from tasks_app.mcp.registry import Call
from tasks_app.mcp.streaming import Emit, EndStream, Streamed, Tagged, release_connections
from tasks_app.models import Actor, Client, Era, Status, Task
from tasks_app.tools import ToolSpec

log = logging.getLogger("tasks_app.mcp")

QUESTION_ID_PREFIX = "taskdesk-q:"
RESUME_PREFIX = "r."
TASKS_PAGE = 50

handshake_methods.share(
    methods,
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "completion/complete",
)


def pause(seconds: float) -> None:
    """Sleep without holding a database connection: a waiting request gives its connection
    back (it opens a new one for its next read). Inside a transaction it keeps it."""
    release_connections()
    time.sleep(seconds)


@handshake_methods.method("ping")
def ping(call: Call) -> dict[str, Any]:
    return {}


@handshake_methods.method("logging/setLevel", params=SetLevelParams)
def set_level(call: Call) -> dict[str, Any]:
    assert call.session is not None
    sessions.set_log_level(call.session, call.data["level"])
    return {}


# Resources never change while the server runs, so a subscription has nothing to report.
@handshake_methods.method("resources/subscribe", params=ResourcesReadParams)
def subscribe(call: Call) -> dict[str, Any]:
    return {}


@handshake_methods.method("resources/unsubscribe", params=ResourcesReadParams)
def unsubscribe(call: Call) -> dict[str, Any]:
    return {}


@handshake_methods.method("tools/list", params=ListParams)
def tools_list(call: Call) -> dict[str, Any]:
    return {"tools": discovery.allowed(call, catalog.current().tools_wire_handshake)}


@handshake_methods.method("tools/call", params=HandshakeToolsCallParams)
def tools_call(call: Call) -> dict[str, Any] | Streamed:
    name = call.data["name"]
    tool = tools.tool_for(call, name)
    arguments = call.data["arguments"]
    if call.data.get("task") is not None:
        if tool.task == "forbidden":
            raise MethodNotFound(
                f"Tool {name!r} does not run as a task (execution.taskSupport is "
                '"forbidden"): call it without params.task'
            )
        limits.check_call_rate(call.client.pk)
        receipt = tools.accept(call, tool, arguments)
        return wire.create_task_result(receipt.task, wire.receipt_meta(receipt), era=Era.LEGACY)
    if tool.task == "required":
        raise MethodNotFound(
            f'Tool {name!r} runs only as a task (execution.taskSupport is "required"): '
            'send params.task, e.g. {"task": {}}'
        )
    if tool.task == "optional" and not tool.escalate and tools.awaits_task(call, tool, arguments):
        limits.check_call_rate(call.client.pk)
        return _awaited_call(call, tool, arguments)
    answer: dict[str, Any] | Streamed = tools.tools_call(call)
    return answer


def _awaited_call(call: Call, tool: ToolSpec, arguments: dict[str, Any]) -> Streamed:
    """A synchronous call that runs as a durable task (keyed, or a ``durable_sync`` tool):
    the answer waits for the task on a stream that starts with an event id. The stream is
    held for the tool's ``stream_seconds`` (else ``TASKDESK_STREAM_SECONDS``) and then
    closed; the client resumes it by GET with ``Last-Event-ID`` and gets the call's response
    there (2025-11-25 basic/transports.mdx, "Resumability and Redelivery"; SEP-1699)."""
    # The wait holds a synchronous slot, as a run here does; it is taken first, so that a
    # refusal (429 busy) has written nothing.
    release = limits.sync_slots.take(client=call.client.pk)
    try:
        receipt = tools.accept(call, tool, arguments)
    except BaseException:
        release()
        raise
    meta = {tools.TASK_ID_META: receipt.task.pk, **wire.receipt_meta(receipt)}
    return result_stream(
        call.envelope,
        receipt.task.pk,
        call.id,
        release=release,
        hold=tool.stream_seconds,
        meta=meta,
        session_id=_session_id(call),
    )


# --- tasks ---------------------------------------------------------------------------------


def _task(call: Call) -> Task:
    task_id = call.data["taskId"]
    try:
        return selectors.task_get_for_client(client=call.client, task_id=task_id)
    except selectors.TaskNotFound:
        raise InvalidParams(f"Task {task_id} not found", data={"taskId": task_id}) from None


@handshake_methods.method("tasks/get", params=TaskParams)
def tasks_get(call: Call) -> dict[str, Any]:
    task = _task(call)
    throttle = PollThrottle(task.pk)
    if not throttle.allows(call.request, call.view):
        raise limits.poll_rate(throttle.wait())
    return wire.task_fields(task, Era.LEGACY)


@handshake_methods.method("tasks/list", params=ListParams)
def tasks_list(call: Call) -> dict[str, Any]:
    text = call.data.get("cursor") or ""
    cursor = None
    if text:
        cursor = selectors.Cursor.decode(text)
        if cursor is None or not cursor.older:
            raise InvalidParams(f"Invalid cursor: {text!r}", data={"cursor": text})
    page, following = selectors.task_page_for_client(
        client=call.client, cursor=cursor, limit=TASKS_PAGE
    )
    out: dict[str, Any] = {"tasks": [wire.task_fields(t, Era.LEGACY) for t in page]}
    if following is not None:
        out["nextCursor"] = following.encode()
    return out


@handshake_methods.method("tasks/cancel", params=TaskParams)
def tasks_cancel(call: Call) -> dict[str, Any]:
    task = _task(call)
    if task.is_terminal:
        status = wire.status_in(task, Era.LEGACY)
        raise InvalidParams(
            f"Cannot cancel task in terminal status: {status}",
            data={"taskId": task.pk, "status": status},
        )
    # The task must be cancelled before the answer (tasks.mdx, "Task Cancellation"): a leg
    # that is running stops at its next checkpoint, so wait for it, within a bound. The wait
    # holds a request thread: it takes a synchronous slot first, so that a refusal (429
    # busy) has written nothing.
    with limits.sync_slots.held("tasks/cancel waits and synchronous calls", call.client.pk):
        transitions.request_cancel(task_id=task.pk, actor_type=Actor.CLIENT, actor=call.client.name)
        seconds = settings.TASKDESK_CANCEL_WAIT_SECONDS
        task = selectors.wait_for_outcome(task.pk, seconds, sleep=pause)
        return wire.task_fields(task, Era.LEGACY)


def final_result(task: Task) -> dict[str, Any]:
    """What the call would have returned: the CallToolResult, or its JSON-RPC error."""
    if task.status == Status.COMPLETED:
        return wire.task_result(task)
    related = wire.related_task(task.pk)
    if task.status == Status.FAILED:
        raise task_failed(task, related, "The task failed")
    raise InternalError(f"Task {task.pk} was cancelled before it finished", data=related)


@handshake_methods.method("tasks/result", params=TaskParams)
def tasks_result(call: Call) -> dict[str, Any] | Streamed:
    task = _task(call)
    if task.is_terminal:
        return final_result(task)
    return result_stream(
        call.envelope, task.pk, call.id, session_id=_session_id(call), client=call.client.pk
    )


def _session_id(call: Call) -> str | None:
    return call.session.pk if call.session is not None else None


def result_stream(
    envelope: Envelope,
    task_id: str,
    request_id: str | int,
    *,
    release: Callable[[], None] | None = None,
    hold: float | None = None,
    meta: dict[str, Any] | None = None,
    session_id: str | None = None,
    client: int | None = None,
    seen: frozenset[str] = frozenset(),
) -> Streamed:
    """The blocking wait for a task's outcome as a stream, holding one stream slot of the
    process and of CLIENT (429 ``busy`` when none is free), or the slot RELEASE gives back.
    After HOLD seconds (default ``TASKDESK_STREAM_SECONDS``) it closes without the answer;
    its event ids let the client resume it by GET with ``Last-Event-ID`` (``resume_id``).
    META joins the result's. The wait ends without an answer once the client cancels
    REQUEST_ID in session SESSION_ID. SEEN: the questions a resumed stream had sent before
    the client's last event id."""
    if release is None:
        release = stream_slots.take(client).close
    seconds = settings.TASKDESK_STREAM_SECONDS if hold is None else hold

    def run(emit: Emit, cancelled: threading.Event) -> dict[str, Any]:
        _result_stream(task_id, +1)
        try:
            withdrawn = (
                sessions.cancel_check(session_id=session_id, request_id=request_id)
                if session_id is not None
                else None
            )
            asker = _Asker(envelope, task_id, request_id, session_id, emit, set(seen))
            result = _wait_for_result(task_id, asker, cancelled, seconds, withdrawn)
        finally:
            _result_stream(task_id, -1)
            release()  # before the answer is sent (the stream calls it again: a no-op)
        if meta:
            result["_meta"] = {**result.get("_meta", {}), **meta}
        return result

    return Streamed(run, resume_id=resume_id(task_id, request_id, seen), release=release)


def resume_id(task_id: str, request_id: str | int, asked: Collection[str] = ()) -> str:
    """An event id of a tasks/result stream: the task, the request it answers and the keys
    of the questions the stream had sent up to that event. Resuming with it only ever reads
    the caller's own task, so it needs no secret."""
    fields: list[Any] = [task_id, request_id]
    if asked:
        fields.append(sorted(asked))
    raw = json.dumps(fields, separators=(",", ":")).encode()
    return RESUME_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


class Resume(NamedTuple):
    task_id: str
    request_id: str | int
    asked: frozenset[str]


def parse_resume_id(text: str) -> Resume | None:
    if not text.startswith(RESUME_PREFIX):
        return None
    body = text[len(RESUME_PREFIX) :]
    try:
        fields = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (ValueError, TypeError, binascii.Error):
        return None
    if not isinstance(fields, list) or len(fields) not in (2, 3):
        return None
    task_id, request_id, *rest = fields
    asked = rest[0] if rest else []
    if not isinstance(task_id, str) or isinstance(request_id, bool):
        return None
    if not isinstance(request_id, str | int):
        return None
    if not isinstance(asked, list) or not all(isinstance(key, str) for key in asked):
        return None
    return Resume(task_id, request_id, frozenset(asked))


@dataclass
class _Asker:
    """Sends a tasks/result stream's pending questions as ``elicitation/create``, each with
    an event id that names every question the stream has sent so far.

    A question goes to a session once, whichever of its streams finds it first (this one,
    another tasks/result stream, or the session's GET stream, in any web process): the
    shared cache marks it asked (``may_ask``). A stream resumed from an event before one of
    its own questions sends that question again: the client has not seen it."""

    envelope: Envelope
    task_id: str
    request_id: str | int
    session_id: str | None
    emit: Emit
    # The questions sent before the client's Last-Event-ID (a resumed stream), then these too.
    sent: set[str]

    @property
    def stream(self) -> str:
        return f"result:{json.dumps(self.request_id)}"

    def __call__(self, task: Task) -> None:
        if task.status != Status.INPUT_REQUIRED:
            return
        for question in pending_for_client([task.pk]).get(task.pk, []):
            if question.key in self.sent or not asks_client(self.envelope, question):
                continue
            self.sent.add(question.key)  # considered once, sent or not
            if not may_ask(self.session_id, task.pk, question.key, stream=self.stream):
                continue
            event_id = resume_id(self.task_id, self.request_id, self.sent)
            self.emit(Tagged(question_request(task, question), event_id))


def _wait_for_result(
    task_id: str,
    ask: _Asker,
    cancelled: threading.Event,
    seconds: float,
    withdrawn: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """Block until the task is terminal, for at most SECONDS or until WITHDRAWN (then end
    the stream). While it waits for a client's answer, ASK sends its pending questions."""

    def stop() -> bool:
        return cancelled.is_set() or (withdrawn is not None and withdrawn())

    if cancelled.is_set():
        raise InternalError("The client closed the stream")
    try:
        task = selectors.wait_for_outcome(task_id, seconds, stop=stop, each=ask, sleep=pause)
    except selectors.TaskNotFound:
        raise InvalidParams(f"Task {task_id} not found", data={"taskId": task_id}) from None
    if task.is_terminal:
        return final_result(task)
    if cancelled.is_set():
        raise InternalError("The client closed the stream")
    raise EndStream()


def task_of_client(client: Client, task_id: str) -> Task | None:
    try:
        return selectors.task_get_for_client(client=client, task_id=task_id)
    except selectors.TaskNotFound:
        return None


def asks_client(envelope: Envelope, question: InputRequest) -> bool:
    """Whether the session's client declared the elicitation mode QUESTION needs."""
    return envelope.declares("elicitation/create", question.mode)


# Tasks whose questions a pending tasks/result of this process delivers; the session's GET
# stream leaves those to it.
_result_streams: dict[str, int] = {}
_result_lock = threading.Lock()


def result_stream_open(task_id: str) -> bool:
    return task_id in _result_streams


def _result_stream(task_id: str, delta: int) -> None:
    with _result_lock:
        left = _result_streams.get(task_id, 0) + delta
        if left > 0:
            _result_streams[task_id] = left
        else:
            _result_streams.pop(task_id, None)


# How long a session's mark of a question it was sent lasts (``may_ask``): longer than a
# question waits in practice; the mark is a few bytes.
ASKED_SECONDS = 24 * 3600
GET_STREAM = "get"


def may_ask(session_id: str | None, task_id: str, key: str, *, stream: str) -> bool:
    """Whether STREAM (``GET_STREAM``, or a tasks/result stream's name) may send question
    KEY of TASK_ID to SESSION_ID: no stream of the session sent it yet, or this tasks/result
    stream did and was resumed from before it (the client has not seen it). Marks it sent.
    Without a working cache the answer is yes: a question asked twice is answered once (the
    first answer wins), a question never asked leaves the task waiting."""
    if session_id is None:
        return True
    mark = f"asked:{session_id}:{task_id}:{key}"
    try:
        if cache.add(mark, stream, ASKED_SECONDS):
            return True
        return stream != GET_STREAM and cache.get(mark) == stream
    except Exception as exc:  # any cache backend's failure (Redis, database)
        log.warning("question %s of task %s not marked asked: %s", key, task_id, exc)
        return True


def question_request(task: Task, question: InputRequest) -> dict[str, Any]:
    """QUESTION as the 2025 server-to-client ``elicitation/create`` request, tagged with its
    task; its id names the task and the question, so the answer finds them."""
    body = wire.input_request(question)
    params = {**body["params"], "_meta": wire.related_task(task.pk)}
    if question.mode == Mode.URL:
        params["elicitationId"] = f"{task.pk}:{question.key}"
    return {
        "jsonrpc": "2.0",
        "id": f"{QUESTION_ID_PREFIX}{task.pk}:{question.key}",
        "method": "elicitation/create",
        "params": params,
    }
