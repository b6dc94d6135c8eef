"""The 2025-11-25 era: ``initialize``, sessions, the ``GET`` stream and ``DELETE``.

Serves the handshake versions 2025-11-25, 2025-06-18 and 2025-03-26 (basic/lifecycle.mdx,
basic/transports.mdx of each) beside the stateless 2026-07-28 era, over the same store.

What it claims (``claims``): a POST whose body carries no 2026 ``_meta`` envelope and whose
``MCP-Protocol-Version`` header is one of its versions, or, without that header, an
``initialize`` or any message with an ``Mcp-Session-Id``. Everything else is the stateless
era's: a 2026 body is judged by its envelope (a mismatching header is its -32020), and a
stray session id beside a 2026 header is ignored.

The transport rules of the 2025 wire, in the order they are checked:

- ``initialize`` negotiates the version (the client's if it is one of ours, else 2025-11-25)
  and opens a session (``tasks_app.sessions``, in the database; at most
  ``TASKDESK_MAX_SESSIONS_PER_CLIENT`` a client, and ``capabilities`` and ``clientInfo`` of at
  most ``TASKDESK_MAX_SESSION_INFO_BYTES`` each), named in the response's ``Mcp-Session-Id``
  header;
- every later request carries that header: missing -> 400, unknown, another client's or
  idle too long -> 404 (the client initializes again);
- ``MCP-Protocol-Version``, when sent, must be one of the handshake versions (else 400;
  absent means 2025-03-26, as the transport says; any of ours is accepted after any
  negotiation, as clients hard-code older values);
- notifications and the client's responses answer 202. A response to a question of a task
  (id ``taskdesk-q:<task>:<key>``) is that question's answer (``elicitations.transitions``,
  first answer wins); a response to a synchronous call's question is stored for the request
  that waits for it; any other response is dropped (nothing waits for it);
- errors of a method are JSON-RPC errors with HTTP 200 (the TS and Python SDKs read error
  codes only from a 2xx body); transport errors keep their HTTP status;
- a result is JSON, or one SSE event when ``Accept`` lists ``text/event-stream`` first.

A synchronous call that asks the client (elicitation, sampling, roots) runs the same MRTR
rounds as on the 2026 wire, but each round's input requests go to the client as real
server-to-client requests on the call's SSE stream, and their answers come back as POSTed
responses; the function then runs again with them (``_rounds``).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.http import HttpResponse, HttpResponseBase
from rest_framework.request import Request
from rest_framework.views import APIView

from elicitations import transitions as elicitation_transitions
from elicitations.models import Channel
from tasks_app import selectors, sessions, storage
from tasks_app.mcp import envelope, eras, limits, session_streams, stream_slots, streaming
from tasks_app.mcp.envelope import Envelope
from tasks_app.mcp.errors import (
    InternalError,
    InvalidParams,
    InvalidRequest,
    McpError,
    MethodNotFound,
    NotAcceptable,
    from_code,
    unexpected,
)
from tasks_app.mcp.handlers import discovery, handshake
from tasks_app.mcp.headers import header, sent
from tasks_app.mcp.methods import handshake_methods
from tasks_app.mcp.params import InitializeParams, validate
from tasks_app.mcp.registry import Call, Method
from tasks_app.mcp.streaming import Emit, EndStream, Streamed
from tasks_app.models import Client, Era, McpSession

log = logging.getLogger("tasks_app.mcp")

LATEST = Era.LEGACY.value
VERSIONS = (LATEST, "2025-06-18", "2025-03-26")
SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
SYNC_REQUEST_PREFIX = "taskdesk-s:"
MAX_ROUNDS = 20
# How long a client waits before it resumes a stream the server closed.
RETRY_MS = 1000
# Keys the 2026 wire adds to results, which the 2025 wire does not have.
_MODERN_ONLY = ("resultType", "ttlMs", "cacheScope")


class SessionRequired(InvalidRequest):
    default_message = (
        f"Bad Request: missing {SESSION_HEADER}: send the header the initialize response "
        "carried, or initialize first"
    )


class SessionNotFound(McpError):
    code = -32001
    http_status = 404
    default_message = "Session not found: it ended or expired; initialize a new session"


class BadVersionHeader(InvalidRequest):
    pass


def _capabilities(version: str) -> dict[str, Any]:
    capabilities: dict[str, Any] = {
        "tools": {"listChanged": False},
        "prompts": {"listChanged": False},
        "resources": {"subscribe": True, "listChanged": False},
        "completions": {},
        "logging": {},
    }
    if version == LATEST:
        # Tasks arrived in 2025-11-25 (experimental, SEP-1686); only tools/call makes them.
        capabilities["tasks"] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    return capabilities


def shape(result: dict[str, Any]) -> dict[str, Any]:
    """A result of a shared method as the 2025 wire carries it."""
    for key in _MODERN_ONLY:
        result.pop(key, None)
    return result


def _input_required(result: Any) -> bool:
    return isinstance(result, dict) and result.get("resultType") == "input_required"


def _rpc_error(request_id: Any, error: McpError) -> HttpResponse:
    """A method's error: HTTP 200 with the JSON-RPC error (429 keeps its status)."""
    status = error.http_status if error.http_status == 429 else 200
    return streaming.json_response(streaming.failure(request_id, error), status, error.headers())


