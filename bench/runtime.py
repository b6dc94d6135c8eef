"""End-to-end benchmark of the task runtime (``make bench``).

Creates its own PostgreSQL database, starts its own Redis, the production web server
(gunicorn with config/gunicorn.conf.py) and one Celery worker with 2 prefork processes, then
submits 2,000 calls of a no-op task tool through ``POST /mcp`` (``tools/call`` with the tasks
extension and a fresh idempotency key, 16 at a time) as fast as it can, and waits until every
task has completed and the worker has taken every message. From the database it reports:

- tasks/s from the first submission to the last completion;
- p50/p99 of submission-to-start (task accepted → its leg started in the worker) and of
  submission-to-completion (task accepted → task completed);
- the CPU time each group of processes (worker, web, PostgreSQL backends, Redis, the load
  generator) spent per task: their sum bounds the rate the machine can reach.

"Submission" is the moment the server accepted the call (``Task.created_at``), "start" the
``leg_started`` event, "completion" ``Task.finished_at``; all on this machine's clock.
Prints the figures and writes them, with the machine line, into docs/benchmarks.md.

Environment: BENCH_POSTGRES (default postgres://postgres@127.0.0.1:5432), BENCH_TASKS
(default 2000), BENCH_CONNECTIONS (default 16), BENCH_LOG_LEVEL (default INFO),
BENCH_NO_DOCS=1 to leave the docs alone, BENCH_KEEP=1 to keep the processes' logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
from common import (
    BIN,
    DOCS,
    POSTGRES,
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

START, END = "<!-- runtime-bench:start -->", "<!-- runtime-bench:end -->"

TASKS = int(os.environ.get("BENCH_TASKS", "2000"))
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "16"))
LOG_LEVEL = os.environ.get("BENCH_LOG_LEVEL", "INFO")
WARMUP = 50
TARGET_RATE, TARGET_START_P50_MS = 300, 50
EXTENSION = "io.modelcontextprotocol/tasks"


# --- the pieces it starts ---------------------------------------------------------------


def wait_until(what: str, check: Any, procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                sys.exit(f"bench: {proc.args[0]} exited while waiting for {what}")
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.1)
    sys.exit(f"bench: timed out waiting for {what}")


# --- submitting ---------------------------------------------------------------------------


def call_body(n: int) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": n,
        "method": "tools/call",
        "params": {
            "name": "noop",
            "arguments": {},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}},
            },
        },
    }


async def submit_all(port: int, token: str, count: int, run: str) -> tuple[list[str], list[str]]:
    """POST COUNT task calls, CONNECTIONS at a time over keep-alive connections. Return
    (task ids, errors).

    A minimal HTTP/1.1 client on asyncio streams: an HTTP library would spend more CPU per
    request than the server's acceptance does, on the same two cores.
    """
    ids: list[str] = []
    errors: list[str] = []
    numbers = iter(range(count))
    head = (
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n"
        f"Mcp-Method: tools/call\r\nMcp-Name: noop\r\nAuthorization: Bearer {token}\r\n"
    )

    async def one_connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for n in numbers:
                body = json.dumps(call_body(n)).encode()
                writer.write(
                    f"{head}Idempotency-Key: {run}-{n}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                status, answer = await read_response(reader)
                found = TASK_ID.search(answer) if status == 200 else None
                if found and b'"resultType":"task"' in answer.replace(b" ", b""):
                    ids.append(found.group(1).decode())
                else:
                    errors.append(f"{status} {answer[:200]!r}")
        finally:
            writer.close()

    await asyncio.gather(*(one_connection() for _ in range(CONNECTIONS)))
    return ids, errors


TASK_ID = re.compile(rb'"taskId"\s*:\s*"([^"]+)"')


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    fields = {
        k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)
    }
    if "content-length" not in fields:
        raise RuntimeError(f"response without Content-Length: {head!r}")
    return status, await reader.readexactly(int(fields["content-length"]))


# --- measuring ------------------------------------------------------------------------------


class CpuMeter:
    """CPU time used by each group of processes during the measured run (the worker and web
    groups include their children; pool processes Celery replaced are not counted)."""

    def __init__(self, groups: dict[str, int], dsn: str) -> None:
        self.groups, self.dsn = groups, dsn

    def snapshot(self) -> dict[str, float]:
        out = {
            name: sum(proc_cpu(p) for p in process_tree(pid)) for name, pid in self.groups.items()
        }
        with psycopg.connect(self.dsn) as conn:
            pids = [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )]  # fmt: skip
        out["postgres"] = sum(proc_cpu(p) for p in pids)
        return out


@dataclass
class Figures:
    tasks: int
    seconds: float
    rate: float
    start_p50: float
    start_p99: float
    done_p50: float
    done_p99: float
    submit_seconds: float
    not_completed: int
    cpu_ms: dict[str, float]
    finished_seconds: float = 0.0
    drained_seconds: float = 0.0


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def measure(dsn: str, ids: list[str], submit_seconds: float, cpu: dict[str, float]) -> Figures:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            """
            SELECT t.created_at, t.finished_at, t.status,
                   (SELECT min(e.created_at) FROM tasks_app_taskevent e
                     WHERE e.task_id = t.id AND e.kind = 'leg_started')
            FROM tasks_app_task t WHERE t.id = ANY(%s)
            """,
            [ids],
        ).fetchall()
    created = [r[0] for r in rows]
    finished = [r[1] for r in rows if r[1] is not None]
    started = [(r[3] - r[0]).total_seconds() * 1000 for r in rows if r[3] is not None]
    done = [(r[1] - r[0]).total_seconds() * 1000 for r in rows if r[1] is not None]
    span = (max(finished) - min(created)).total_seconds()
    return Figures(
        tasks=len(rows),
        seconds=span,
        rate=len(finished) / span,
        start_p50=percentile(started, 50),
        start_p99=percentile(started, 99),
        done_p50=percentile(done, 50),
        done_p99=percentile(done, 99),
        submit_seconds=submit_seconds,
        not_completed=sum(1 for r in rows if r[2] != "completed"),
        cpu_ms={name: seconds * 1000 / len(rows) for name, seconds in cpu.items()},
    )


def broker_idle(port: int) -> bool:
    """No message queued or delivered-but-unacknowledged on the bench's Redis."""
    import redis

    client = redis.Redis(port=port)
    try:
        return client.llen("celery") == 0 and client.hlen("unacked") == 0
    finally:
        client.close()


