"""The client: submit a tool call so that its receipt cannot be lost, then follow the task.

The rule it keeps: **write the key down before you send.** ``submit`` journals the key, the
tool and the arguments (SQLite, committed to disk), then sends ``tools/call`` with the
``Idempotency-Key`` header. Whatever happens to the answer (a timeout, a dropped connection, a
5xx, a 429 or a 503), it sends the same call with the same key again, after a backoff with
jitter that honours ``Retry-After``; the server answers a repeat with the original receipt.
If the process dies before a receipt arrived, ``resume`` in any later process resends what the
journal holds without a receipt, each with its own key.

The wire is MCP 2026-07-28 (stateless Streamable HTTP) with the tasks extension.
"""

from __future__ import annotations

import email.utils
import json
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx

from taskdesk_client.journal import Entry, Journal

if TYPE_CHECKING:
    import mcp_types

VERSION = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
REPLAYED_META = "dev.taskdesk/replayed"
TERMINAL = ("completed", "failed", "cancelled")
NAME_PARAM = {
    "tools/call": "name",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
}
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
INTERNAL_ERROR = -32603


class TaskdeskError(Exception):
    """A JSON-RPC error from the server, or a task that did not end well."""

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        data: Any = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.data = data
        self.status = status

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            out["data"] = self.data
        if self.status is not None:
            out["status"] = self.status
        return out


class Refused(TaskdeskError):
    """The server refused the request (bad arguments, unknown tool, reused key, bad token...).
    Sending it again as it is would be refused again."""


class Unreachable(TaskdeskError):
    """Every attempt failed (no answer, or only 5xx/429 answers). A submission stays in the
    journal without a receipt: ``resume`` sends it again with its key."""


class TaskFailed(TaskdeskError):
    """The task ended ``failed``; ``code``/``message``/``data`` are its JSON-RPC error."""


class TaskCancelled(TaskdeskError):
    """The task ended ``cancelled``."""


@dataclass(frozen=True)
class Backoff:
    """How often and how long to wait between attempts. The n-th wait is a random time
    between 0 and ``min(max_delay, base * 2 ** (n - 1))`` seconds ("full jitter"), and never
    shorter than what the server's ``Retry-After`` asks."""

    attempts: int = 8
    base: float = 0.5
    max_delay: float = 30.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        ceiling = min(self.max_delay, self.base * 2 ** (attempt - 1))
        wait = random.uniform(0, ceiling)  # jitter, not secrecy
        if retry_after is not None:
            wait = max(wait, retry_after + random.uniform(0, min(1.0, retry_after / 10 + 0.05)))
        return wait


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds: delta-seconds or an HTTP date; None when absent or bad."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, moment.timestamp() - (time.time() if now is None else now))


def new_key() -> str:
    return f"tdc-{uuid.uuid4()}"


@dataclass
class Resumed:
    """What ``resume`` did with one journaled submission."""

    key: str
    tool: str
    handle: Handle | None = None
    error: TaskdeskError | None = None

    @property
    def task_id(self) -> str | None:
        return self.handle.task_id if self.handle is not None else None


