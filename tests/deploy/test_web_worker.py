"""When the web worker's poller hands a request on to a thread (config/web_worker.py).

Slow clients against live processes: tests/integration/test_web_tier.py."""

from __future__ import annotations

import time

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.web_worker import MAX_BUFFERED_BODY, Arriving, header_timeout, request_complete

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
