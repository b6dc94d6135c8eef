"""Held streams (the 2025 ``GET`` stream and blocking ``tasks/result``): their slots.

Each held stream keeps one request thread of its web process busy for as long as it is
open. ``TASKDESK_MAX_STREAMS`` bounds how many one process holds and
``TASKDESK_MAX_STREAMS_PER_CLIENT`` how many one client holds across processes, within the
process's bound on all held work (``limits.held_slots``), so streams can never take every
thread and leave none for short requests: beyond a bound the request is refused at once with
429 ``busy`` and ``Retry-After`` (the client polls ``tasks/get`` meanwhile, or retries). A
slot is taken with ``take()`` and given back by closing the returned ``Slot`` (it is a
context manager too).

A client that goes away must give its slot back soon, not at the next keep-alive write:
``peer_gone`` looks at the request's socket (gunicorn puts it in the WSGI environ) without
reading from it, and the streams ask it about once a second.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Callable
from types import TracebackType
from typing import Any

from tasks_app.mcp import limits


class Slot:
    def __init__(self, release: Callable[[], None]) -> None:
        self._release = release

    def close(self) -> None:
        self._release()  # gives back once, however often it is called

    def __enter__(self) -> Slot:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def take(client: int | None = None) -> Slot:
    """A stream slot of this process (and of CLIENT, when given); raise 429 ``busy`` when
    none is free."""
    return Slot(limits.stream_slots.take(client=client))


def held() -> int:
    return limits.stream_slots.used


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