class Client:
    """A Taskdesk MCP endpoint (``http://host:8000/mcp``), a bearer token and a journal path
    (default: ``journal.sqlite3`` in the user's data directory).

    ELICITATION: the elicitation modes whose questions the caller answers (``Handle.answer``),
    declared in every request; a task's questions of other modes go to the operators' inbox
    or fail the task at once. ``()`` for a caller that never answers."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        journal: str | Path | Journal | None = None,
        *,
        timeout: float = 30.0,
        backoff: Backoff | None = None,
        client_name: str = "taskdesk-client",
        http: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
        elicitation: Sequence[str] = ("form", "url"),
    ) -> None:
        self.url = url
        self.elicitation = tuple(elicitation)
        self.token = token
        self.journal = journal if isinstance(journal, Journal) else Journal(journal)
        self.backoff = backoff or Backoff()
        self.client_name = client_name
        self.http = http or httpx.Client(timeout=timeout)
        self.sleep = sleep
        self._ids = 0

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # -- submissions -------------------------------------------------------------------

    def submit(
        self, tool: str, arguments: Mapping[str, Any] | None = None, key: str | None = None
    ) -> Handle:
        """Journal the call, then send it (retrying with the same key) and return its handle.

        A key journaled before for the same call returns that call's handle (sending it again
        when no receipt had arrived); for another call it raises ``journal.KeyReused``."""
        entry = self.journal.record(
            key=key or new_key(), url=self.url, tool=tool, arguments=dict(arguments or {})
        )
        if entry.receipt is not None:
            return Handle(self, entry.key, entry.tool, entry.arguments, entry.receipt)
        if entry.error is not None:
            raise Refused(
                entry.error.get("message", "refused"),
                code=entry.error.get("code"),
                data=entry.error.get("data"),
                status=entry.error.get("status"),
            )
        return self._send(entry)

    def resume(self) -> list[Resumed]:
        """Send again every submission to this endpoint that the journal holds without a
        receipt or a refusal, each with its own key; return what became of each."""
        out = []
        for entry in self.journal.unsettled(self.url):
            try:
                out.append(Resumed(entry.key, entry.tool, handle=self._send(entry)))
            except TaskdeskError as exc:
                out.append(Resumed(entry.key, entry.tool, error=exc))
        return out

    def task(self, task_id: str) -> Handle:
        """A handle on a task known by its id (a receipt kept elsewhere)."""
        handle = Handle(self, None, None, {}, {"resultType": "task", "taskId": task_id})
        handle.refresh()
        return handle

    def tools(self) -> list[dict[str, Any]]:
        """The server's tools (``tools/list``, every page)."""
        found: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"cursor": cursor} if cursor else {}
            page = self.request("tools/list", params)
            found.extend(page.get("tools", []))
            cursor = page.get("nextCursor")
            if not cursor:
                return found

    def _send(self, entry: Entry) -> Handle:
        params = {"name": entry.tool, "arguments": entry.arguments}
        try:
            result = self.request("tools/call", params, headers={"Idempotency-Key": entry.key})
        except Refused as exc:
            if exc.status not in (401, 403):  # a better token may get it accepted: keep it open
                self.journal.settle(key=entry.key, url=self.url, error=exc.as_dict())
            raise
        if result.get("resultType") == "input_required":
            # Sent again, it would ask again: journaled as a refusal, so resume skips it.
            refused = Refused(
                f"{entry.tool} asks for input before it starts, which this client does not "
                "provide; the call was not accepted.",
                data=result.get("inputRequests"),
            )
            self.journal.settle(key=entry.key, url=self.url, error=refused.as_dict())
            raise refused
        self.journal.settle(key=entry.key, url=self.url, receipt=result)
        return Handle(self, entry.key, entry.tool, entry.arguments, result)

    # -- the wire ----------------------------------------------------------------------

    def envelope(self) -> dict[str, Any]:
        return {
            "io.modelcontextprotocol/protocolVersion": VERSION,
            "io.modelcontextprotocol/clientInfo": {"name": self.client_name, "version": "0.1.0"},
            "io.modelcontextprotocol/clientCapabilities": self.capabilities(),
        }

    def capabilities(self) -> dict[str, Any]:
        capabilities: dict[str, Any] = {"extensions": {TASKS: {}}}
        if self.elicitation:
            capabilities["elicitation"] = {mode: {} for mode in self.elicitation}
        return capabilities

    def request(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Send one JSON-RPC request, retrying on a timeout, a dropped connection, a 5xx, a
        429 and an internal error; return its result or raise ``Refused``/``Unreachable``."""
        self._ids += 1
        request_id = self._ids
        body = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": method,
            "params": {**(params or {}), "_meta": self.envelope()},
        }
        sent = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": VERSION,
            "Mcp-Method": method,
            **(headers or {}),
        }
        name = (params or {}).get(NAME_PARAM.get(method, ""))
        if isinstance(name, str):
            sent["Mcp-Name"] = name
        if self.token:
            sent["Authorization"] = f"Bearer {self.token}"
        raw = json.dumps(body).encode()
        last: str = ""
        for attempt in range(1, self.backoff.attempts + 1):
            retry_after: float | None = None
            try:
                response = self.http.post(self.url, content=raw, headers=sent)
            except httpx.TransportError as exc:  # timeouts, refused and dropped connections
                last = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code in RETRY_STATUSES:
                    last = f"HTTP {response.status_code}"
                    retry_after = retry_after_seconds(response.headers.get("Retry-After"))
                else:
                    message = _message(response, request_id)
                    error = message.get("error")
                    if error is None:
                        result: dict[str, Any] = message["result"]
                        return result
                    if error.get("code") != INTERNAL_ERROR:
                        raise Refused(
                            str(error.get("message")),
                            code=error.get("code"),
                            data=error.get("data"),
                            status=response.status_code,
                        )
                    last = f"internal error: {error.get('message')}"
            if attempt < self.backoff.attempts:
                self.sleep(self.backoff.delay(attempt, retry_after))
        raise Unreachable(
            f"{method} got no usable answer from {self.url} after {self.backoff.attempts} "
            f"attempts (last: {last})"
        )


def _message(response: httpx.Response, request_id: int) -> dict[str, Any]:
    """The JSON-RPC response in RESPONSE: the body, or the event-stream event answering it."""
    if response.headers.get("Content-Type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:"):
                event = json.loads(line[5:])
                if event.get("id") == request_id and ("result" in event or "error" in event):
                    return dict(event)
        raise TaskdeskError("the event stream ended without an answer", status=200)
    try:
        body = response.json()
    except ValueError as exc:
        raise Refused(
            f"HTTP {response.status_code} without a JSON-RPC body: {response.text[:200]!r}",
            status=response.status_code,
        ) from exc
    if not isinstance(body, dict) or not ("result" in body or "error" in body):
        raise Refused(f"not a JSON-RPC response: {body!r}"[:300], status=response.status_code)
    return body


@dataclass
class Handle:
    """One submission: its key, and once the receipt arrived, its task (``task_id``).

    A tool that runs synchronously (its policy forbids tasks) has no task: ``task_id`` is
    None and ``result()`` returns its result straight away."""

    client: Client
    key: str | None
    tool: str | None
    arguments: dict[str, Any]
    receipt: dict[str, Any]
    task: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.is_task and not self.task:
            self.task = dict(self.receipt)

    @property
    def is_task(self) -> bool:
        return self.receipt.get("resultType") == "task"

    @property
    def task_id(self) -> str | None:
        value = self.receipt.get("taskId") if self.is_task else None
        return value if isinstance(value, str) else None

    @property
    def replayed(self) -> bool:
        """True when the server answered with a receipt it had given before (a retry)."""
        return bool((self.receipt.get("_meta") or {}).get(REPLAYED_META))

    @property
    def status(self) -> str:
        return str(self.task.get("status")) if self.is_task else "completed"

    @property
    def input_requests(self) -> dict[str, Any]:
        """The open questions of an ``input_required`` task, by key."""
        requests = self.task.get("inputRequests") if self.status == "input_required" else None
        return dict(requests or {})

    def _task_request(self, method: str, **params: Any) -> dict[str, Any]:
        if self.task_id is None:
            raise TaskdeskError(f"{self.tool} ran synchronously: there is no task to {method}")
        return self.client.request(method, {"taskId": self.task_id, **params})

    def refresh(self) -> dict[str, Any]:
        """``tasks/get`` once; returns (and keeps) the task."""
        self.task = self._task_request("tasks/get")
        return self.task

    def wait(self, timeout: float | None = None, *, until_input: bool = False) -> dict[str, Any]:
        """Poll ``tasks/get`` every ``pollIntervalMs`` until the task ends (or, with
        UNTIL_INPUT, until it waits for input); return the task. TimeoutError after TIMEOUT
        seconds."""
        if not self.is_task:
            return self.receipt
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            task = self.refresh()
            status = task.get("status")
            if status in TERMINAL or (until_input and status == "input_required"):
                return task
            interval = task.get("pollIntervalMs")
            pause = interval / 1000 if isinstance(interval, int | float) and interval > 0 else 1.0
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"task {self.task_id} is still {status} after {timeout} s")
                pause = min(pause, left)
            self.client.sleep(pause)

    def answer(
        self, key: str, content: Mapping[str, Any] | None = None, *, action: str = "accept"
    ) -> None:
        """Answer the task's input request KEY (``tasks/update``)."""
        response: dict[str, Any] = {"action": action}
        if content is not None:
            response["content"] = dict(content)
        self._task_request("tasks/update", inputResponses={key: response})

    def cancel(self) -> None:
        """Ask for the task to stop (``tasks/cancel``); ``wait()`` then sees ``cancelled``."""
        self._task_request("tasks/cancel")

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        """Wait for the end and return the ``CallToolResult`` (a tool error is a result with
        ``isError: true``). A failed task raises TaskFailed, a cancelled one TaskCancelled."""
        if not self.is_task:
            return self.receipt
        task = self.wait(timeout)
        if task["status"] == "completed":
            result: dict[str, Any] = task["result"]
            return result
        if task["status"] == "cancelled":
            raise TaskCancelled(f"task {self.task_id} was cancelled")
        error = task.get("error") or {}
        raise TaskFailed(
            str(error.get("message", "the task failed")),
            code=error.get("code"),
            data=error.get("data"),
        )

    def call_tool_result(self, timeout: float | None = None) -> mcp_types.CallToolResult:
        """``result()`` as the official MCP SDK's ``CallToolResult`` (needs the ``mcp``
        package: ``pip install 'taskdesk-client[mcp]'``)."""
        try:
            import mcp_types
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "call_tool_result needs the official MCP SDK: pip install 'taskdesk-client[mcp]'"
            ) from exc
        return mcp_types.CallToolResult.model_validate(self.result(timeout))
