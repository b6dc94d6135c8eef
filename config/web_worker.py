"""The gunicorn worker of `make run`: gthread, but a request thread only gets whole requests.

gunicorn's ``gthread`` worker hands a connection to a request thread as soon as its first
bytes arrive, and the thread then reads the headers (and the body) with blocking reads that
no timeout bounds: a client that sends a header line every few seconds holds a thread for
as long as it likes, and a dozen such clients hold them all. ``HeaderTimeoutWorker`` reads
each request in the worker's poller instead, without blocking, and hands the connection to
the thread pool only once the request's headers are complete (and its body too, when it has
a ``Content-Length`` of at most ``MAX_BUFFERED_BODY`` bytes, as every MCP request has). A
connection whose request (its headers, and such a body) is not complete within
``TASKDESK_HEADER_TIMEOUT_SECONDS`` (10 s) of its first byte (of its accept, for a new
connection) is closed. What was read is put
back in front of the socket (the parser's unreader), so the request thread parses it as
gunicorn always does.

What a web process holds of requests still arriving, and of whole ones waiting for a thread,
is bounded by ``TASKDESK_READ_BUFFER_BYTES`` (32 MiB). Without it, one client opening many
connections that each send a large body slowly made a process buffer up to about 1.8 MB per
connection, for gunicorn's 1000 connections. A read that would go over it first refuses
the connection holding the most bytes still arriving (503, closed, logged): that is the one
sending a large request slowest, and a small request (a health check) still gets through.
A slow body is not handed to a thread instead: that would trade memory for the threads.
One address may have at most ``TASKDESK_READING_PER_ADDRESS`` (64) connections being read
at once in a process; one more is refused the same way. Else a client sending its headers
slowly, as such a client does by design, takes the process's 1000 connections (gunicorn's
``worker_connections``) and nobody else is accepted until they time out. The proxies gunicorn
trusts (``FORWARDED_ALLOW_IPS``, 127.0.0.1 by default) are not bounded: they speak for many.

TLS connections (gunicorn's own ``certfile``) keep gthread's behaviour: the handshake needs
a blocking socket. Production terminates TLS in the proxy (docs/deploy.md).
"""

from __future__ import annotations

import contextlib
import errno
import re
import selectors
import time
from collections import Counter
from functools import partial
from typing import Any

from gunicorn.http2 import negotiation  # type: ignore[import-untyped]
from gunicorn.workers.gthread import TConn, ThreadWorker  # type: ignore[import-untyped]

from .env import env_float, env_int

#: Read at most this much per request in the poller (headers plus a small body).
MAX_BUFFERED_BODY = 1024 * 1024
_HEADERS_END = re.compile(rb"\r?\n\r?\n")
_CONTENT_LENGTH = re.compile(rb"(?im)^content-length[ \t]*:[ \t]*(\d+)[ \t]*\r?$")
# A chunked body, or one the client sends only after "100 Continue", is read by the thread.
_BODY_LATER = re.compile(rb"(?im)^(transfer-encoding|expect)[ \t]*:")


def header_timeout() -> float:
    """``TASKDESK_HEADER_TIMEOUT_SECONDS``, at least 0.1 s; a malformed value raises
    ImproperlyConfigured naming it (config/env.py), which gunicorn's master reports in one
    line (config/gunicorn.conf.py reads it before any web process starts)."""
    return max(0.1, env_float("TASKDESK_HEADER_TIMEOUT_SECONDS", 10.0))


def read_buffer_bytes() -> int:
    """``TASKDESK_READ_BUFFER_BYTES``: at least 2 MiB, room for one request of the largest
    size read in the poller (gunicorn's head limits plus ``MAX_BUFFERED_BODY``)."""
    return env_int("TASKDESK_READ_BUFFER_BYTES", 32 * 1024 * 1024, minimum=2 * 1024 * 1024)


def reading_per_address() -> int:
    """``TASKDESK_READING_PER_ADDRESS``: connections of one address a process reads at
    once; 0 for no bound."""
    return env_int("TASKDESK_READING_PER_ADDRESS", 64, minimum=0)


def request_complete(data: bytes, limit: int) -> bool:
    """Whether DATA holds a whole request head (and its body, when it is small), or is
    already past what is worth buffering: then the request thread takes it from here."""
    return Arriving(limit).add(data)


