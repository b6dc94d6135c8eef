"""A flood of synchronous calls from a process of its own (so that its threads do not slow
down the measuring test): ``python -m tests.integration.flood URL TOKEN COUNT SECONDS``.

Sends COUNT synchronous ``slow_echo`` calls of SECONDS at once, one thread each. Prints
``go`` when they are sent, then one JSON line: for every call its HTTP status, JSON-RPC error
reason, ``Retry-After`` and how long it took.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import httpx

from tests.wire import request


def main() -> None:
    url, token, count, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    body = request(
        "tools/call", {"name": "slow_echo", "arguments": {"text": "x", "seconds": seconds}}
    )
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "slow_echo",
        "Authorization": f"Bearer {token}",
    }
    raw = json.dumps(body).encode()
    results: list[dict[str, Any]] = []
    # The last thread to reach the start line says so on stdout, so the test can measure
    # exactly while the flood arrives.
    start = threading.Barrier(count, action=lambda: print("go", flush=True))

    def one() -> None:
        # The client (its TLS context is costly to build) is made before the start line.
        with httpx.Client(timeout=seconds + 60) as http:
            start.wait()
            began = time.monotonic()
            try:
                response = http.post(url, content=raw, headers=headers)
                reason = (response.json().get("error") or {}).get("data", {}).get("reason")
                status = response.status_code
                retry_after = response.headers.get("Retry-After")
            except httpx.HTTPError as exc:
                status, reason, retry_after = 0, type(exc).__name__, None
            results.append(
                {
                    "status": status,
                    "reason": reason,
                    "retry_after": retry_after,
                    "seconds": time.monotonic() - began,
                }
            )

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
