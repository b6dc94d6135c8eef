"""When the web worker's poller hands a request on to a thread (config/web_worker.py).

Slow clients against live processes: tests/integration/test_web_tier.py."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import time
from collections.abc import Iterator
from unittest import mock

import pytest
from django.core.exceptions import ImproperlyConfigured
from gunicorn.config import Config  # type: ignore[import-untyped]
from gunicorn.workers.gthread import TConn  # type: ignore[import-untyped]

from config.web_worker import (
    MAX_BUFFERED_BODY,
    Arriving,
    HeaderTimeoutWorker,
    header_timeout,
    read_buffer_bytes,
    reading_per_address,
    request_complete,
)

LIMIT = 100_000


@pytest.mark.parametrize(
    ("data", "complete"),
    [
        (b"GET /livez HTTP/1.1\r\nHost: x\r\n", False),  # headers still coming
        (b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n", True),
        (b"GET /livez HTTP/1.1\nHost: x\n\n", True),  # bare newlines, as gunicorn takes them
        (b"POST /mcp HTTP/1.1\r\nContent-Length: 5\r\n\r\n{}", False),  # the body is short
        (b'POST /mcp HTTP/1.1\r\ncontent-length:5\r\n\r\n{"a"}', True),
        (b'POST /mcp HTTP/1.1\r\nContent-Length: 5\r\n\r\n{"a"}GET / HTTP/1.1\r\n', True),
        # Bodies the thread reads: chunked, after 100 Continue, or larger than buffered.
        (b"POST /mcp HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", True),
        (b"POST /mcp HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 9\r\n\r\n", True),
        (f"POST / HTTP/1.1\r\nContent-Length: {MAX_BUFFERED_BODY + 1}\r\n\r\n".encode(), True),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * LIMIT, True),  # too long: the parser refuses it
    ],
)
def test_a_request_goes_to_a_thread_once_it_is_whole(data: bytes, complete: bool) -> None:
    assert request_complete(data, LIMIT) is complete


def test_the_header_timeout_comes_from_the_environment(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("TASKDESK_HEADER_TIMEOUT_SECONDS", raising=False)
    assert header_timeout() == 10.0
    monkeypatch.setenv("TASKDESK_HEADER_TIMEOUT_SECONDS", "2.5")
    assert header_timeout() == 2.5


def test_a_malformed_header_timeout_is_refused_naming_the_variable(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TASKDESK_HEADER_TIMEOUT_SECONDS", "abc")
    with pytest.raises(ImproperlyConfigured, match="TASKDESK_HEADER_TIMEOUT_SECONDS"):
        header_timeout()
    monkeypatch.setenv("TASKDESK_HEADER_TIMEOUT_SECONDS", "0")
    assert header_timeout() == 0.1  # as before: at least 0.1 s


def test_a_malformed_header_timeout_names_the_variable(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TASKDESK_HEADER_TIMEOUT_SECONDS", "soon")
    with pytest.raises(
        ImproperlyConfigured, match="TASKDESK_HEADER_TIMEOUT_SECONDS must be a number"
    ):
        header_timeout()


@pytest.mark.parametrize(
    "data",
    [
        b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n",
        b'POST /mcp HTTP/1.1\r\nContent-Length: 5\r\n\r\n{"a"}',
        b'POST /mcp HTTP/1.1\nContent-Length: 5\n\n{"a"}',
        b"POST /mcp HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
    ],
)
def test_a_request_sent_a_byte_at_a_time_is_whole_at_its_last_byte(data: bytes) -> None:
    arriving = Arriving(LIMIT)
    done = [arriving.add(data[i : i + 1]) for i in range(len(data))]
    assert done == [False] * (len(data) - 1) + [True]
    assert bytes(arriving.data) == data


def test_a_head_sent_in_small_pieces_costs_the_poller_its_bytes_only() -> None:
    # 800 KB of header lines, 100 bytes a read: looking at everything so far on every read
    # would scan 3 GB; each byte once is a few milliseconds.
    limit = 1_000_000
    arriving = Arriving(limit)
    line = b"X-Slow: " + b"a" * 90 + b"\r\n"
    started = time.perf_counter()
    assert not arriving.add(b"GET / HTTP/1.1\r\n")
    for _ in range(8_000):
        assert not arriving.add(line)
    assert arriving.add(b"\r\n")
    assert time.perf_counter() - started < 1


# --- what a web process holds of requests it is reading (TASKDESK_READ_BUFFER_BYTES) ---------

MiB = 1024 * 1024


def test_the_read_buffer_comes_from_the_environment(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("TASKDESK_READ_BUFFER_BYTES", raising=False)
    assert read_buffer_bytes() == 32 * MiB
    monkeypatch.setenv("TASKDESK_READ_BUFFER_BYTES", str(4 * MiB))
    assert read_buffer_bytes() == 4 * MiB
    # Less than one request of the largest size read in the poller is refused.
    monkeypatch.setenv("TASKDESK_READ_BUFFER_BYTES", "65536")
    with pytest.raises(ImproperlyConfigured, match="TASKDESK_READ_BUFFER_BYTES must be"):
        read_buffer_bytes()


class Worker:
    """A web process's worker without its process: requests it hands on are collected."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("TASKDESK_READ_BUFFER_BYTES", str(2 * MiB))
        self.worker = HeaderTimeoutWorker(1, os.getpid(), [], None, 30, Config(), mock.Mock())
        self.worker.poller = selectors.DefaultSelector()
        self.worker.method_queue.init()
        self.handed: list[TConn] = []
        monkeypatch.setattr(self.worker, "enqueue_req", self.handed.append)
        self.clients: list[socket.socket] = []

    def connect(self, address: str = "10.0.0.1") -> tuple[socket.socket, TConn]:
        client, server = socket.socketpair()
        self.clients.append(client)
        conn = TConn(self.worker.cfg, server, (address, 1234), ("127.0.0.1", 8000))
        self.worker.nr_conns += 1
        self.worker.start_reading(conn)
        return client, conn

    def send(self, client: socket.socket, conn: TConn, data: bytes) -> None:
        """CLIENT sends DATA, and the poller reads all of it that it takes."""
        client.setblocking(False)
        sent = 0
        while sent < len(data):
            with contextlib.suppress(BlockingIOError):
                sent += client.send(data[sent : sent + 65536])
            while conn in self.worker.reading and not self.worker.read_some(conn):
                if not select_readable(conn.sock):
                    break
            if conn not in self.worker.reading:
                return

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.worker.poller.close()
        self.worker.method_queue.close()


