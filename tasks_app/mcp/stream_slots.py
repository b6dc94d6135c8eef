"""A per-process bound on held streams (the 2025 ``GET`` stream and blocking ``tasks/result``).

Each held stream keeps one request thread of its web process busy for as long as it is
open. ``TASKDESK_MAX_STREAMS`` bounds how many one process holds, so streams can never take
every thread and leave none for short requests: beyond it the request is refused with 503 and
``Retry-After`` (the client polls ``tasks/get`` meanwhile, or retries). A slot is taken with
``take()`` and given back by closing the returned ``Slot`` (it is a context manager too).

A client that goes away must give its slot back soon, not at the next keep-alive write:
``peer_gone`` looks at the request's socket (gunicorn puts it in the WSGI environ) without
reading from it, and the streams ask it about once a second.
"""

from __future__ import annotations

import select
import socket
import threading
from types import TracebackType
from typing import Any

from django.conf import settings

from tasks_app.mcp.errors import McpError

RETRY_AFTER_SECONDS = 5

_lock = threading.Lock()
_held = 0


class StreamsExhausted(McpError):
    code = -32603
    http_status = 503

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"This server process already holds {limit} open streams "
            "(TASKDESK_MAX_STREAMS); retry later, or poll tasks/get meanwhile",
            data={"retryAfterSeconds": RETRY_AFTER_SECONDS},
        )

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(RETRY_AFTER_SECONDS)}


class Slot:
    def __init__(self) -> None:
        self._open = True

    def close(self) -> None:
        global _held
        with _lock:
            if self._open:
                self._open = False
                _held -= 1

    def __enter__(self) -> Slot:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def take() -> Slot:
    """A stream slot of this process; raise StreamsExhausted when all are held."""
    global _held
    limit = settings.TASKDESK_MAX_STREAMS
    with _lock:
        if _held >= limit:
            raise StreamsExhausted(limit)
        _held += 1
    return Slot()


def held() -> int:
    return _held


def peer_gone(request: Any) -> bool:
    """Whether the client of REQUEST closed its connection (False when it cannot be told)."""
    meta = getattr(request, "META", None) or {}
    sock = meta.get("gunicorn.socket")
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        # Readable with nothing to read is the peer's end of the connection.
        return bool(sock.recv(1, socket.MSG_PEEK) == b"")
    except (OSError, ValueError):
        return True
