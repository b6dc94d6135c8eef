"""JSON or Server-Sent Events: how one request's answer goes back.

A call that may emit notifications (the request sent a progress token or a log level) runs
in a worker thread, one per synchronous slot of the process (``limits``): never more threads
than slots. If the answer is ready before any notification, it goes back as plain
JSON; the first notification switches the response to ``text/event-stream``, scoped to that
one request: its notifications, then the final response (2026-07-28
basic/transports/streamable-http.mdx, "Sending Messages to the Server"). A call still
running after ``TASKDESK_KEEPALIVE_SECONDS`` switches to the stream too, and the stream
carries a keep-alive comment after every such quiet interval. On the 2026 wire the stream
never carries a server-to-client request; on the 2025 wire (``result_type=False``) it may.
Closing the stream cancels the call: the tool's next checkpoint raises ``Cancelled``.
"""

from __future__ import annotations

import contextvars
import json
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connections
from django.http import HttpResponse, StreamingHttpResponse

from tasks_app import logcontext
from tasks_app.mcp import limits
from tasks_app.mcp.errors import McpError

log = logging.getLogger("tasks_app.mcp")


@dataclass(frozen=True)
class Tagged:
    """A message sent with an event id: a client that resumes the stream from that id has
    seen it (2025-11-25 basic/transports.mdx, "Resumability and Redelivery")."""

    message: dict[str, Any]
    event_id: str


Emit = Callable[[dict[str, Any] | Tagged], None]


class EndStream(Exception):
    """Raised by a Streamed run to close its stream without an answer: the client resumes it
    (2025 transport: a stream that sent an event id may be closed and resumed by GET with
    ``Last-Event-ID``)."""


@dataclass(frozen=True)
class Streamed:
    """A result still to be computed by RUN(emit, cancelled), which may emit notifications.
    RELEASE (a slot of ``limits``) is called once the run has ended, whatever the outcome."""

    run: Callable[[Emit, threading.Event], dict[str, Any]]
    # An event id the stream starts with, when the client may resume it (2025 wire).
    resume_id: str | None = None
    release: Callable[[], None] | None = None


def priming_event(event_id: str, retry_ms: int) -> bytes:
    """An event with an id, a reconnection delay and no data: it makes the stream resumable
    from EVENT_ID (2025-11-25 basic/transports.mdx, "Resumability and Redelivery")."""
    return f"id: {event_id}\nretry: {retry_ms}\ndata: \n\n".encode()


def dumps(message: dict[str, Any]) -> bytes:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()


def success(request_id: Any, result: dict[str, Any], *, result_type: bool = True) -> dict[str, Any]:
    """The response carrying RESULT; ``resultType`` defaults to "complete" on the 2026 wire
    (RESULT_TYPE false: the 2025 wire, which has no such field)."""
    if result_type:
        result.setdefault("resultType", "complete")
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def failure(request_id: Any, error: McpError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": error.body()}


def json_response(
    message: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> HttpResponse:
    response = HttpResponse(dumps(message), status=status, content_type="application/json")
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def event_response(message: dict[str, Any]) -> HttpResponse:
    """MESSAGE as a one-event ``text/event-stream`` body, for a client that prefers streams
    (a complete response: no thread, no held connection)."""
    response = HttpResponse(
        b"event: message\ndata: " + dumps(message) + b"\n\n", content_type="text/event-stream"
    )
    response["Cache-Control"] = "no-cache"
    return response


def prefers_events(accept: str) -> bool:
    """Whether an ``Accept`` header lists ``text/event-stream`` before ``application/json``
    (the 2025 wire lets the server answer a POST either way; the order breaks the tie)."""
    for part in accept.split(","):
        media = part.split(";", 1)[0].strip().lower()
        if media == "text/event-stream":
            return True
        if media in ("application/json", "application/*", "*/*"):
            return False
    return False


def error_response(request_id: Any, error: McpError) -> HttpResponse:
    logcontext.update(code=error.code)  # for the request's log line and metrics
    return json_response(failure(request_id, error), error.http_status, error.headers())


def respond(
    request_id: Any,
    streamed: Streamed,
    *,
    result_type: bool = True,
    error_status: int | None = None,
    gone: Callable[[], bool] | None = None,
    prime: bytes = b"",
    stream_now: bool = False,
) -> HttpResponse | StreamingHttpResponse:
    """Run STREAMED in a thread and answer with JSON or an event stream. ERROR_STATUS, when
    given, is the HTTP status of an error answered as JSON (the 2025 wire: 200). GONE, when
    given, tells about once a second whether the client has gone (the call is cancelled).
    PRIME is sent first when the answer is a stream (an event id to resume from); STREAM_NOW
    makes it a stream whatever comes first (a resumed GET)."""
    events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    cancelled = threading.Event()
    keepalive = settings.TASKDESK_KEEPALIVE_SECONDS

    def work() -> None:
        last: tuple[str, Any]
        try:
            result = streamed.run(lambda note: events.put(("note", note)), cancelled)
            last = ("done", success(request_id, result, result_type=result_type))
        except EndStream:
            last = ("end", None)
        except Exception as exc:
            last = ("error", limits.error_for(exc))
        finally:
            # This thread's database connections are its own; leave none open. The slot is
            # free again before the answer goes out.
            connections.close_all()
            if streamed.release is not None:
                streamed.release()
        events.put(last)

    try:
        # In a copy of the request's log context, so its lines keep the request id.
        threading.Thread(
            target=contextvars.copy_context().run,
            args=(work,),
            name=f"mcp-call-{request_id}",
            daemon=True,
        ).start()
    except BaseException:
        if streamed.release is not None:
            streamed.release()
        raise
    try:
        kind, first = events.get(timeout=0 if stream_now else keepalive)
    except queue.Empty:
        kind, first = "ping", None
    if kind == "done" and not stream_now:
        return json_response(first)
    if kind == "error" and not stream_now:
        if error_status is not None:
            return json_response(failure(request_id, first), error_status, first.headers())
        return error_response(request_id, first)

    def stream() -> Iterator[bytes]:
        item: tuple[str, Any] = (kind, first)
        release_connections()  # the request thread only writes from here on
        try:
            if prime:
                yield prime
            while True:
                kind_, payload = item
                if kind_ == "end":
                    return
                if kind_ == "ping":
                    yield b": ping\n\n"
                else:
                    if kind_ == "error":
                        payload = failure(request_id, payload)
                    head = b""
                    if isinstance(payload, Tagged):
                        head = f"id: {payload.event_id}\n".encode()
                        payload = payload.message
                    yield head + b"event: message\ndata: " + dumps(payload) + b"\n\n"
                    if kind_ != "note":
                        return
                following = _next(events, keepalive, gone)
                if following is None:
                    return  # the client has gone
                item = following
        finally:
            cancelled.set()

    response = StreamingHttpResponse(stream(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def release_connections() -> None:
    """Close this thread's database connections: a request thread that goes on to hold a
    stream must not keep one open for as long as the stream lasts (Django would close it
    only when the response closes). The next query, if any, opens a new one."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


def _next(
    events: queue.SimpleQueue[tuple[str, Any]], keepalive: float, gone: Callable[[], bool] | None
) -> tuple[str, Any] | None:
    """The next event, a ("ping", None) after KEEPALIVE quiet seconds, or None once GONE."""
    waited = 0.0
    step = keepalive if gone is None else min(1.0, keepalive)
    while waited < keepalive:
        try:
            return events.get(timeout=step)
        except queue.Empty:
            waited += step
            if gone is not None and gone():
                return None
    return ("ping", None)
