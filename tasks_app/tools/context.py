"""The interface a tool function sees: ``ToolContext``.

Two implementations share it: the task runtime (``tasks_app.runtime``: journaled legs in a
Celery worker) and the synchronous path of the MCP endpoint (MRTR rounds, progress and log
notifications streamed on the response). Tool code is written once against this class.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

T = TypeVar("T")

Audience = Literal["client", "operator", "any"]
OnTimeout = Literal["decline", "default", "fail"]


@dataclass(frozen=True)
class Answer:
    """What a question got back: ``action`` is accept, decline or cancel."""

    action: Literal["accept", "decline", "cancel"]
    content: dict[str, Any] = field(default_factory=dict)

    @property
    def accepted(self) -> bool:
        return self.action == "accept"


@dataclass(frozen=True)
class Question:
    """One question of ``ctx.ask_many``; the fields mean what ``ctx.ask``'s arguments mean."""

    message: str
    schema: dict[str, Any] | None = None
    url: str | None = None
    audience: Audience = "client"
    deadline: datetime | timedelta | None = None
    on_timeout: OnTimeout = "decline"
    default: dict[str, Any] | None = None


class EffectHandle(abc.ABC):
    """Given inside ``with ctx.effect(...) as fx``: the stable key to pass downstream.

    ``done`` is true when the effect already happened on an earlier leg (recorded, verified
    or reconciled): a ``with`` block cannot skip its own body, so the body must check it
    (``if not fx.done: ...``). ``detail`` holds what ``record`` attached, on every leg.
    """

    key: str
    done: bool = False
    detail: dict[str, Any]

    @abc.abstractmethod
    def record(self, **detail: Any) -> None:
        """Attach JSON details (an external id, a path, a checksum) to the effect's outcome."""


