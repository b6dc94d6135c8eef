"""The exchange of ``tasks_app.outbound``: an answer read to its end on a kept-alive connection,
what is not an HTTP answer refused, a request that could end a line early never sent, and a
connection the receiver closed made again. Where requests may go is tested with its callers
(tests/tasks_app/test_webhooks.py, tests/tasks_app/oauth)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from tasks_app import outbound


@pytest.fixture(autouse=True)
def _loopback(settings):  # type: ignore[no-untyped-def]
    settings.TASKDESK_WEBHOOK_ALLOW_HTTP_LOOPBACK = True
    settings.TASKDESK_WEBHOOK_ALLOWED_NETWORKS = []


def _answered(raw: bytes) -> tuple[int, bool]:
    """What ``_read_answer`` makes of RAW, sent by a receiver that then keeps the socket."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.settimeout(2)
        theirs.sendall(raw)
        return outbound._read_answer(ours)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"HTTP/1.1 204 No Content\r\nServer: x\r\n\r\n", (204, True)),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", (200, True)),
        (b"HTTP/1.1 500 Oops\r\ncontent-length: 0\r\n\r\n", (500, True)),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n",
         (202, True)),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", (200, False)),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", (200, False)),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", (200, True)),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", (200, False)),
        (b"HTTP/1.1 200 OK\r\n\r\n", (200, False)),  # no length: read to the close
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + b"x" * 5000, (200, False)),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxy", (200, False)),  # more than said
        (b"HTTP/1.1 301 Moved\r\nLocation: https://elsewhere.test/\r\nContent-Length: 0\r\n\r\n",
         (301, True)),
    ],
    ids=["204", "a short body", "500", "an interim answer first", "connection close",
         "HTTP/1.0", "HTTP/1.0 keep-alive", "chunked", "no length", "longer than read",
         "bytes past the body", "a redirect"],
)  # fmt: skip
def test_an_answer_is_read_to_its_end_and_the_connection_kept_only_when_it_can_be(
    raw: bytes, expected: tuple[int, bool]
) -> None:
    assert _answered(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [b"SSH-2.0-OpenSSH_9.2\r\n\r\n", b"HTTP/1.1 2OO OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000],
    ids=["not HTTP", "no status code", "endless headers"],
)  # fmt: skip
def test_what_is_not_an_http_answer_is_refused(raw: bytes) -> None:
    with pytest.raises(outbound.BadAnswer):
        _answered(raw)


def test_a_receiver_that_closes_without_answering_is_an_attempts_error() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def hang_up() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    with server:
        answer = outbound.post(f"http://127.0.0.1:{port}/in", "{}", {})
    assert answer.status_code is None and not answer.ok
    assert answer.error == "Unanswered: the receiver closed the connection before answering"


@pytest.mark.parametrize(
    ("path", "headers"),
    [("/in", {"webhook-id": "msg_1\r\nX-Injected: 1"}), ("/in put", {})],
    ids=["a line break in a header", "a space in the path"],
)
def test_a_request_that_could_end_a_line_early_is_not_sent(
    path: str, headers: dict[str, str]
) -> None:
    with pytest.raises(ValueError):
        outbound._request_bytes(path, headers, b"{}")


def test_a_kept_alive_connection_the_receiver_closed_is_made_again_and_the_post_sent_again(
    settings,
) -> None:
    """Between a batch's deliveries the socket is not looked at (a system call each): when
    the receiver closed it meanwhile, the POST goes again over a new connection, once."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    requests: list[bytes] = []

    def serve() -> None:
        for _ in range(2):
            conn, _ = server.accept()
            with conn:
                requests.append(conn.recv(65536))
                conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
                # Closed at once after one answer, without saying so.

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with server, outbound.Connection(f"http://127.0.0.1:{port}/in") as sender:
        first = sender.post("{}", {"webhook-id": "msg_1"})
        time.sleep(0.05)  # the receiver's close has arrived
        second = sender.post("{}", {"webhook-id": "msg_2"})
    thread.join(5)
    assert (first.status_code, second.status_code) == (204, 204)
    assert [b"msg_1" in r for r in requests] == [True, False]
    assert b"msg_2" in requests[1]