def select_readable(sock: socket.socket) -> bool:
    with selectors.DefaultSelector() as sel:
        sel.register(sock, selectors.EVENT_READ)
        return bool(sel.select(0))


@pytest.fixture
def web(monkeypatch: pytest.MonkeyPatch) -> Iterator[Worker]:
    web = Worker(monkeypatch)
    yield web
    web.close()


def body_request(size: int) -> bytes:
    return f"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode()


def test_bytes_are_counted_while_they_arrive_and_until_a_thread_takes_them(web) -> None:  # type: ignore[no-untyped-def]
    client, conn = web.connect()
    head = body_request(1000)
    web.send(client, conn, head + b"a" * 400)
    assert web.worker.buffered == len(head) + 400
    web.send(client, conn, b"a" * 600)
    assert web.handed == [conn]  # whole: handed on, its bytes still held
    assert web.worker.buffered == len(head) + 1000
    web.worker.taken(len(conn.preread))  # what the request thread's handle() reports
    assert web.worker.buffered == 0


def test_a_connection_that_closes_or_times_out_gives_its_bytes_back(web) -> None:  # type: ignore[no-untyped-def]
    client, conn = web.connect()
    web.send(client, conn, body_request(5000) + b"a" * 100)
    other, late = web.connect()
    web.send(other, late, b"GET / HTTP/1.1\r\n")
    assert web.worker.buffered > 100
    client.close()
    web.worker.read_some(conn)  # the end of the stream
    assert web.worker.buffered == len(b"GET / HTTP/1.1\r\n")
    web.worker.reading[late] = (0.0, web.worker.reading[late][1])
    web.worker.murder_pending()
    assert web.worker.buffered == 0
    assert web.worker.reading == {}