@dataclass(frozen=True)
class Retry:
    """How ``ctx.step`` retries its function when it raises one of ON: up to ATTEMPTS runs in
    all, attempt n waiting ``min(max_delay, backoff ** n)`` seconds after the one before it
    (attempt 2 after 4 s with the default backoff of 2.0, then 8 s, 16 s, ...). Inside a task
    each wait ends the leg and schedules the next one, so the worker is free meanwhile."""

    attempts: int = 3
    backoff: float = 2.0
    max_delay: float = 60.0
    on: tuple[type[BaseException], ...] = (TimeoutError, ConnectionError)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("Retry needs attempts >= 1")
        if self.backoff < 1 or self.max_delay < 0:
            raise ValueError("Retry needs backoff >= 1 and max_delay >= 0")
        if not self.on or not all(
            isinstance(kind, type) and issubclass(kind, BaseException) for kind in self.on
        ):
            raise ValueError("Retry(on=...) needs a tuple of exception classes")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt ATTEMPT (2 is the first retry)."""
        return float(min(self.max_delay, self.backoff**attempt))

    def retries(self, exc: BaseException) -> bool:
        return isinstance(exc, self.on)


class ToolError(Exception):
    """Raise from a tool to end the call with ``isError: true`` and this message."""


class ProtocolError(Exception):
    """Raise from a tool to end the call with a JSON-RPC error (a task then ends ``failed``)."""

    def __init__(self, message: str, *, code: int = -32603, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.data = data


class MissingClientCapability(ProtocolError):
    """The client did not declare a capability the call needs (JSON-RPC -32021, with
    ``data.requiredCapabilities``): a question it cannot answer and no operator may answer
    for it, or an input kind a synchronous call's request does not declare. Uncaught, it ends
    the call (a task: ``failed``); a tool may catch it to do without the answer."""

    def __init__(self, message: str, *, required: dict[str, Any], **data: Any) -> None:
        super().__init__(message, code=-32021, data={"requiredCapabilities": required, **data})
        self.required = required


class Cancelled(Exception):
    """Raised at a checkpoint once cancellation of the task was requested."""


class EffectFailed(ToolError):
    """The body of ``ctx.effect(NAME)`` raised: the effect is recorded ``failed``.

    Raised from the ``with`` statement on the leg where the body failed and again, at the
    same point, on every later leg, so code that catches it behaves the same on replay.
    ``error_type`` names the original exception's class (the original is ``__cause__`` on
    the first leg).
    """

    def __init__(self, message: str, *, effect: str, error_type: str) -> None:
        super().__init__(message)
        self.effect = effect
        self.error_type = error_type


class StepFailed(ToolError):
    """``ctx.step(NAME, fn, retry=...)`` ran out of attempts on an earlier leg. (On the leg
    where the last attempt failed, the tool sees that attempt's own exception.)"""

    def __init__(self, message: str, *, step: str, error_type: str, attempts: int) -> None:
        super().__init__(message)
        self.step = step
        self.error_type = error_type
        self.attempts = attempts


class ToolContext(abc.ABC):
    """What a running tool may do. Every call is a cancellation checkpoint."""

    task_id: str | None

    @property
    @abc.abstractmethod
    def client_name(self) -> str:
        """The name of the MCP client whose call this is."""

    @property
    @abc.abstractmethod
    def tenant(self) -> str:
        """The tenant (slug) of that client."""

    def ask(
        self,
        key: str,
        *,
        message: str,
        schema: dict[str, Any] | None = None,
        url: str | None = None,
        audience: Audience = "client",
        deadline: datetime | timedelta | None = None,
        on_timeout: OnTimeout = "decline",
        default: dict[str, Any] | None = None,
    ) -> Answer:
        """Ask a question and return its answer (suspending the task until there is one)."""
        question = Question(
            message=message,
            schema=schema,
            url=url,
            audience=audience,
            deadline=deadline,
            on_timeout=on_timeout,
            default=default,
        )
        return self.ask_many({key: question})[key]

    @abc.abstractmethod
    def ask_many(self, questions: dict[str, Question]) -> dict[str, Answer]:
        """Ask several questions at once (all pending together) and return every answer."""

    def request_input(self, key: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send a raw input request (``sampling/createMessage``, ``roots/list``) and return
        the client's result. Only the synchronous (MRTR) path supports it."""
        raise ToolError(f"{method} input requests are not available inside a task")

    def request_inputs(
        self, requests: dict[str, tuple[str, dict[str, Any]]]
    ) -> dict[str, dict[str, Any]]:
        """Send several raw input requests at once (KEY -> (method, params)), all pending
        together, and return every result. Only the synchronous (MRTR) path supports it."""
        return {key: self.request_input(key, m, p) for key, (m, p) in requests.items()}

    def escalate(self) -> None:
        """From here on, run as a task (for tools declared with ``escalate=True``).

        On the synchronous path the call stops here and a task is created that replays the
        questions answered so far; inside a task this does nothing.
        """
        return None

    @abc.abstractmethod
    def effect(
        self,
        name: str,
        *,
        target: str = "",
        verify: Callable[[str], bool] | None = None,
        compensate: Callable[[str], None] | None = None,
        retry: Retry | None = None,
    ) -> AbstractContextManager[EffectHandle]:
        """Wrap one external side effect; it runs at most once per task. With RETRY, a body
        that raises one of ``retry.on`` runs again later with the same key."""

    @abc.abstractmethod
    def step(self, name: str, fn: Callable[[], T], *, retry: Retry | None = None) -> T:
        """Run FN once per task and memoize its (JSON) result; with RETRY, run it again when
        it raises one of ``retry.on`` (each failed attempt is journaled)."""

    @abc.abstractmethod
    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Report progress; it becomes the task's status message."""

    @abc.abstractmethod
    def log(self, level: str, message: str, **data: Any) -> None:
        """Log a line for the client (notifications/message on the synchronous path)."""

    @abc.abstractmethod
    def check_cancelled(self) -> None:
        """Raise Cancelled if cancellation was requested."""

    def sleep(self, seconds: float, *, every: float = 0.2) -> None:
        """Sleep SECONDS, checking for cancellation at least every EVERY seconds."""
        import time

        deadline = time.monotonic() + seconds
        while True:
            self.check_cancelled()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(every, left))

    def chunks(self, total: int, size: int) -> Iterator[range]:
        """Yield ranges covering 0..TOTAL in SIZE steps, checkpointing between them."""
        for start in range(0, total, size):
            self.check_cancelled()
            yield range(start, min(start + size, total))