def all_finished(dsn: str, ids: list[str]) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM tasks_app_task WHERE id = ANY(%s) AND finished_at IS NULL",
            [ids],
        ).fetchone()
    return bool(row) and row[0] == 0


def machine_line() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with psycopg.connect(f"{POSTGRES}/postgres") as conn:
        row = conn.execute("SHOW server_version").fetchone()
    pg = row[0].split()[0] if row else "?"
    redis = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    return (
        f"{os.cpu_count()} cores ({cpu}), Linux {platform.release()}, "
        f"Python {platform.python_version()}, PostgreSQL {pg}, "
        f"{redis.split(' sha=')[0].strip()}; load average {os.getloadavg()[0]:.2f} at the start"
    )


def render(f: Figures, machine: str) -> str:
    rate_ok = "met" if f.rate >= TARGET_RATE else "**not met**"
    total_cpu = max(sum(f.cpu_ms.values()), 0.001)
    start_ok = "met" if f.start_p50 < TARGET_START_P50_MS else "**not met**"
    return "\n".join(
        [
            f"_Run of {datetime.now(UTC):%Y-%m-%d} (`make bench`, bench/runtime.py):_",
            "",
            f"Machine: {machine}.",
            f"Setup: {f.tasks} calls of a no-op task tool through `POST /mcp` (tools/call with "
            f"the tasks extension, a fresh idempotency key each, {CONNECTIONS} at a time; all "
            f"submitted in {f.submit_seconds:.1f} s); gunicorn with config/gunicorn.conf.py; one "
            f"Celery worker, 2 prefork processes, log level {LOG_LEVEL}; PostgreSQL and Redis on "
            "the same machine, as is the load generator.",
            "",
            "| measurement | value | target |",
            "| --- | ---: | --- |",
            f"| tasks/s, first submission to last completion | {f.rate:.0f} "
            f"({f.tasks} in {f.seconds:.2f} s) | >= {TARGET_RATE} ({rate_ok}) |",
            f"| submission to start, p50 / p99 | {f.start_p50:.0f} / {f.start_p99:.0f} ms "
            f"| p50 < {TARGET_START_P50_MS} ms ({start_ok}) |",
            f"| submission to completion, p50 / p99 | {f.done_p50:.0f} / {f.done_p99:.0f} ms | |",
            f"| tasks not completed | {f.not_completed} | 0 |",
            "",
            f"Every task had completed {f.finished_seconds:.2f} s after the first submission; "
            f"the worker had taken the last message {f.drained_seconds:.2f} s after it (the "
            "messages of tasks it had already run from their dispatch records, each found "
            "done). The CPU figures cover the whole time, those messages included.",
            "",
            "CPU per task: "
            + ", ".join(f"{k} {v:.1f} ms" for k, v in f.cpu_ms.items())
            + f"; together they bound this machine at {2000 / total_cpu:.0f} tasks/s.",
        ]
    )