class HandshakeEra(eras.ProtocolEra):
    versions = VERSIONS

    def claims(self, request: Request, message: dict[str, Any]) -> bool:
        params = message.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        if isinstance(meta, dict) and envelope.PROTOCOL_VERSION in meta:
            return False  # the body speaks 2026-07-28, whatever the headers say
        version = sent(request, VERSION_HEADER)
        if version is not None:
            return version.strip() in self.versions
        return message.get("method") == "initialize" or sent(request, SESSION_HEADER) is not None

    # --- POST ------------------------------------------------------------------------------

    def handle(
        self, request: Request, view: APIView, message: dict[str, Any], client: Client
    ) -> HttpResponseBase:
        request_id: str | int | None = None
        try:
            if "method" not in message:
                return self._reply(request, message, client)
            if "id" in message:
                request_id = eras.request_id(message)
            method = message["method"]
            if not isinstance(method, str) or not method:
                raise InvalidRequest("method must be a non-empty string")
            if method == "initialize":
                if request_id is None:
                    raise InvalidRequest("initialize is a request: it needs an id")
                return self._initialize(request_id, message, client)
            session = self._session(request, client)
            if request_id is None:  # notifications/initialized, notifications/cancelled, ...
                if method == "notifications/cancelled":
                    _cancel(session, message.get("params"))
                return HttpResponse(status=202)
            return self._answer(request, view, message, method, request_id, client, session)
        except McpError as exc:
            return streaming.error_response(request_id, exc)

    def _initialize(
        self, request_id: str | int, message: dict[str, Any], client: Client
    ) -> HttpResponseBase:
        params = message.get("params")
        if not isinstance(params, dict):
            return _rpc_error(request_id, InvalidParams("initialize needs params"))
        try:
            data = validate(InitializeParams, params)
        except McpError as exc:
            return _rpc_error(request_id, exc)
        # clientInfo.icons (2025-11-25 Implementation) may hold data: URIs of any size, and
        # nothing here shows them: they are neither kept nor counted.
        client_info = {k: v for k, v in data["clientInfo"].items() if k != "icons"}
        _check_sizes({"capabilities": data["capabilities"], "clientInfo": client_info})
        requested = data["protocolVersion"]
        version = requested if requested in VERSIONS else LATEST
        session = sessions.open_session(
            client=client,
            protocol_version=version,
            capabilities=data["capabilities"],
            client_info=client_info,
        )
        result = {
            "protocolVersion": version,
            "capabilities": _capabilities(version),
            "serverInfo": discovery.server_info(),
            "instructions": (
                "Long-running tools run as durable tasks: call them with params.task, then "
                "tasks/get or tasks/result. Send an Idempotency-Key header to make a retry "
                "return the same task."
            ),
        }
        response = streaming.json_response(streaming.success(request_id, result, result_type=False))
        response[SESSION_HEADER] = session.pk
        return response

    def _session(self, request: Request, client: Client) -> McpSession:
        session_id = header(request, SESSION_HEADER)
        if not session_id:
            raise SessionRequired()
        version = header(request, VERSION_HEADER)
        if version is not None and version not in VERSIONS:
            raise BadVersionHeader(
                f"Bad Request: unsupported {VERSION_HEADER} {version!r}; this session speaks "
                f"{', '.join(VERSIONS)}"
            )
        session = sessions.live_session(client=client, session_id=session_id)
        if session is None:
            raise SessionNotFound()
        return session

    def _reply(self, request: Request, message: dict[str, Any], client: Client) -> HttpResponse:
        """A client's response to a request the server sent on one of its streams."""
        session = self._session(request, client)
        if "result" not in message and "error" not in message:
            raise InvalidRequest("A message without a method must be a response (result or error)")
        reply_id = message.get("id")
        if isinstance(reply_id, str) and reply_id.startswith(handshake.QUESTION_ID_PREFIX):
            _answer_question(reply_id, message, client)
        elif isinstance(reply_id, str | int) and not isinstance(reply_id, bool):
            sessions.store_reply(session=session, request_id=str(reply_id), body=message)
        return HttpResponse(status=202)

    def _answer(
        self,
        request: Request,
        view: APIView,
        message: dict[str, Any],
        method: str,
        request_id: str | int,
        client: Client,
        session: McpSession,
    ) -> HttpResponseBase:
        try:
            params = message.get("params")
            if params is None:
                params = {}
            if not isinstance(params, dict):
                raise InvalidParams("params must be an object")
            spec = handshake_methods.get(method)
            if spec is None:
                raise MethodNotFound(f"Method not found: {method}")
            meta = params.get("_meta")
            call = Call(
                id=request_id,
                method=method,
                params=params,
                envelope=session_envelope(session, meta if isinstance(meta, dict) else {}),
                client=client,
                request=request,
                view=view,
                data=spec.validate(params),
                era=Era.LEGACY,
                session=session,
            )
            result = spec.handler(call)
        except McpError as exc:
            return _rpc_error(request_id, exc)
        if isinstance(result, Streamed) or _input_required(result):
            first = result

            def run(emit: Emit, cancelled: threading.Event) -> dict[str, Any]:
                return _rounds(call, spec, first, emit, cancelled)

            resume = result.resume_id if isinstance(result, Streamed) else None
            # The first run's slot is given back when its run ends (``_rounds``), or by the
            # stream if the run never starts.
            release = result.release if isinstance(result, Streamed) else None
            return streaming.respond(
                request_id,
                Streamed(run, release=release),
                result_type=False,
                error_status=200,
                gone=lambda: stream_slots.peer_gone(request),
                prime=_prime(resume),
            )
        message = streaming.success(request_id, shape(result), result_type=False)
        if streaming.prefers_events(sent(request, "Accept") or ""):
            return streaming.event_response(message)
        return streaming.json_response(message)

    # --- GET and DELETE --------------------------------------------------------------------

    def serves_other_method(self, request: Request) -> bool:
        return sent(request, SESSION_HEADER) is not None  # no session: the stateless wire's 405

    def other_method(self, request: Request, view: APIView, client: Client) -> HttpResponseBase:
        try:
            session = self._session(request, client)
            if request.method == "DELETE":
                sessions.end_session(session)
                return HttpResponse(status=204)
            accept = sent(request, "Accept") or ""
            if "text/event-stream" not in accept and "*/*" not in accept:
                raise NotAcceptable("The GET stream needs Accept: text/event-stream")
            last = sent(request, "Last-Event-ID")
            if last:
                return self._resume(request, session, client, last)
            return session_streams.session_stream(
                request,
                session,
                client,
                stream_slots.take(client.pk),
                session_envelope(session, {}),
            )
        except McpError as exc:
            return streaming.error_response(None, exc)

    def _resume(
        self, request: Request, session: McpSession, client: Client, last: str
    ) -> HttpResponseBase:
        """GET with ``Last-Event-ID``: resume the tasks/result stream that id names."""
        resumed = handshake.parse_resume_id(last)
        if resumed is None:
            raise InvalidRequest(f"Last-Event-ID {last!r} names no stream of this server")
        task_id, request_id = resumed.task_id, resumed.request_id
        if handshake.task_of_client(client, task_id) is None:
            raise SessionNotFound(f"Last-Event-ID {last!r} names no stream of this client")
        streamed = handshake.result_stream(
            session_envelope(session, {}),
            task_id,
            request_id,
            session_id=session.pk,
            client=client.pk,
            seen=resumed.asked,
        )
        log.info("resuming the tasks/result stream of task %s (request %r)", task_id, request_id)
        return streaming.respond(
            request_id,
            streamed,
            result_type=False,
            error_status=200,
            gone=lambda: stream_slots.peer_gone(request),
            prime=_prime(streamed.resume_id),
            stream_now=True,
        )