def test_a_full_buffer_refuses_the_connection_holding_most_and_a_small_request_gets_through(  # type: ignore[no-untyped-def]
    web,
) -> None:
    # Slow senders of 1 MiB bodies fill the 2 MiB budget between them.
    big, big_conn = web.connect()
    web.send(big, big_conn, body_request(MAX_BUFFERED_BODY) + b"a" * 1_000_000)
    mid, mid_conn = web.connect()
    web.send(mid, mid_conn, body_request(MAX_BUFFERED_BODY) + b"a" * 600_000)
    slow, slow_conn = web.connect()
    web.send(slow, slow_conn, body_request(MAX_BUFFERED_BODY) + b"a" * 600_000)
    assert web.worker.buffered <= web.worker.buffer_limit
    assert big_conn not in web.worker.reading  # refused when the third needed room
    assert list(web.worker.reading) == [mid_conn, slow_conn]
    assert web.handed == []
    big.settimeout(5)
    answer = big.recv(4096)
    assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"Retry-After: 1\r\n" in answer
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["data"] == {"reason": "busy", "retryAfterMs": 1000}
    web.worker.log.warning.assert_called()
    assert "TASKDESK_READ_BUFFER_BYTES" in web.worker.log.warning.call_args.args[0]

    # Full again: a health check's read refuses the largest holder, and gets through.
    room = web.worker.buffer_limit - web.worker.buffered
    web.send(mid, mid_conn, b"a" * (room // 2 - 10))
    web.send(slow, slow_conn, b"a" * (room - room // 2 + 10))
    assert web.worker.buffered == web.worker.buffer_limit
    assert list(web.worker.reading) == [mid_conn, slow_conn]
    probe, probe_conn = web.connect()
    web.send(probe, probe_conn, b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
    assert web.handed == [probe_conn]
    assert list(web.worker.reading) == [mid_conn]  # slow held the most
    assert web.worker.buffered <= web.worker.buffer_limit


def test_whole_requests_waiting_for_a_thread_are_not_refused(web) -> None:  # type: ignore[no-untyped-def]
    waiting = []
    for _ in range(2):
        client, conn = web.connect()
        web.send(
            client, conn, body_request(MAX_BUFFERED_BODY - 100) + b"a" * (MAX_BUFFERED_BODY - 100)
        )
        waiting.append(conn)
    assert web.handed == waiting
    # Nearly all the budget is whole requests no thread has taken yet: a newcomer that
    # needs more room is refused itself, and they stay queued.
    client, conn = web.connect()
    web.send(client, conn, body_request(200_000) + b"a" * 200_000)
    assert conn not in web.worker.reading
    client.settimeout(5)
    assert client.recv(64).startswith(b"HTTP/1.1 503")
    assert web.handed == waiting


# --- connections of one address being read at once (TASKDESK_READING_PER_ADDRESS) ----------


def test_the_bound_per_address_comes_from_the_environment(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("TASKDESK_READING_PER_ADDRESS", raising=False)
    assert reading_per_address() == 64
    monkeypatch.setenv("TASKDESK_READING_PER_ADDRESS", "0")
    assert reading_per_address() == 0  # no bound
    monkeypatch.setenv("TASKDESK_READING_PER_ADDRESS", "-1")
    with pytest.raises(ImproperlyConfigured, match="TASKDESK_READING_PER_ADDRESS must be"):
        reading_per_address()


def test_one_address_may_have_so_many_connections_being_read(web) -> None:  # type: ignore[no-untyped-def]
    web.worker.address_limit = 3
    slow = [web.connect() for _ in range(3)]
    for client, conn in slow:
        web.send(client, conn, b"GET /livez HTTP/1.1\r\n")  # and the rest, slowly
    assert web.worker.reading_from == {"10.0.0.1": 3}

    client, conn = web.connect()  # one more from the same address: refused at once
    assert conn not in web.worker.reading
    client.settimeout(5)
    assert client.recv(64).startswith(b"HTTP/1.1 503 Service Unavailable")
    assert "TASKDESK_READING_PER_ADDRESS" in web.worker.log.warning.call_args.args[0]

    # Other addresses, and the proxies gunicorn trusts (127.0.0.1 by default), are read.
    web.connect("10.0.0.2")
    for _ in range(4):
        web.connect("127.0.0.1")
    assert web.worker.reading_from == {"10.0.0.1": 3, "10.0.0.2": 1, "127.0.0.1": 4}

    # A request that is whole makes room for the next connection of its address.
    client, conn = slow[0]
    web.send(client, conn, b"Host: x\r\n\r\n")
    assert web.handed == [conn]
    _, again = web.connect()
    assert again in web.worker.reading
    assert web.worker.reading_from["10.0.0.1"] == 3
    for conn in list(web.worker.reading):
        web.worker.drop(conn)
    assert web.worker.reading_from == {}


def test_refusals_by_the_hundred_write_a_line_now_and_then() -> None:
    from config.web_worker import _NowAndThen

    lines: list[str] = []
    quiet = _NowAndThen(seconds=0.2)
    for n in range(100):
        quiet(lambda message, *args: lines.append(message % args), "refused %d", n)
    assert lines == ["refused 0"]
    time.sleep(0.25)
    quiet(lambda message, *args: lines.append(message % args), "refused %d", 100)
    assert lines[1] == "refused 100 (and 99 more like it in the last 0.2 s)"
