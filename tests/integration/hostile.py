"""A hostile client from a process of its own (so that its threads do not slow down the
measuring test): ``python -m tests.integration.hostile URL TOKEN SESSION TASKS STREAMS SYNCS``.

Opens STREAMS 2025-era ``GET`` streams on the handshake session SESSION, sends SYNCS
synchronous ``slow_echo(20)`` calls and, for each task id in TASKS (comma-separated), a
2025-era ``tasks/cancel``, all at once, one thread each, and holds whatever the server lets
it hold. After ``SETTLE`` seconds it prints one JSON line: for every attempt its kind, HTTP
status (0: no answer yet, the request is held), JSON-RPC error reason, ``Retry-After`` and
how long the answer's headers took. Then it holds on until it is killed.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import httpx

from tests.wire import HANDSHAKE_VERSION, SESSION_HEADER, request, rpc

SETTLE = 4.0
SYNC_SECONDS = 20


def main() -> None:
    url, token, session = sys.argv[1], sys.argv[2], sys.argv[3]
    task_ids = [t for t in sys.argv[4].split(",") if t]
    streams, syncs = int(sys.argv[5]), int(sys.argv[6])
    auth = {"Authorization": f"Bearer {token}"}
    handshake = {
        **auth,
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": HANDSHAKE_VERSION,
        SESSION_HEADER: session,
    }
    sync_body = request(
        "tools/call",
        {"name": "slow_echo", "arguments": {"text": "x", "seconds": SYNC_SECONDS}},
        tasks=False,
    )
    sync_headers = {
        **auth,
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "slow_echo",
    }
    attempts: list[tuple[str, str, dict[str, str], bytes | None]] = []
    attempts += [("stream", "GET", {**handshake, "Accept": "text/event-stream"}, None)] * streams
    attempts += [("sync", "POST", sync_headers, json.dumps(sync_body).encode())] * syncs
    for i, task_id in enumerate(task_ids):
        body = json.dumps(rpc("tasks/cancel", {"taskId": task_id}, id=100 + i)).encode()
        attempts.append(("cancel", "POST", {**handshake, "Content-Type": "application/json"}, body))

    results: list[dict[str, Any]] = [
        {"kind": kind, "status": 0, "reason": None, "retry_after": None, "seconds": None}
        for kind, *_ in attempts
    ]
    start = threading.Barrier(len(attempts) + 1)

    def one(index: int) -> None:
        _kind, method, headers, body = attempts[index]
        out = results[index]
        with httpx.Client(timeout=httpx.Timeout(5, read=120)) as http:
            start.wait()
            began = time.monotonic()
            try:
                with http.stream(method, url, headers=headers, content=body) as response:
                    out["seconds"] = time.monotonic() - began
                    out["retry_after"] = response.headers.get("Retry-After")
                    out["status"] = response.status_code
                    if response.status_code == 429:
                        response.read()
                        error = response.json().get("error") or {}
                        out["reason"] = (error.get("data") or {}).get("reason")
                        return
                    for _ in response.iter_bytes():  # hold it open, as long as the server does
                        pass
            except httpx.HTTPError as exc:
                out["reason"] = type(exc).__name__

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(attempts))]
    for thread in threads:
        thread.start()
    start.wait()
    time.sleep(SETTLE)
    print(json.dumps(results), flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main()