def _cancel(session: McpSession, params: Any) -> None:
    """``notifications/cancelled``: the request it names stops at its next check and gets no
    answer (basic/utilities/cancellation.mdx). A malformed one, or one naming a request that
    has ended, is ignored, as the spec allows. It never cancels a task: ``tasks/cancel`` does
    that; a cancelled ``tasks/result`` or awaited call only stops waiting."""
    request_id = params.get("requestId") if isinstance(params, dict) else None
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        return
    sessions.cancel_request(session_id=session.pk, request_id=request_id)
    log.info("request %r of session %s cancelled by the client", request_id, session.pk[:8])


def _check_sizes(kept: dict[str, Any]) -> None:
    """A session keeps what ``initialize`` declared for its whole life: refuse (400, -32602)
    a ``capabilities`` or ``clientInfo`` (as KEPT) larger than
    ``TASKDESK_MAX_SESSION_INFO_BYTES``."""
    limit = settings.TASKDESK_MAX_SESSION_INFO_BYTES
    for field, value in kept.items():
        size = storage.json_bytes(value)
        if size > limit:
            raise InvalidParams(
                f"params.{field} is {size} bytes of JSON; a session keeps at most {limit} "
                "(TASKDESK_MAX_SESSION_INFO_BYTES): declare only what the server needs",
                data={"field": f"params.{field}", "bytes": size, "limit": limit},
            )


