"""Bounded web work against live gunicorn processes.

- A flood of 100 synchronous ``slow_echo`` calls: beyond the slots of the web processes each
  is refused at once with 429 ``busy``, and meanwhile another client's ``tasks/get`` keeps
  answering quickly (p99 under 200 ms): the flood cannot take the request threads.
- A client that hangs up stops its synchronous run at the next checkpoint: the slot is free
  again at once, not when the run would have ended.
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.live import ROOT, live_stack, wait_for
from tests.wire import post, result_of, tasks_get, tools_call

pytestmark = [pytest.mark.live]

FLOOD = 100
SYNC_SECONDS = 6.0


def sync_echo(seconds: float, token: str) -> tuple[bytes, dict[str, str]]:
    return tools_call("slow_echo", {"text": "x", "seconds": seconds}, tasks=False, token=token)


@pytest.mark.slow
def test_a_flood_of_synchronous_calls_gets_fast_429s_and_tasks_get_stays_quick(
    transactional_db, alice_token, bob_token
) -> None:
    # Two processes of four threads, two synchronous slots each.
    env = {"WEB_WORKERS": "2", "WEB_THREADS": "4", "TASKDESK_SYNC_CONCURRENCY": "2"}
    with live_stack(env=env, worker=False, beat=False) as stack:
        task = result_of(
            post(stack.mcp_url, tools_call("slow_echo", {"text": "b"}, token=bob_token))
        )
        poll = tasks_get(task["taskId"], token=bob_token)
        for _ in range(10):  # warm up every process's connection
            result_of(post(stack.mcp_url, poll))

        flood = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.flood",
                stack.mcp_url,
                alice_token,
                str(FLOOD),
                str(SYNC_SECONDS),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert flood.stdout is not None
            assert flood.stdout.readline().strip() == "go", (
                flood.stderr.read() if flood.stderr else ""
            )
            latencies: list[float] = []
            with httpx.Client(timeout=10) as http:
                body, headers = poll
                deadline = time.monotonic() + SYNC_SECONDS
                while time.monotonic() < deadline:
                    began = time.monotonic()
                    response = http.post(stack.mcp_url, content=body, headers=headers)
                    latencies.append(time.monotonic() - began)
                    assert response.status_code == 200, response.text
                    time.sleep(0.01)
            out, err = flood.communicate(timeout=SYNC_SECONDS + 90)
        finally:
            flood.kill()
        assert flood.returncode == 0, err
        calls = json.loads(out)

    ran = [c for c in calls if c["status"] == 200]
    busy = [c for c in calls if c["status"] == 429]
    assert len(ran) + len(busy) == FLOOD, calls
    assert 1 <= len(ran) <= 4, f"{len(ran)} ran; the processes have 4 slots"
    assert all(c["reason"] == "busy" and c["retry_after"] == "1" for c in busy)
    slowest_refusal = max(c["seconds"] for c in busy)
    assert slowest_refusal < SYNC_SECONDS / 2, f"a 429 took {slowest_refusal:.2f} s"
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    print(
        f"tasks/get: {len(latencies)} polls, p50 {latencies[len(latencies) // 2] * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms; slowest 429 {slowest_refusal * 1000:.0f} ms"
    )
    assert p99 < 0.2, f"tasks/get p99 {p99 * 1000:.0f} ms during the flood"


def test_a_client_that_hangs_up_stops_its_synchronous_run(transactional_db, alice_token) -> None:
    env = {"WEB_WORKERS": "1", "TASKDESK_SYNC_CONCURRENCY": "1", "TASKDESK_SYNC_MAX_SECONDS": "120"}
    with live_stack(env=env, worker=False, beat=False) as stack:
        body, headers = sync_echo(60, alice_token)
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())

        def long_call() -> socket.socket:
            sock = socket.create_connection(("127.0.0.1", stack.port))
            sock.sendall(
                f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{stack.port}\r\n{head}"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            return sock

        sock = long_call()
        short = sync_echo(0, alice_token)

        def long_call_holds_the_slot() -> bool:
            nonlocal sock
            if select.select([sock], [], [], 0)[0]:
                # Answered at once: a short call had the slot when it came (a busy machine
                # may run the two in either order), and it was refused. Sent again.
                sock.close()
                sock = long_call()
                return False
            return post(stack.mcp_url, short).status_code == 429

        wait_for("the long call to hold the only slot", long_call_holds_the_slot, 30, every=0.1)

        sock.close()
        hung_up = time.monotonic()
        answered = wait_for(
            "the slot to be free again",
            lambda: (r := post(stack.mcp_url, short)).status_code == 200 and r,
            timeout=30,
            every=0.1,
        )

        assert result_of(answered)["content"][0]["text"] == "x"
        assert time.monotonic() - hung_up < 30  # not the 60 s the run would have taken


def test_the_call_rate_holds_across_web_processes(transactional_db, alice_token) -> None:
    # Two processes: counted in each process, 5/minute would let up to 10 through.
    env = {"WEB_WORKERS": "2", "TASKDESK_CALL_RATE": "5/minute"}
    with live_stack(env=env, worker=False, beat=False) as stack:
        statuses = [
            post(
                stack.mcp_url, tools_call("slow_echo", {"text": f"{i}"}, token=alice_token)
            ).status_code
            for i in range(20)
        ]

    assert statuses.count(200) == 5, statuses
    assert statuses.count(429) == 15, statuses
