"""``SyncContext``: the ``ToolContext`` of a tool (or prompt) run inside the web request.

Questions are asked with MRTR (SEP-2322): a question without an answer in this round stops
the function with ``NeedInput``, and the endpoint answers ``input_required`` listing every
question of that ``ask_many`` (or ``request_inputs``) call at once. The retry runs the
function again from the top with the answers of all rounds, so code between questions must
be deterministic, exactly as inside a task. Only input kinds the request's own capabilities
declare are asked for; anything else raises ``MissingClientCapability`` (a ``ProtocolError``,
-32021), which a tool may catch to fall back to another kind of question.

Progress and log lines become ``notifications/progress`` and ``notifications/message`` on
the response stream (when the request sent a progress token or a log level).

Every ctx call is a checkpoint. There the run stops with ``Cancelled`` once the client has
closed its request (its stream, or its connection), and with ``TimeUp`` once it has run for
``TASKDESK_SYNC_MAX_SECONDS``; a tool that may escalate becomes a task there instead.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeGuard, TypeVar

import jsonschema

from tasks_app.mcp.envelope import Envelope
from tasks_app.models import Client
from tasks_app.tools import (
    Answer,
    Cancelled,
    EffectHandle,
    MissingClientCapability,
    Question,
    Retry,
    ToolError,
)
from tasks_app.tools.context import ToolContext

T = TypeVar("T")
log = logging.getLogger("tasks_app.mcp")

Emit = Callable[[dict[str, Any]], None]
ACTIONS = ("accept", "decline", "cancel")


class NeedInput(Exception):
    """The function needs answers first: REQUESTS maps keys to MCP input requests."""

    def __init__(self, requests: dict[str, dict[str, Any]]) -> None:
        super().__init__(", ".join(requests))
        self.requests = requests


class Escalate(Exception):
    """The function called ``ctx.escalate()``: continue as a task."""


class TimeUp(Exception):
    """The synchronous run passed its time cap (``TASKDESK_SYNC_MAX_SECONDS``)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"ran longer than {seconds:g} s")
        self.seconds = seconds


def missing_capability(method: str, mode: str | None = None) -> MissingClientCapability:
    if method == "elicitation/create":
        required: dict[str, Any] = {"elicitation": {mode or "form": {}}}
        what = f"{mode or 'form'}-mode elicitation"
    elif method == "sampling/createMessage":
        required, what = {"sampling": {}}, "sampling"
    else:
        required, what = {"roots": {}}, "roots"
    return MissingClientCapability(
        f"This call needs {what}, which this request's clientCapabilities do not declare",
        required=required,
    )


class _Effect(EffectHandle):
    def __init__(self, name: str) -> None:
        self.key = f"sync:{name}:{secrets.token_urlsafe(12)}"
        self.done = False
        self.detail: dict[str, Any] = {}

    def record(self, **detail: Any) -> None:
        self.detail.update(detail)


