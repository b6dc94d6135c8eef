"""What every log line about a request or a task carries: its request id, client, tool, task.

A request (``tasks_app.middleware``) and a leg (``tasks_app.runtime.legs``) each open a
context with ``bound``; code below adds what it learns (``update``: the client once the token
is checked, the tool, the task id once accepted). ``ContextFilter`` copies the fields onto
every log record of the thread, so the JSON format writes them as fields and the text format
appends them. The context is a contextvar: a thread started for a request must run in a copy
of it (``contextvars.copy_context().run``) to keep it.

``origin()`` is what a dispatch record keeps of its context, so that the leg it starts, in a
worker process, logs the request id of the call that created the task.

While tracing is on (``tasks_app.tracing``) and a span is current, a record also gets the
span's ``trace_id`` and ``span_id`` (hex), which the JSON format writes as fields.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

# In the order the text format shows them.
FIELDS = ("request_id", "client", "method", "tool", "task_id", "leg", "code")
# What a dispatch record carries to its leg.
ORIGIN_FIELDS = ("request_id", "client")

_context: ContextVar[dict[str, Any] | None] = ContextVar("taskdesk_log_context", default=None)

# The current span's (trace id, span id), or None outside one; set by tracing.configure
# while tracing is on, and None while it is off, so that a record costs no more then.
trace_ids: Callable[[], tuple[str, str] | None] | None = None


def _present(fields: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None and value != ""}


def bound(**fields: Any) -> _Bound:
    """Open a context holding FIELDS (and the enclosing context's) until the block ends; the
    ``with`` statement gets the context."""
    return _Bound(fields)


class _Bound:
    # A class rather than a generator-based context manager: every request and leg opens one.
    __slots__ = ("_fields", "_token")

    def __init__(self, fields: dict[str, Any]) -> None:
        self._fields = fields

    def __enter__(self) -> dict[str, Any]:
        context = {**(_context.get() or {}), **_present(self._fields)}
        self._token = _context.set(context)
        return context

    def __exit__(self, *exc_info: object) -> None:
        _context.reset(self._token)


def update(**fields: Any) -> None:
    """Add FIELDS to the open context (nothing happens outside one)."""
    context = _context.get()
    if context is not None:
        context.update(_present(fields))


def get(name: str) -> Any:
    return (_context.get() or {}).get(name)


def origin() -> dict[str, Any]:
    """The fields a dispatch record keeps for its leg (empty outside a request)."""
    context = _context.get() or {}
    return {name: context[name] for name in ORIGIN_FIELDS if name in context}


class ContextFilter(logging.Filter):
    """Copy the open context's fields onto each record (a field the record already has,
    passed with ``extra=``, wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in (_context.get() or {}).items():
            if not hasattr(record, name):
                setattr(record, name, value)
        if trace_ids is not None and (ids := trace_ids()) is not None:
            record.trace_id, record.span_id = ids
        return True


# Control characters (and the Unicode line and paragraph separators) as escapes in the text
# format: a client's method or task id with a newline in it must not start a line of its own.
_ESCAPES = {
    **{code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))},
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def escaped(text: str) -> str:
    """TEXT with its control characters written as escapes (``\\n``, ``\\x1b``)."""
    return text.translate(_ESCAPES)


class TextFormatter(logging.Formatter):
    """``time level logger message``, then the context as ``name=value`` pairs in brackets.

    Control characters in the message and the fields are escaped, so one record is one line
    (a traceback, the server's own text, stays below it)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escaped(super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        pairs = [
            escaped(f"{name}={getattr(record, name)}") for name in FIELDS if hasattr(record, name)
        ]
        if not pairs:
            return line
        head, sep, rest = line.partition("\n")  # a traceback stays below the first line
        return f"{head} [{' '.join(pairs)}]{sep}{rest}"


class JsonFormatter(_JsonFormatter):
    """One JSON object per line: timestamp (ISO 8601, UTC), level, logger, message, the
    context fields, anything passed with ``extra=``, and ``exc_info`` for a traceback."""

    def __init__(self) -> None:
        super().__init__(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger"},
            timestamp=True,
            json_ensure_ascii=False,
        )