def _prime(resume_id: str | None) -> bytes:
    if resume_id is None:
        return b""
    return streaming.priming_event(resume_id, RETRY_MS)


def session_envelope(session: McpSession, meta: dict[str, Any]) -> Envelope:
    """The session's negotiated version and capabilities as the handlers read them (the
    2026 wire sends them per request). The session's log level applies to every call. What
    the session declared never makes a 2026 task (``Envelope.declares_tasks``): a call
    without ``params.task`` runs, one with it gets the 2025-11-25 ``{task: ...}``."""
    token = meta.get("progressToken")
    if isinstance(token, bool) or not isinstance(token, str | int):
        token = None
    return Envelope(
        protocol_version=session.protocol_version,
        capabilities=session.capabilities or {},
        client_info=session.client_info or None,
        log_level=session.log_level or None,
        progress_token=token,
        meta=meta,
        from_session=True,
    )


# --- synchronous calls that ask the client -----------------------------------------------


def _rounds(
    call: Call, spec: Method, first: Any, emit: Emit, cancelled: threading.Event
) -> dict[str, Any]:
    """Run CALL's MRTR rounds inside this one request: send each round's input requests to
    the client on this stream, wait for the answers, and run the method again with them."""
    result = first
    # The synchronous slot of the round that ran last: waiting for the client's answers holds
    # this request as much as a run does, so the slot is kept until the next round takes its
    # own (or the call ends).
    held: Callable[[], None] | None = None
    answers: dict[str, Any] = {}
    try:
        # The client is asked at most MAX_ROUNDS times; every run, the last one too, is run
        # (and its slot given back) before the call ends.
        for rounds in range(MAX_ROUNDS + 1):
            if isinstance(result, Streamed):
                held = result.release
                result = result.run(emit, cancelled)
            if not _input_required(result):
                return shape(result)
            requests = result.get("inputRequests") or {}
            if rounds == MAX_ROUNDS:
                raise _too_many_rounds(requests, answers)
            assert call.session is not None
            if held is None:
                held = limits.sync_slots.take("synchronous calls", call.client.pk)
            answers = _ask(call, requests, emit, cancelled)
            params = {**call.params, "inputResponses": answers}
            if result.get("requestState"):
                params["requestState"] = result["requestState"]
            call = replace(call, params=params, data=spec.validate(params))
            held()
            held = None
            result = spec.handler(call)
        raise AssertionError("unreachable: the last round returns or raises")
    finally:
        if held is not None:
            held()


