"""What held 2025-11-25 streams cost: N session GET streams open at once, on 2 web processes.

Starts PostgreSQL-backed gunicorn (the shipped config/gunicorn.conf.py, with WEB_THREADS and
TASKDESK_MAX_STREAMS raised so that the streams fit) and its own Redis, no Celery worker.
For each N it opens N sessions of one client and a GET stream on each, then, while they are
held, measures for BENCH_SECONDS (default 10):

- web CPU (% of one core) and PostgreSQL transactions per second (the watcher's queries);
- RSS of the web processes;
- tasks/get at 1 connection beside the streams (p50 / p99);
- fan-out: one task of the client is cancelled (tasks/cancel), and the time until every
  stream has its notifications/tasks/status.

Prints a table and writes it into docs/benchmarks.md (BENCH_NO_DOCS=1 leaves the file).
Part of `make bench`.
Environment: BENCH_STREAMS (default "0,200,800"), BENCH_SECONDS, BENCH_POSTGRES.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
from common import (
    BIN,
    DOCS,
    ROOT,
    database,
    free_port,
    manage,
    proc_cpu,
    process,
    process_tree,
    say,
    stack_env,
)

COUNTS = [int(n) for n in os.environ.get("BENCH_STREAMS", "0,200,800").split(",")]
SECONDS = float(os.environ.get("BENCH_SECONDS", "10"))
WEB_WORKERS = 2
START, END = "<!-- streams-bench:start -->", "<!-- streams-bench:end -->"
HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}


@dataclass
class Row:
    streams: int
    held: int
    web_cpu_pct: float
    pg_xact_per_s: float
    web_rss_mib: float
    pg_connections: int
    get_p50_ms: float
    get_p99_ms: float
    fanout_ms: float | None


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def pg_connections(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) - 1 FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def xacts(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


async def initialize(http: httpx.AsyncClient, url: str, token: str) -> str:
    body = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "bench-streams", "version": "1"},
        },
    }
    response = await http.post(url, json=body, headers={**HEADERS, "Authorization": token})
    response.raise_for_status()
    return response.headers["Mcp-Session-Id"]


async def hold(
    http: httpx.AsyncClient,
    url: str,
    token: str,
    session: str,
    opened: asyncio.Event,
    done: asyncio.Event,
    notified: dict[str, float],
    refused: list[object],
    stop: asyncio.Event,
) -> None:
    headers = {
        "Accept": "text/event-stream",
        "MCP-Protocol-Version": "2025-11-25",
        "Mcp-Session-Id": session,
        "Authorization": token,
    }
    try:
        async with http.stream("GET", url, headers=headers) as response:
            if response.status_code != 200:
                refused.append(response.status_code)
                return
            opened.set()
            async for line in response.aiter_lines():
                if "notifications/tasks/status" in line and session not in notified:
                    notified[session] = time.monotonic()
                if stop.is_set():
                    return
    except httpx.HTTPError as exc:
        refused.append(type(exc).__name__)
    finally:
        done.set()


async def measure(n: int, url: str, token: str, dsn: str, web_pid: int) -> Row:
    task_id = accept_one(url, token)  # the task polled beside the streams, then cancelled
    # Sessions first, on short connections (the server closes idle keep-alive ones after
    # 5 s); then each stream on a connection of its own.
    async with httpx.AsyncClient(timeout=30, headers={"Connection": "close"}) as short:
        sessions = [await initialize(short, url, token) for _ in range(n)]
    limits = httpx.Limits(max_connections=n + 20, max_keepalive_connections=0)
    timeout = httpx.Timeout(30, read=None)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:
        stop = asyncio.Event()
        notified: dict[str, float] = {}
        refused: list[object] = []
        opened = [asyncio.Event() for _ in sessions]
        ended = [asyncio.Event() for _ in sessions]
        holders = [
            asyncio.create_task(hold(http, url, token, s, o, d, notified, refused, stop))
            for s, o, d in zip(sessions, opened, ended, strict=True)
        ]

        async def settled(o: asyncio.Event, d: asyncio.Event) -> None:
            await asyncio.wait(
                [asyncio.create_task(o.wait()), asyncio.create_task(d.wait())],
                return_when=asyncio.FIRST_COMPLETED,
            )

        if holders:
            await asyncio.wait_for(
                asyncio.gather(*(settled(o, d) for o, d in zip(opened, ended, strict=True))), 120
            )
        if refused:
            say(f"{len(refused)} streams refused: {sorted(set(map(str, refused)))}")
        await asyncio.sleep(2)  # the watcher's first ticks
        held = sum(o.is_set() for o in opened)
        pids = process_tree(web_pid)
        cpu0, x0, t0 = sum(proc_cpu(p) for p in pids), xacts(dsn), time.monotonic()
        latencies = []
        body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": task_id}}
        get_headers = {**HEADERS, "Authorization": token}
        if sessions:
            get_headers["Mcp-Session-Id"] = sessions[0]
        else:
            get_headers["Mcp-Session-Id"] = await initialize(http, url, token)
        while time.monotonic() - t0 < SECONDS:
            started = time.perf_counter()
            (await http.post(url, json=body, headers=get_headers)).raise_for_status()
            latencies.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(0.01)
        elapsed = time.monotonic() - t0
        cpu1, x1 = sum(proc_cpu(p) for p in process_tree(web_pid)), xacts(dsn)
        rss = rss_mib(process_tree(web_pid))
        conns = pg_connections(dsn)
        fanout = None
        if holders:
            changed = time.monotonic()
            # The change every stream is told about: the task is cancelled (no leg runs it).
            call_2026(url, token, "tasks/cancel", task_id, {"taskId": task_id})
            deadline = changed + 30
            while len(notified) < held and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if len(notified) >= held:
                fanout = (max(notified.values()) - changed) * 1000
        stop.set()
        for holder in holders:
            holder.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
    latencies.sort()
    return Row(
        streams=n,
        held=held,
        web_cpu_pct=(cpu1 - cpu0) / elapsed * 100,
        pg_xact_per_s=(x1 - x0) / elapsed,
        web_rss_mib=rss,
        pg_connections=conns,
        get_p50_ms=statistics.median(latencies),
        get_p99_ms=latencies[int(len(latencies) * 0.99) - 1],
        fanout_ms=fanout,
    )


def render(rows: list[Row], threads: int) -> str:
    lines = [
        f"{WEB_WORKERS} gunicorn processes x {threads} threads "
        f"(TASKDESK_MAX_STREAMS={max(COUNTS) + 8} each, DB_CONN_MAX_AGE=0), PostgreSQL and "
        "Redis on the same machine, no Celery worker; each figure over "
        f"{SECONDS:g} s while the streams are held, tasks/get at 1 connection beside them.",
        "",
        "| GET streams open | held | web CPU, % of a core | PostgreSQL transactions/s "
        "| web RSS, MiB | PostgreSQL connections | tasks/get p50 ms | tasks/get p99 ms "
        "| fan-out to every stream, ms |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        fanout = "-" if r.fanout_ms is None else f"{r.fanout_ms:.0f}"
        lines.append(
            f"| {r.streams} | {r.held} | {r.web_cpu_pct:.1f} | {r.pg_xact_per_s:.1f} | "
            f"{r.web_rss_mib:.0f} | {r.pg_connections} | {r.get_p50_ms:.1f} | "
            f"{r.get_p99_ms:.1f} | {fanout} |"
        )
    return "\n".join(lines)


def write_docs(table: str) -> None:
    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    section = f"{START}\n_Run of {stamp} (`make bench`, bench/streams.py):_\n\n{table}\n{END}"
    text = DOCS.read_text()
    if START in text and END in text:
        text = text[: text.index(START)] + section + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip() + "\n\n## Held streams (2025-11-25 wire)\n\n" + section + "\n"
    DOCS.write_text(text)


def main() -> None:
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        raise SystemExit("bench: redis-server is needed (apt-get install redis-server)")
    workdir = Path(tempfile.mkdtemp(prefix="taskdesk-streams-"))
    web_port, redis_port = free_port(), free_port()
    # Room for every stream in either process (connections do not split evenly between
    # them), and for the gets.
    threads = max(COUNTS) + 40
    rows: list[Row] = []
    with database("taskdesk_streams") as dsn:
        env = stack_env(dsn, workdir, web_port=web_port, redis_port=redis_port,
                        toolsets="demo", log_level="WARNING")  # fmt: skip
        env.update(
            WEB_WORKERS=str(WEB_WORKERS),
            WEB_THREADS=str(threads),
            TASKDESK_MAX_STREAMS=str(max(COUNTS) + 8),
            TASKDESK_KEEPALIVE_SECONDS="15",
            # Hundreds of request threads: connections per request rather than one kept per
            # thread (docs/deploy.md, "PostgreSQL connections").
            DB_CONN_MAX_AGE="0",
        )
        manage(env, "migrate", "--noinput", "-v0")
        token = manage(env, "create_client_token", "--client", "streams", "--tenant", "bench")
        bearer = f"Bearer {token.strip().splitlines()[-1]}"
        redis_args = [redis_server, "--port", str(redis_port), "--bind", "127.0.0.1",
                      "--save", "", "--appendonly", "no"]  # fmt: skip
        web_args = [str(BIN / "gunicorn"), "config.wsgi", "-c", "config/gunicorn.conf.py"]
        with (
            process(redis_args, env=env, log=workdir / "redis.log"),
            process(web_args, env=env, log=workdir / "web.log") as web,
        ):
            url = f"http://127.0.0.1:{web_port}/mcp"
            for _ in range(100):
                try:
                    httpx.get(f"http://127.0.0.1:{web_port}/livez", timeout=1)
                    break
                except httpx.HTTPError:
                    time.sleep(0.2)
            for n in COUNTS:
                say(f"{n} streams")
                row = asyncio.run(measure(n, url, bearer, dsn, web.pid))
                say(str(row))
                rows.append(row)
    table = render(rows, threads)
    print(table)
    if os.environ.get("BENCH_NO_DOCS") != "1":
        write_docs(table)
        say(f"written to {DOCS.relative_to(ROOT)}")
    shutil.rmtree(workdir, ignore_errors=True)


def call_2026(url: str, bearer: str, method: str, name: str, params: dict[str, Any]) -> Any:
    """One request on the stateless 2026-07-28 wire with the tasks extension; its result."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": {"io.modelcontextprotocol/tasks": {}}
        },
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": method,
        "Mcp-Name": name,
        "Authorization": bearer,
    }
    response = httpx.post(url, json=body, headers=headers, timeout=10)
    response.raise_for_status()
    return response.json()["result"]


def accept_one(url: str, bearer: str) -> str:
    """A new task of the client (no worker runs it: it stays working)."""
    arguments = {"text": "x", "seconds": 0}
    params = {"name": "slow_echo", "arguments": arguments}
    return str(call_2026(url, bearer, "tools/call", "slow_echo", params)["taskId"])


if __name__ == "__main__":
    main()