def write_docs(table: str) -> None:
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    block = f"{START}\n{table}\n{END}"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip() + "\n\n## Task runtime, end to end\n\n" + block + "\n"
    DOCS.write_text(text)


# --- the run ----------------------------------------------------------------------------------


def main() -> None:
    redis_server = shutil.which("redis-server") or sys.exit("bench: needs redis-server")
    workdir = Path(tempfile.mkdtemp(prefix="taskdesk-bench-runtime-"))
    web_port, redis_port = free_port(), free_port()
    machine = machine_line()
    with database("taskdesk_bench_runtime") as dsn:
        env = stack_env(dsn, workdir, web_port=web_port, redis_port=redis_port,
                        toolsets="demo,bench.noop_tools", log_level=LOG_LEVEL)  # fmt: skip
        redis_args = [redis_server, "--port", str(redis_port), "--bind", "127.0.0.1"]
        redis_args += ["--save", "", "--appendonly", "no"]
        with process(redis_args, env=env, log=workdir / "redis.log") as redis:
            say(f"migrating {dsn.rsplit('/', 1)[1]}")
            manage(env, "migrate", "--noinput", "-v0")
            out = manage(env, "create_client_token", "--client", "bench", "--tenant", "bench")
            token = out.strip().splitlines()[-1]
            web_args = [str(BIN / "gunicorn"), "config.wsgi", "-c", "config/gunicorn.conf.py"]
            worker_args = [str(BIN / "celery"), "-A", "config", "worker", "--pool", "prefork"]
            worker_args += ["--concurrency", "2", "--loglevel", "INFO", "-n", "bench@%h"]
            worker_args += ["--without-mingle", "--without-gossip"]
            with (
                process(web_args, env=env, log=workdir / "web.log") as web,
                process(worker_args, env=env, log=workdir / "worker.log") as worker,
            ):
                health = f"http://127.0.0.1:{web_port}/healthz"
                procs = [web, worker]
                log = workdir / "worker.log"
                wait_until(
                    "the web server", lambda: httpx.get(health).status_code == 200, procs, 60
                )
                wait_until("the worker", lambda: "ready" in log.read_text(), procs, 60)
                say(f"warming up with {WARMUP} tasks")
                warm, errors = asyncio.run(submit_all(web_port, token, WARMUP, "warm"))
                if errors:
                    sys.exit(f"bench: warm-up calls failed: {errors[:3]}")
                wait_until("the warm-up tasks", lambda: all_finished(dsn, warm), procs, 120)
                meter = CpuMeter({"worker": worker.pid, "web": web.pid, "redis": redis.pid}, dsn)
                say(f"submitting {TASKS} tasks, {CONNECTIONS} at a time")
                before, client_before = meter.snapshot(), time.process_time()
                began = time.monotonic()
                ids, errors = asyncio.run(submit_all(web_port, token, TASKS, "run"))
                submit_seconds = time.monotonic() - began
                if errors:
                    sys.exit(f"bench: {len(errors)} calls failed, e.g. {errors[:3]}")
                wait_until("every task to finish", lambda: all_finished(dsn, ids), procs, 600)
                finished = time.monotonic() - began
                # Tasks a worker ran straight from their dispatch records still have their
                # messages queued: the CPU counts up to the last one taken (and found done).
                wait_until("the last message", lambda: broker_idle(redis_port), procs, 600)
                drained = time.monotonic() - began
                after = meter.snapshot()
                cpu = {name: after[name] - before[name] for name in after}
                cpu["load generator"] = time.process_time() - client_before
        figures = measure(dsn, ids, submit_seconds, cpu)
        figures.finished_seconds, figures.drained_seconds = finished, drained
    table = render(figures, machine)
    print(table, flush=True)
    if os.environ.get("BENCH_NO_DOCS") != "1":
        write_docs(table)
        say(f"written to {DOCS.relative_to(ROOT)}")
    if os.environ.get("BENCH_KEEP") == "1":
        say(f"logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