def _too_many_rounds(requests: dict[str, Any], answers: dict[str, Any]) -> McpError:
    """The call still asks after MAX_ROUNDS rounds. When it asks again what the client just
    answered, that answer does not fit its question (``sync._answer``): -32602 naming it.
    Otherwise the tool keeps asking new questions, a bug of the tool (-32603 with a
    reference to the log)."""
    refused = [key for key in requests if key in answers]
    if refused:
        return InvalidParams(
            f"The client's answer to {', '.join(refused)} does not fit what was asked, "
            f"which was asked {MAX_ROUNDS} times: send the result its method defines (for "
            "elicitation/create, content that fits its requestedSchema, or decline)",
            data={"inputRequests": refused, "rounds": MAX_ROUNDS},
        )
    return unexpected(InternalError(f"The call asked the client more than {MAX_ROUNDS} times"))


def _ask(
    call: Call,
    requests: dict[str, dict[str, Any]],
    emit: Emit,
    cancelled: threading.Event,
) -> dict[str, Any]:
    session = call.session
    assert session is not None
    withdrawn = sessions.cancel_check(session_id=session.pk, request_id=call.id)
    round_id = secrets.token_urlsafe(9)
    ids = {f"{SYNC_REQUEST_PREFIX}{round_id}:{key}": key for key in requests}
    # Only responses to ids the session awaits are kept (sessions.store_reply).
    sessions.await_replies(session_id=session.pk, request_ids=list(ids))
    try:
        return _await_answers(requests, ids, session, emit, cancelled, withdrawn)
    finally:
        sessions.forget_replies(session_id=session.pk, request_ids=list(ids))


def _await_answers(
    requests: dict[str, dict[str, Any]],
    ids: dict[str, str],
    session: McpSession,
    emit: Emit,
    cancelled: threading.Event,
    withdrawn: Callable[[], bool],
) -> dict[str, Any]:
    for request_id, key in ids.items():
        body = requests[key]
        params = dict(body.get("params") or {})
        if body.get("method") == "elicitation/create" and params.get("mode") == "url":
            params["elicitationId"] = request_id
        emit({"jsonrpc": "2.0", "id": request_id, "method": body["method"], "params": params})
    deadline = time.monotonic() + settings.TASKDESK_SYNC_WAIT_SECONDS
    answers: dict[str, Any] = {}
    delay = 0.02
    while len(answers) < len(ids):
        if cancelled.is_set():
            raise InternalError("The client closed the stream")
        if withdrawn():
            raise EndStream()  # the client cancelled the call: no answer
        if time.monotonic() > deadline:
            raise InternalError(
                f"The client did not answer {', '.join(k for k in requests if k not in answers)} "
                f"within {settings.TASKDESK_SYNC_WAIT_SECONDS:g} s"
            )
        replies = sessions.take_replies(
            session_id=session.pk, request_ids=[i for i, k in ids.items() if k not in answers]
        )
        for request_id, reply in replies.items():
            error = reply.get("error")
            if isinstance(error, dict):
                raise from_code(
                    int(error.get("code", -32603)),
                    f"The client answered {requests[ids[request_id]].get('method')} with an "
                    f"error: {error.get('message', '')}",
                    error.get("data"),
                )
            result = reply.get("result")
            answers[ids[request_id]] = result if isinstance(result, dict) else {}
        if len(answers) < len(ids):
            handshake.pause(delay)
            delay = min(delay * 1.5, 0.25)
    return answers


def _answer_question(reply_id: str, message: dict[str, Any], client: Client) -> None:
    """A response to a task's ``elicitation/create``: the question's answer (first wins)."""
    task_id, _, key = reply_id[len(handshake.QUESTION_ID_PREFIX) :].partition(":")
    result = message.get("result")
    if not key or not isinstance(result, dict):
        return  # an error response leaves the question pending (the inbox may answer it)
    try:
        task = selectors.task_get_for_client(client=client, task_id=task_id)
    except selectors.TaskNotFound:
        return
    elicitation_transitions.answer(
        task=task, key=key, response=result, channel=Channel.LEGACY_ELICIT, client=client
    )


eras.register(HandshakeEra())