class Arriving:
    """The bytes of one request as they arrive, and whether it is whole yet. Each byte is
    looked at once: a client that sends its request a few bytes at a time costs the poller
    the bytes it sends, not the bytes so far on every read."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self._scanned = 0  # how far the head's end was looked for
        self._whole_at: int | None = None  # once the head is read: the length to wait for

    def add(self, chunk: bytes) -> bool:
        """Add CHUNK; True once the request thread should take it (see request_complete)."""
        self.data += chunk
        if self._whole_at is None:
            # The end of the head is at most 4 bytes long: look again from just before
            # where the last look stopped.
            end = _HEADERS_END.search(self.data, max(0, self._scanned - 3))
            if end is None:
                self._scanned = len(self.data)
                return len(self.data) >= self.limit
            self._whole_at = _whole_at(bytes(self.data[: end.start()]), end.end())
        return len(self.data) >= self._whole_at


def _whole_at(head: bytes, body_start: int) -> int:
    """How many bytes make the request whole enough to hand on, given its HEAD: its body
    too when that is small and sized; else (0) the head is enough."""
    if _BODY_LATER.search(head):
        return 0
    length = _CONTENT_LENGTH.search(head)
    if length is None:
        return 0
    size = int(length.group(1))
    return 0 if size > MAX_BUFFERED_BODY else body_start + size


# The answer to a connection refused for want of buffer room, as the project's other 503s.
_BUSY = (
    b'{"jsonrpc": "2.0", "id": null, "error": {"code": -32000, "message": "The server is '
    b'reading too many requests at once; try again shortly", "data": {"reason": "busy", '
    b'"retryAfterMs": 1000}}}'
)


class _NowAndThen:
    """A log line at most every SECONDS: a client that makes the worker refuse or drop
    connections by the hundred must not write a line for each. The line after a quiet spell
    says how many were left out."""

    def __init__(self, seconds: float = 10.0) -> None:
        self.seconds = seconds
        self.next_at = 0.0
        self.left_out = 0

    def __call__(self, write: Any, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now < self.next_at:
            self.left_out += 1
            return
        if self.left_out:
            message += " (and %d more like it in the last %g s)"
            args = (*args, self.left_out, self.seconds)
        write(message, *args)
        self.left_out = 0
        self.next_at = now + self.seconds


REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY), _BUSY)
)


class HeaderTimeoutWorker(ThreadWorker):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout()
        self.refused_now_and_then = _NowAndThen()
        self.late_now_and_then = _NowAndThen()
        # Connections whose request is still arriving: conn -> (deadline, what came so far).
        self.reading: dict[TConn, tuple[float, Arriving]] = {}
        # Bytes of requests read here and not yet taken by a request thread, and their bound.
        self.buffered = 0
        self.buffer_limit = read_buffer_bytes()
        # Connections being read, by the address they come from, and their bound.
        self.reading_from: Counter[Any] = Counter()
        self.address_limit = reading_per_address()
        # A request head larger than gunicorn accepts is handed on (and refused there).
        self.head_limit = (
            self.cfg.limit_request_line
            + self.cfg.limit_request_fields * self.cfg.limit_request_field_size
            + 4096
        )

    # --- where gthread handed connections straight to a thread -----------------------------

    def accept(self, listener: Any) -> None:
        try:
            client_sock, client_addr = listener.accept()
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = TConn(self.cfg, client_sock, client_addr, listener.getsockname())  # non-blocking
        if not self.reads_requests(conn):
            client_sock.setblocking(True)
            self.enqueue_req(conn)
            return
        self.start_reading(conn)

    def on_client_socket_readable(self, conn: TConn, client: Any) -> None:
        """A kept-alive connection has its next request coming."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        if not self.reads_requests(conn):
            self.enqueue_req(conn)
            return
        self.start_reading(conn)

    def reads_requests(self, conn: TConn) -> bool:
        """Whether the poller reads CONN's requests: not over TLS (gunicorn's handshake needs
        a blocking socket) nor HTTP/2, whose preface gunicorn reads itself."""
        if self.cfg.is_ssl or conn.is_http2:
            return False
        return not negotiation.prior_knowledge_allowed(self.cfg, conn.client)

    # --- reading in the poller ------------------------------------------------------------

    def start_reading(self, conn: TConn) -> None:
        address = _address(conn)
        if (
            self.address_limit
            and self.reading_from[address] >= self.address_limit
            and not negotiation.peer_trusted_for_h2c(self.cfg, conn.client)  # a proxy
        ):
            self.refuse(
                conn,
                "TASKDESK_READING_PER_ADDRESS (%d) of its connections are being read",
                self.address_limit,
            )
            return
        limit = self.head_limit + MAX_BUFFERED_BODY
        self.reading[conn] = (time.monotonic() + self.header_timeout, Arriving(limit))
        self.reading_from[address] += 1
        # Often the whole request is there already (a kept-alive connection was readable):
        # then it goes to a thread without a round through the poller.
        if not self.read_some(conn):
            self.poller.register(
                conn.sock, selectors.EVENT_READ, partial(self.on_request_bytes, conn)
            )

    def on_request_bytes(self, conn: TConn, client: Any) -> None:
        if conn in self.reading and self.read_some(conn):
            with contextlib.suppress(OSError, KeyError, ValueError):
                self.poller.unregister(client)

    def read_some(self, conn: TConn) -> bool:
        """Read what CONN has sent; True once it is done here (handed on, or closed)."""
        _deadline, arriving = self.reading[conn]
        room = self.make_room(conn)
        if not room:
            return True  # CONN itself was refused
        try:
            chunk = conn.sock.recv(min(65536, room))
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self.drop(conn)  # the client closed the connection
            return True
        self.buffered += len(chunk)
        if not arriving.add(chunk):
            return False
        self.stop_reading(conn)
        conn.preread = bytes(arriving.data)  # still counted, until a thread takes it
        conn.data_ready = True
        self.enqueue_req(conn)
        return True

    def make_room(self, conn: TConn) -> int:
        """Room left in the buffer budget for CONN's next read. When there is none, the
        connection holding the most bytes still arriving is refused, until there is (or CONN
        itself was: then 0). Whole requests waiting for a thread are not refused."""
        while self.buffered >= self.buffer_limit:
            victim = max(self.reading, key=lambda c: len(self.reading[c][1].data))
            if not self.reading[victim][1].data:
                victim = conn  # the budget is all whole requests waiting: refuse the newcomer
            self.refuse(
                victim,
                "this web process holds TASKDESK_READ_BUFFER_BYTES (%d) of requests",
                self.buffer_limit,
            )
            if victim is conn:
                return 0
        return self.buffer_limit - self.buffered

    def taken(self, size: int) -> None:
        """A request thread took SIZE buffered bytes (in the poller's thread)."""
        self.buffered -= size

    def refuse(self, conn: TConn, why: str, *args: Any) -> None:
        """Answer CONN 503 busy (if it can take it at once), close it, and log WHY."""
        self.refused_now_and_then(
            self.log.warning,
            "refused a connection from %s with 503: " + why,
            _address(conn),
            *args,
        )
        with contextlib.suppress(OSError):
            conn.sock.send(REFUSED)
        self.drop(conn)

    def stop_reading(self, conn: TConn) -> Arriving | None:
        """Forget CONN among the connections being read; what it read is still counted."""
        reading = self.reading.pop(conn, None)
        if reading is None:
            return None
        address = _address(conn)
        self.reading_from[address] -= 1
        if not self.reading_from[address]:
            del self.reading_from[address]
        return reading[1]

    def drop(self, conn: TConn) -> None:
        arriving = self.stop_reading(conn)
        if arriving is not None:
            self.buffered -= len(arriving.data)
        with contextlib.suppress(OSError, KeyError, ValueError):
            self.poller.unregister(conn.sock)
        self.nr_conns -= 1
        conn.close()

    def murder_pending(self) -> None:
        super().murder_pending()
        now = time.monotonic()
        late = [conn for conn, (deadline, _) in self.reading.items() if deadline <= now]
        for conn in late:
            self.late_now_and_then(
                self.log.info,
                "closed a connection from %s: request headers not complete within %g s "
                "(TASKDESK_HEADER_TIMEOUT_SECONDS)",
                _address(conn),
                self.header_timeout,
            )
            self.drop(conn)

    # --- in the request thread ---------------------------------------------------------------

    def handle(self, conn: TConn) -> Any:
        preread = getattr(conn, "preread", None)
        if preread:
            conn.preread = None
            self.method_queue.defer(self.taken, len(preread))
            conn.sock.setblocking(True)
            conn.init()
            conn.parser.unreader.unread(preread)
        return super().handle(conn)


def _address(conn: TConn) -> Any:
    return conn.client[0] if isinstance(conn.client, tuple) else conn.client
