"""A web tier that one hostile client cannot starve, against live gunicorn processes.

- Held work (streams, synchronous runs, the 2025-era ``tasks/cancel`` wait) is bounded per
  process and per client, and all of it together leaves each process its reserved threads:
  a client that opens every stream and synchronous run it may, plus ``tasks/cancel`` waits
  on a leg that never reaches a checkpoint, gets 429 ``busy`` at once for the rest, while
  health checks, the login page and another tenant's ``tasks/get`` and task-creating
  ``tools/call`` keep answering within a second.
- Clients that send their headers a line every two seconds are dropped after
  ``TASKDESK_HEADER_TIMEOUT_SECONDS`` and never hold a request thread: ``/livez`` keeps
  answering within a second meanwhile.
- Clients that send large bodies slowly over many connections do not grow a web process's
  memory past ``TASKDESK_READ_BUFFER_BYTES`` (the connections holding most are refused with
  503), and ``/livez`` keeps answering within a second meanwhile.
- One address may have ``TASKDESK_READING_PER_ADDRESS`` connections being read at once; one
  more is refused with 503, and room comes back as they end.
- The nginx configuration of deploy/ serves the stack (skipped when nginx is not installed).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.live import ROOT, free_port, live_stack, stop_process, wait_for
from tests.wire import (
    HANDSHAKE_VERSION,
    SESSION_HEADER,
    HandshakeSession,
    post,
    result_of,
    rpc,
    tasks_get,
    tools_call,
)

pytestmark = [pytest.mark.live]

PROBE_SECONDS = 8.0


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[max(0, int(len(ordered) * 0.99) - 1)]


def timed(call: Callable[[], httpx.Response]) -> tuple[float, httpx.Response]:
    began = time.monotonic()
    response = call()
    return time.monotonic() - began, response


def open_session(url: str, token: str) -> str:
    session = HandshakeSession(url, token)
    session.connect()
    assert session.session is not None
    return session.session


@pytest.mark.slow
def test_a_hostile_client_cannot_starve_quick_requests(
    transactional_db, alice_token, bob_token
) -> None:
    from django.utils import timezone

    from tasks_app.models import Task

    # The shipped defaults (8 threads, 2 reserved: 6 held per process, 3 synchronous and 3
    # streams; 4 streams per client), except that one client may hold 16 synchronous runs:
    # so its streams meet the per-client bound and its runs the per-process one. Sixteen
    # runs, because the kernel hands connections to the two processes unevenly: with eight,
    # one process could get two or fewer and keep a slot free, where the test's own extra
    # call was then rightly admitted (seen once in CI).
    env = {
        "WEB_WORKERS": "2",
        "TASKDESK_SYNC_PER_CLIENT": "16",
        "TASKDESK_CANCEL_WAIT_SECONDS": "60",
        "TASKDESK_SYNC_MAX_SECONDS": "60",
    }
    with live_stack(env=env, worker=False, beat=False) as stack:
        mcp = stack.mcp_url
        # Two of alice's tasks whose leg has stopped: leased by a worker that never reaches
        # a checkpoint, so a 2025-era tasks/cancel waits its whole TASKDESK_CANCEL_WAIT.
        stuck = [
            result_of(post(mcp, tools_call("slow_echo", {"text": f"c{i}"}, token=alice_token)))
            for i in range(2)
        ]
        Task.objects.filter(pk__in=[t["taskId"] for t in stuck]).update(
            lease_owner="stopped-worker",
            lease_expires_at=timezone.now() + datetime.timedelta(hours=1),
        )
        bobs = result_of(post(mcp, tools_call("slow_echo", {"text": "b"}, token=bob_token)))
        session = open_session(mcp, alice_token)
        cancels = ",".join(t["taskId"] for t in stuck * 4)  # 8 tasks/cancel waits

        args = [mcp, alice_token, session, cancels, "8", "16"]  # 8 streams, 16 runs
        hostile = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.hostile", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert hostile.stdout is not None
            line = hostile.stdout.readline()
            assert line, hostile.stderr.read() if hostile.stderr else ""
            attempts = json.loads(line)

            latencies: dict[str, list[float]] = {}
            extra: list[tuple[float, httpx.Response]] = []
            probes: dict[str, Callable[[], httpx.Response]] = {
                "/livez": lambda: httpx.get(f"{stack.url}/livez", timeout=10),
                "/readyz": lambda: httpx.get(f"{stack.url}/readyz", timeout=10),
                "login page": lambda: httpx.get(f"{stack.url}/accounts/login/", timeout=10),
                "bob tasks/get": lambda: post(mcp, tasks_get(bobs["taskId"], token=bob_token)),
                "bob tools/call": lambda: post(
                    mcp, tools_call("slow_echo", {"text": "t"}, token=bob_token)
                ),
            }
            stream_headers = {
                "Authorization": f"Bearer {alice_token}",
                "Accept": "text/event-stream",
                "MCP-Protocol-Version": HANDSHAKE_VERSION,
                SESSION_HEADER: session,
            }
            sync = tools_call(
                "slow_echo", {"text": "x", "seconds": 20}, tasks=False, token=alice_token
            )
            deadline = time.monotonic() + PROBE_SECONDS
            while time.monotonic() < deadline:
                for name, probe in probes.items():
                    seconds, response = timed(probe)
                    assert response.status_code in (200, 503), (name, response.text)
                    if name != "/readyz":  # no worker runs: /readyz says so, quickly
                        assert response.status_code == 200, (name, response.text)
                    latencies.setdefault(name, []).append(seconds)
                # The hostile client's further held calls are refused at once.
                extra.append(timed(lambda: post(mcp, sync, timeout=10)))
                extra.append(timed(lambda: httpx.get(mcp, headers=stream_headers, timeout=10)))
                time.sleep(0.05)
        finally:
            hostile.kill()
            hostile.wait(10)

    held = [
        a for a in attempts if a["status"] == 0 or (a["kind"] == "stream" and a["status"] == 200)
    ]
    refused = [a for a in attempts if a["status"] == 429]
    assert len(held) + len(refused) == len(attempts) == 32, attempts
    assert all(
        a["reason"] == "busy" and a["retry_after"] == "1" and a["seconds"] < 1 for a in refused
    ), refused
    held_streams = sum(a["kind"] == "stream" for a in held)
    held_runs = len(held) - held_streams
    assert 1 <= held_streams <= 4, attempts  # TASKDESK_MAX_STREAMS_PER_CLIENT
    assert 1 <= held_runs <= 6, attempts  # TASKDESK_SYNC_CONCURRENCY x 2 processes
    assert all(r.status_code == 429 for _, r in extra), [r.text for _, r in extra]
    assert all(r.json()["error"]["data"]["reason"] == "busy" for _, r in extra)
    slowest_extra = max(s for s, _ in extra)
    report = {name: f"{p99(s) * 1000:.0f} ms over {len(s)}" for name, s in latencies.items()}
    print(
        f"held {held_runs} runs + {held_streams} streams; p99 {report}; 429s within "
        f"{max(a['seconds'] for a in refused) * 1000:.0f} ms, extra {slowest_extra * 1000:.0f} ms"
    )
    # Held, they would wait for the runs (20 s); alone they take 30-45 ms, and a machine busy
    # with the rest of the suite has answered one in just over 1 s.
    assert slowest_extra < 2, slowest_extra
    for name, samples in latencies.items():
        assert p99(samples) < 1, (name, report)


SLOW_SOCKETS = 20


def test_clients_that_send_their_headers_slowly_are_dropped_and_hold_no_thread(
    transactional_db,
) -> None:
    env = {"WEB_WORKERS": "2", "TASKDESK_HEADER_TIMEOUT_SECONDS": "6"}
    with live_stack(env=env, worker=False, beat=False) as stack:
        dropped: list[float] = []
        stop = threading.Event()

        def slow_client() -> None:
            began = time.monotonic()
            with socket.create_connection(("127.0.0.1", stack.port)) as sock:
                sock.sendall(b"GET /livez HTTP/1.1\r\n")
                with contextlib.suppress(OSError):
                    for i in range(30):
                        # A header line every 2 s, watching for the server to close.
                        readable, _, _ = select.select([sock], [], [], 2)
                        if stop.is_set():
                            return
                        if readable:
                            try:
                                closed = sock.recv(1) == b""
                            except OSError:  # reset: the server closed with bytes unread
                                closed = True
                            if closed:
                                dropped.append(time.monotonic() - began)
                            return
                        sock.sendall(f"X-Slow-{i}: a\r\n".encode())

        slow = [threading.Thread(target=slow_client, daemon=True) for _ in range(SLOW_SOCKETS)]
        for thread in slow:
            thread.start()
        latencies = []
        deadline = time.monotonic() + 12  # through the timeout and after it
        try:
            while time.monotonic() < deadline:
                seconds, response = timed(lambda: httpx.get(f"{stack.url}/livez", timeout=10))
                assert response.status_code == 200
                latencies.append(seconds)
                time.sleep(0.05)
            wait_for("every slow client to be dropped", lambda: len(dropped) == SLOW_SOCKETS, 10)
        finally:
            stop.set()
        log = stack.log("web")

    print(
        f"/livez p99 {p99(latencies) * 1000:.0f} ms over {len(latencies)}; slow clients "
        f"dropped after {min(dropped):.1f}-{max(dropped):.1f} s"
    )
    # A held thread would keep /livez waiting until the slow clients are dropped (6 s); a
    # machine busy with the rest of the suite has answered it in just over 1 s.
    assert p99(latencies) < 2
    assert all(6 <= d < 6 + 1.5 for d in dropped), dropped  # swept once a second
    assert "request headers not complete within 6 s" in log


SLOW_BODIES = 240
BODY_SIZE = 1_000_000


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_clients_that_send_large_bodies_slowly_cannot_grow_a_web_process(
    transactional_db,
) -> None:
    # Without the bound, 240 connections each holding 900 KB of a 1 MB body would make the
    # two web processes buffer about 100 MB each.
    budget = 8 * 1024 * 1024
    env = {
        "WEB_WORKERS": "2",
        "TASKDESK_HEADER_TIMEOUT_SECONDS": "30",  # the bodies outlive the test
        "TASKDESK_READ_BUFFER_BYTES": str(budget),
    }
    with live_stack(env=env, worker=False, beat=False) as stack:
        # The first web process may answer the stack's readiness check before the master has
        # forked the second (it waits up to 0.1 s between forks).
        def both_web_processes() -> list[int] | None:
            pids = stack.pool_pids("web")
            return pids if len(pids) == 2 else None

        pids = wait_for("both web processes", both_web_processes, 10)
        for _ in range(20):  # warm: the processes' own memory before the bodies
            httpx.get(f"{stack.url}/livez", timeout=10)
        before = {pid: rss_bytes(pid) for pid in pids}
        refused: list[bytes] = []  # what a refused client read (b"" when reset)
        stop = threading.Event()
        head = (
            f"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {BODY_SIZE}\r\n\r\n"
        ).encode()

        def slow_body() -> None:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", stack.port)) as sock,
            ):
                sock.sendall(head)
                for _ in range(15):  # 900 KB at once-ish, then a byte a second
                    sock.sendall(b"a" * 60_000)
                    time.sleep(0.02)
                while not stop.is_set():
                    readable, _, _ = select.select([sock], [], [], 1)
                    if readable:
                        try:
                            refused.append(sock.recv(4096))
                        except OSError:  # reset: closed with bytes of the body unread
                            refused.append(b"")
                        return
                    sock.sendall(b"a")

        slow = [threading.Thread(target=slow_body, daemon=True) for _ in range(SLOW_BODIES)]
        for thread in slow:
            thread.start()
        latencies = []
        peak = dict(before)
        deadline = time.monotonic() + 10
        try:
            while time.monotonic() < deadline:
                seconds, response = timed(lambda: httpx.get(f"{stack.url}/livez", timeout=10))
                assert response.status_code == 200
                latencies.append(seconds)
                for pid in pids:
                    peak[pid] = max(peak[pid], rss_bytes(pid))
                time.sleep(0.05)
        finally:
            stop.set()
        log = stack.log("web")

    growth = {pid: peak[pid] - before[pid] for pid in pids}
    print(
        f"/livez p99 {p99(latencies) * 1000:.0f} ms over {len(latencies)}; RSS growth "
        f"{', '.join(f'{g / 2**20:.1f} MiB' for g in growth.values())}; "
        f"{len(refused)} connections refused and seen by "
        f"their client ({sum(r.startswith(b'HTTP/1.1 503') for r in refused)} read the 503)"
    )
    # A web process whose poller were stuck in the bodies would keep /livez waiting for its
    # 10 s timeout. This test's own 240 sending threads share the GIL with its /livez calls:
    # in a busy suite on a slower machine one took 1.2 s.
    assert p99(latencies) < 2
    # The budget, plus what the allocator keeps of buffers it has freed.
    assert all(g < budget * 4 for g in growth.values()), growth
    assert refused and all(r.startswith(b"HTTP/1.1 503") for r in refused if r), refused[:3]
    assert "holds TASKDESK_READ_BUFFER_BYTES (8388608) of requests" in log


def test_one_address_may_have_so_many_connections_being_read(transactional_db) -> None:
    # 127.0.0.1 is not a trusted proxy here, so the bound applies to the test's connections.
    env = {
        "WEB_WORKERS": "1",
        "TASKDESK_READING_PER_ADDRESS": "4",
        "FORWARDED_ALLOW_IPS": "10.9.9.9",
    }
    with live_stack(env=env, worker=False, beat=False) as stack:
        address = ("127.0.0.1", stack.port)
        slow = [socket.create_connection(address) for _ in range(4)]
        try:
            for sock in slow:
                sock.sendall(b"GET /livez HTTP/1.1\r\n")  # and the rest, slowly
            time.sleep(0.5)  # all four accepted and being read
            with socket.create_connection(address, timeout=5) as sock:
                sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
                refused = sock.recv(4096)
            slow.pop().close()
            wait_for(
                "room for one more connection",
                lambda: _answers(f"{stack.url}/livez"),
                timeout=5,
            )
        finally:
            for sock in slow:
                sock.close()
        log = stack.log("web")

    assert refused.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), refused
    assert b'"reason": "busy"' in refused
    assert "TASKDESK_READING_PER_ADDRESS (4) of its connections are being read" in log


NGINX = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None
)


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)")
def test_the_nginx_configuration_serves_the_stack(transactional_db, alice_token) -> None:
    conf = (ROOT / "deploy" / "nginx" / "taskdesk.conf").read_text()
    env = {"WEB_WORKERS": "1", "TASKDESK_KEEPALIVE_SECONDS": "1"}
    with live_stack(env=env, worker=False, beat=False) as stack:
        port = free_port()
        tmp = stack.tmp / "nginx"  # goes with the stack's files
        tmp.mkdir()
        # The shipped server block, on test ports, inside a minimal nginx.conf.
        site = conf.replace("127.0.0.1:8000", f"127.0.0.1:{stack.port}").replace(
            "listen 80;", f"listen 127.0.0.1:{port};"
        )
        assert site != conf
        (tmp / "taskdesk.conf").write_text(site)
        (tmp / "nginx.conf").write_text(
            "pid nginx.pid;\nerror_log stderr warn;\nevents {}\nhttp {\n"
            "  access_log off;\n"
            f"  client_body_temp_path {tmp}/body;\n  proxy_temp_path {tmp}/proxy;\n"
            f"  fastcgi_temp_path {tmp}/f;\n  uwsgi_temp_path {tmp}/u;\n"
            f"  scgi_temp_path {tmp}/s;\n"
            "  include taskdesk.conf;\n}\n"
        )
        nginx = subprocess.Popen(
            [str(NGINX), "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-g", "daemon off;"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for("nginx to listen", lambda: _answers(f"{url}/livez"), timeout=15)
            assert httpx.get(f"{url}/livez").status_code == 200
            created = result_of(
                post(f"{url}/mcp", tools_call("slow_echo", {"text": "n"}, token=alice_token))
            )
            got = result_of(post(f"{url}/mcp", tasks_get(created["taskId"], token=alice_token)))
            assert got["taskId"] == created["taskId"]
            # An SSE stream passes through unbuffered: its first event arrives at once.
            session = open_session(f"{url}/mcp", alice_token)
            body = json.dumps(rpc("tasks/result", {"taskId": created["taskId"]}, id=9))
            headers = {
                "Authorization": f"Bearer {alice_token}",
                "Content-Type": "application/json",
                "Accept": "text/event-stream, application/json",
                "MCP-Protocol-Version": HANDSHAKE_VERSION,
                SESSION_HEADER: session,
            }
            began = time.monotonic()
            with httpx.stream(
                "POST", f"{url}/mcp", content=body, headers=headers, timeout=10
            ) as response:
                assert response.status_code == 200
                assert response.headers["Content-Type"].startswith("text/event-stream")
                first = next(response.iter_lines())
            assert first.startswith("id: "), first  # the priming event, not held back
            assert time.monotonic() - began < 3
        finally:
            stop_process(nginx)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