class SyncContext(ToolContext):
    def __init__(
        self,
        *,
        client: Client,
        envelope: Envelope,
        name: str,
        answers: dict[str, Any],
        can_escalate: bool = False,
        emit: Emit | None = None,
        cancelled: threading.Event | None = None,
        disconnected: Callable[[], bool] | None = None,
        max_seconds: float | None = None,
    ) -> None:
        self.task_id = None
        self._client = client
        self.envelope = envelope
        self.name = name
        self.answers = answers
        self.can_escalate = can_escalate
        self.emit = emit
        self.cancelled = cancelled
        self.disconnected = disconnected
        self.max_seconds = max_seconds
        self.deadline = None if max_seconds is None else time.monotonic() + max_seconds
        # Answers this run used (carried in requestState to the next round) and the journal
        # a task created by ctx.escalate() starts from (the runtime's "ask" entry shape).
        self.used: dict[str, Any] = {}
        self.journal: list[dict[str, Any]] = []

    # --- questions -----------------------------------------------------------------------

    @property
    def client_name(self) -> str:
        return self._client.name

    @property
    def tenant(self) -> str:
        return self._client.tenant.slug

    def ask_many(self, questions: dict[str, Question]) -> dict[str, Answer]:
        self.check_cancelled()
        answers: dict[str, Answer] = {}
        missing: dict[str, dict[str, Any]] = {}
        for key, question in questions.items():
            if question.audience == "operator":
                raise ToolError(
                    f"{self.name} asks an operator ({key!r}), which only a task can wait for"
                )
            mode = "url" if question.url else "form"
            if not self.envelope.declares("elicitation/create", mode):
                raise missing_capability("elicitation/create", mode)
            answer = _answer(self.answers.get(key), question)
            if answer is None:
                missing[key] = _elicitation(question)
            else:
                answers[key] = answer
        if missing:
            raise NeedInput(missing)
        for key, answer in answers.items():
            self.used[key] = self.answers[key]
            outcome: dict[str, Any] = {"action": answer.action}
            if answer.accepted:
                outcome["content"] = answer.content
            self.journal.append(
                {"seq": len(self.journal), "kind": "ask", "name": key, "outcome": outcome}
            )
        return answers

    def request_input(self, key: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return self.request_inputs({key: (method, params)})[key]

    def request_inputs(
        self, requests: dict[str, tuple[str, dict[str, Any]]]
    ) -> dict[str, dict[str, Any]]:
        """Send several raw input requests at once and return every result (MRTR only)."""
        self.check_cancelled()
        results: dict[str, dict[str, Any]] = {}
        missing: dict[str, dict[str, Any]] = {}
        for key, (method, params) in requests.items():
            mode = params.get("mode") if method == "elicitation/create" else None
            if method not in ("elicitation/create", "sampling/createMessage", "roots/list"):
                raise ToolError(f"{method} is not an input request a client can answer")
            if not self.envelope.declares(method, mode):
                raise missing_capability(method, mode)
            response = self.answers.get(key)
            if _raw_ok(response, method):
                results[key] = response
            else:
                missing[key] = {"method": method, "params": params}
        if missing:
            raise NeedInput(missing)
        self.used.update(results)
        return results

    def escalate(self) -> None:
        if self.can_escalate:
            raise Escalate()

    # --- work ----------------------------------------------------------------------------

    def effect(
        self,
        name: str,
        *,
        target: str = "",
        verify: Callable[[str], bool] | None = None,
        compensate: Callable[[str], None] | None = None,
        retry: Retry | None = None,  # a with block runs once: not applied on this path
    ) -> AbstractContextManager[EffectHandle]:
        if self.can_escalate:
            # Nothing before ctx.escalate() is in the task's ledger, and the task replays the
            # function from the top: the effect would run a second time there.
            raise ToolError(
                f"{self.name} starts the effect {name!r} before ctx.escalate(); a tool that "
                "escalates must run its effects after the escalation, inside the task"
            )

        # A synchronous call has no ledger: the request itself is the unit of retry.
        @contextmanager
        def scope() -> Iterator[EffectHandle]:
            self.check_cancelled()
            yield _Effect(name)

        return scope()

    def step(self, name: str, fn: Callable[[], T], *, retry: Retry | None = None) -> T:
        self.check_cancelled()
        attempt = 1
        while True:
            try:
                value = fn()
                break
            except Exception as exc:
                # A synchronous call cannot give its worker back: it waits in place.
                if retry is None or attempt >= retry.attempts or not retry.retries(exc):
                    raise
                attempt += 1
                self.sleep(retry.delay(attempt))
        if self.can_escalate:
            # The task this call may become replays from the top: it takes the value from
            # the journal instead of computing it again.
            self.journal.append(
                {
                    "seq": len(self.journal),
                    "kind": "step",
                    "name": name,
                    "outcome": {"value": value},
                }
            )
        return value

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        self.check_cancelled()
        token = self.envelope.progress_token
        if token is None or self.emit is None:
            return
        params: dict[str, Any] = {"progressToken": token, "progress": done}
        if total is not None:
            params["total"] = total
        if message:
            params["message"] = message
        self.emit({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})

    def log(self, level: str, message: str, **data: Any) -> None:
        self.check_cancelled()
        level = level.lower()
        if self.emit is None or not self.envelope.logs(level):
            return
        payload: Any = {"message": message, **data} if data else message
        self.emit(
            {
                "jsonrpc": "2.0",
                "method": "notifications/message",
                "params": {"level": level, "logger": self.name, "data": payload},
            }
        )

    def check_cancelled(self) -> None:
        # The only way to cancel a synchronous call is to close its request: its response
        # stream, or the connection itself.
        if self.cancelled is not None and self.cancelled.is_set():
            raise Cancelled("the client closed the request")
        if self.disconnected is not None and self.disconnected():
            raise Cancelled("the client closed the connection")
        if self.deadline is not None and time.monotonic() > self.deadline:
            assert self.max_seconds is not None
            if self.can_escalate:
                raise Escalate()  # past the cap, a tool that may escalate becomes a task
            raise TimeUp(self.max_seconds)


def _elicitation(question: Question) -> dict[str, Any]:
    if question.url:
        params: dict[str, Any] = {"mode": "url", "message": question.message, "url": question.url}
    else:
        params = {
            "mode": "form",
            "message": question.message,
            "requestedSchema": question.schema or {"type": "object", "properties": {}},
        }
    return {"method": "elicitation/create", "params": params}


def _answer(response: Any, question: Question) -> Answer | None:
    """The Answer in an ElicitResult, or None when it is missing or does not fit (the
    question is then asked again, as SEP-2322 recommends over an error)."""
    if not isinstance(response, dict) or response.get("action") not in ACTIONS:
        return None
    action = response["action"]
    if action != "accept" or question.url:
        return Answer(action=action)
    content = response.get("content", {})
    if not isinstance(content, dict):
        return None
    schema = question.schema or {"type": "object", "properties": {}}
    if not jsonschema.Draft202012Validator(schema).is_valid(content):
        return None
    return Answer(action="accept", content=content)


def _raw_ok(response: Any, method: str) -> TypeGuard[dict[str, Any]]:
    if not isinstance(response, dict):
        return False
    if method == "elicitation/create":
        return response.get("action") in ACTIONS
    if method == "roots/list":
        return isinstance(response.get("roots"), list)
    return "content" in response
