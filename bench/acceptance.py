"""Benchmark of idempotent acceptance through the HTTP endpoint (``make bench``).

Creates its own PostgreSQL database and starts its own Redis and the production web server
(gunicorn with config/gunicorn.conf.py: its worker count for the machine's cores), then
drives ``POST /mcp`` with wrk at concurrency 16 for 10 s each:

  (a) tools/call creating a task, a fresh idempotency key on every request
  (b) tools/call replaying existing keys
  (c) tasks/get of existing tasks
  (d) tools/call creating a task on the 2025-11-25 handshake wire (params.task, in one
      session opened with initialize), a fresh idempotency key on every request
  (e) tasks/get of existing tasks on the 2025-11-25 wire

and, for scale, pgbench running the same insert-or-get statement directly against
PostgreSQL (new keys, then existing keys). No Celery worker runs: the figures are those of
the web tier, and the dispatch messages wait in Redis. Prints the figures and writes them,
with the machine line, into docs/benchmarks.md. Everything it started is stopped and its
database dropped at the end.

Environment: BENCH_POSTGRES (default postgres://postgres@127.0.0.1:5432), BENCH_SECONDS
(default 10), BENCH_CONNECTIONS (default 16), BENCH_NO_DOCS=1 to leave the docs alone,
BENCH_ERAS (default "2026,2025"; "2026" skips (d) and (e)).
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import resource
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

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

START, END = "<!-- acceptance-bench:start -->", "<!-- acceptance-bench:end -->"

SECONDS = int(os.environ.get("BENCH_SECONDS", "10"))
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "16"))
TARGETS = {
    "new": (600, 60.0),
    "replay": (900, None),
    "get": (1000, None),
    "new2025": (600, 60.0),
    "get2025": (1000, None),
}
ERAS = os.environ.get("BENCH_ERAS", "2026,2025").split(",")


@dataclass
class Figures:
    label: str
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int = 0
    cpu_ms: dict[str, float] | None = None  # CPU time per request, by process group
    mode: str = ""  # the submit.lua mode, which names the target


class CpuMeter:
    """CPU time of the web processes, the PostgreSQL backends serving the bench database,
    the bench's Redis and wrk, between two snapshots: where a request's time goes."""

    def __init__(self, *, web: int, redis: int, dsn: str) -> None:
        self.web, self.redis, self.dsn = web, redis, dsn

    def snapshot(self) -> dict[str, float]:
        with psycopg.connect(self.dsn) as conn:
            me = conn.info.backend_pid
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            ).fetchall()
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return {
            "web": sum(proc_cpu(p) for p in process_tree(self.web)),
            "PostgreSQL": sum(proc_cpu(pid) for (pid,) in rows if pid != me),
            "Redis": proc_cpu(self.redis),
            "wrk": usage.ru_utime + usage.ru_stime,
        }


def need(binary: str, hint: str) -> str:
    path = shutil.which(binary)
    if path is None:
        sys.exit(f"bench: {binary} is not installed ({hint})")
    return path


# --- the pieces it starts ---------------------------------------------------------------


def wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"bench: {proc.args[0]} exited:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.1)
    sys.exit(f"bench: nothing listens on port {port}:\n{log.read_text()[-3000:]}")


# --- measurements -----------------------------------------------------------------------


def wrk(
    url: str,
    env: dict[str, str],
    label: str,
    *args: str,
    seconds: int = SECONDS,
    meter: CpuMeter | None = None,
) -> Figures:
    before = meter.snapshot() if meter else {}
    out = subprocess.run(
        [
            need("wrk", "apt-get install wrk"),
            "-t2",
            f"-c{CONNECTIONS}",
            f"-d{seconds}s",
            "--timeout",
            "10s",
            "-s",
            str(ROOT / "bench" / "submit.lua"),
            url,
            "--",
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    match = re.search(
        r"BENCH requests=(\d+) errors=(\d+) p50_us=(\d+) p90_us=(\d+) p99_us=(\d+)", out.stdout
    )
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out.stdout)
    if not match or not rps:
        sys.exit(f"bench: unexpected wrk output:\n{out.stdout}\n{out.stderr}")
    if out.stderr.strip():
        print(out.stderr.strip(), file=sys.stderr)
    requests, errors, p50, _p90, p99 = (int(g) for g in match.groups())
    cpu = None
    if meter:
        after = meter.snapshot()
        cpu = {k: (after[k] - before[k]) * 1000 / max(requests, 1) for k in after}
    rate = float(rps.group(1))
    return Figures(label, requests, rate, p50 / 1000, p99 / 1000, errors, cpu, args[0])


def pgbench(dsn: str, sql: str, label: str, workdir: Path) -> Figures:
    script = workdir / f"{label.split()[0]}.sql"
    script.write_text(sql)
    out = subprocess.run(
        [
            need("pgbench", "apt-get install postgresql-client"),
            "-n",
            "-M",
            "prepared",
            "-c",
            str(CONNECTIONS),
            "-j",
            "2",
            "-T",
            str(SECONDS),
            "-f",
            str(script),
            dsn.replace("postgres://", "postgresql://"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    tps = re.search(r"tps = ([\d.]+)", out.stdout)
    latency = re.search(r"latency average = ([\d.]+) ms", out.stdout)
    count = re.search(r"number of transactions actually processed: (\d+)", out.stdout)
    failed = re.search(r"number of failed transactions: (\d+)", out.stdout)
    if out.returncode != 0 or not tps or not latency or not count:
        sys.exit(f"bench: pgbench failed:\n{out.stdout}\n{out.stderr}")
    return Figures(
        label,
        int(count.group(1)),
        float(tps.group(1)),
        float(latency.group(1)),
        float("nan"),
        int(failed.group(1)) if failed else 0,
    )


def pgbench_sql(env: dict[str, str], *, replay: bool) -> str:
    """The acceptance statement itself (bench/statement.py), with a key per transaction: a
    new one, or one of 2,000 keys (each inserted once, then replayed)."""
    done = subprocess.run(
        [str(BIN / "python"), str(ROOT / "bench" / "statement.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"bench: could not render the statement:\n{done.stderr[-3000:]}")
    key = "random(1, 2000)" if replay else "random(1, 1000000000000)"
    return f"\\set key {key}\n{done.stdout.strip()}\n"


def machine_line(load_at_start: float) -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError):
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"

    def version(*cmd: str) -> str:
        # wrk prints its version and exits 1; redis-server exits 0.
        with contextlib.suppress(OSError, IndexError):
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            return (out.stdout or out.stderr).strip().splitlines()[0]
        return "?"

    with psycopg.connect(f"{POSTGRES}/postgres") as conn:
        row = conn.execute("SHOW server_version").fetchone()
        pg = row[0] if row else "?"
    return (
        f"{os.cpu_count()} cores ({cpu}){mem}, Linux {platform.release()}, "
        f"Python {platform.python_version()}, PostgreSQL {pg.split()[0]}, "
        f"{version('redis-server', '--version').split(' sha=')[0]}, "
        f"{version('wrk', '--version').split(' [')[0]}; "
        f"load average {load_at_start:.2f} at the start and {os.getloadavg()[0]:.2f} at the end "
        "(other work on the machine competes for its two cores)"
    )


# --- the run ----------------------------------------------------------------------------


def main() -> None:
    need("wrk", "apt-get install wrk")
    redis_server = need("redis-server", "apt-get install redis-server")
    need("pgbench", "apt-get install postgresql-client")
    load_at_start = os.getloadavg()[0]
    workdir = Path(tempfile.mkdtemp(prefix="taskdesk-bench-"))
    web_port, redis_port = free_port(), free_port()
    results: list[Figures] = []
    with database("taskdesk_bench") as dsn:
        env = stack_env(dsn, workdir, web_port=web_port, redis_port=redis_port,
                        toolsets="demo", log_level="WARNING")  # fmt: skip
        say(f"database {dsn.rsplit('/', 1)[1]}, Redis on port {redis_port}, web on {web_port}")
        manage(env, "migrate", "--noinput", "-v0")
        token = manage(env, "create_client_token", "--client", "bench", "--tenant", "bench")
        env["TASKDESK_BENCH_TOKEN"] = token.strip().splitlines()[-1]

        redis_args = [redis_server, "--port", str(redis_port), "--bind", "127.0.0.1",
                      "--save", "", "--appendonly", "no"]  # fmt: skip
        web_args = [str(BIN / "gunicorn"), "config.wsgi", "-c", "config/gunicorn.conf.py"]
        with (
            process(redis_args, env=env, log=workdir / "redis.log") as redis_proc,
            process(web_args, env=env, log=workdir / "web.log") as web,
        ):
            wait_for_port(redis_port, redis_proc, workdir / "redis.log")
            wait_for_port(web_port, web, workdir / "web.log")
            url = f"http://127.0.0.1:{web_port}"
            health = httpx.get(f"{url}/healthz", timeout=10).json()
            workers = len(
                subprocess.run(
                    ["ps", "-o", "pid=", "--ppid", str(web.pid)], capture_output=True, text=True
                ).stdout.split()
            )
            say(f"gunicorn up with {workers} workers; health {health['status']}")

            meter = CpuMeter(web=web.pid, redis=redis_proc.pid, dsn=dsn)

            def measure(label: str, *args: str, seconds: int = SECONDS) -> Figures:
                # A run id of its own, so no key of one run is replayed by the next.
                run_env = {**env, "TASKDESK_BENCH_RUN": secrets.token_hex(4)}
                return wrk(url, run_env, label, *args, seconds=seconds, meter=meter)

            say("warming up (3 s)")
            measure("warm-up", "new", seconds=3)
            say("(a) new submissions")
            results.append(measure("(a) tools/call, new task (fresh key)", "new"))

            with psycopg.connect(dsn) as conn:
                rows = conn.execute(
                    "SELECT id, idempotency_key FROM tasks_app_task ORDER BY random() LIMIT 2000"
                ).fetchall()
                created = conn.execute("SELECT count(*) FROM tasks_app_task").fetchone()
            say(f"{created[0] if created else '?'} tasks in the database")
            keys, ids = workdir / "keys.txt", workdir / "ids.txt"
            keys.write_text("\n".join(key for _, key in rows) + "\n")
            ids.write_text("\n".join(task_id for task_id, _ in rows) + "\n")

            say("(b) replays")
            results.append(measure("(b) tools/call, replay (existing key)", "replay", str(keys)))
            say("(c) tasks/get")
            results.append(measure("(c) tasks/get of an existing task", "get", str(ids)))

            if "2025" in ERAS:
                env["TASKDESK_BENCH_SESSION"] = open_session(url, env["TASKDESK_BENCH_TOKEN"])
                say("(d) new submissions, 2025-11-25 wire")
                results.append(
                    measure("(d) 2025-11-25 tools/call with task, new task (fresh key)", "new2025")
                )
                say("(e) tasks/get, 2025-11-25 wire")
                results.append(
                    measure("(e) 2025-11-25 tasks/get of an existing task", "get2025", str(ids))
                )

        say("raw PostgreSQL ceiling (pgbench, same statement)")
        results.append(
            pgbench(dsn, pgbench_sql(env, replay=False), "new (pgbench, new key)", workdir)
        )
        results.append(
            pgbench(dsn, pgbench_sql(env, replay=True), "replay (pgbench, existing key)", workdir)
        )

    machine = machine_line(load_at_start)
    table = render(results, machine, workers)
    print()
    print(table)
    if os.environ.get("BENCH_NO_DOCS") != "1":
        write_docs(table)
        say(f"written to {DOCS.relative_to(ROOT)}")
    shutil.rmtree(workdir, ignore_errors=True)


def open_session(url: str, token: str) -> str:
    """A 2025-11-25 session of the bench client (initialize), for the (d) and (e) runs."""
    response = httpx.post(
        f"{url}/mcp",
        json={
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "wrk", "version": "1"},
            },
        },
        headers={
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {token}",
        },
        timeout=10,
    )
    response.raise_for_status()
    return response.headers["Mcp-Session-Id"]


def render(results: list[Figures], machine: str, workers: int) -> str:
    lines = [
        f"Machine: {machine}.",
        f"Web: gunicorn, config/gunicorn.conf.py ({workers} web processes x the shipped "
        "WEB_THREADS, 8, with config/web_worker.py), "
        f"PostgreSQL and Redis on the same machine; wrk -t2 -c{CONNECTIONS} -d{SECONDS}s "
        "on the same machine. No Celery worker consumes during the run.",
        "",
        "| measurement | requests | req/s | p50 ms | p99 ms | errors | target |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for fig in results:
        if fig.label.startswith("("):
            rps, p99 = TARGETS[fig.mode]
            target = f">= {rps} req/s" + (f", p99 < {p99:.0f} ms" if p99 else "")
            met = fig.rps >= rps and (p99 is None or fig.p99_ms < p99) and fig.errors == 0
            target += " (met)" if met else " (**not met**)"
            p99_text = f"{fig.p99_ms:.1f}"
            p50_text = f"{fig.p50_ms:.1f}"
        else:
            target = "for scale: PostgreSQL alone"
            p50_text = f"{fig.p50_ms:.1f} (mean)"
            p99_text = "-"
        lines.append(
            f"| {fig.label} | {fig.requests} | {fig.rps:.0f} | {p50_text} | {p99_text} | "
            f"{fig.errors} | {target} |"
        )
    measured = [fig for fig in results if fig.cpu_ms]
    if measured:
        groups = list(measured[0].cpu_ms or {})
        lines += [
            "",
            "CPU time per request (ms), by process group:",
            "",
            "| measurement | " + " | ".join(groups) + " | total |",
            "| --- |" + " ---: |" * (len(groups) + 1),
        ]
        for fig in measured:
            cpu = fig.cpu_ms or {}
            cells = " | ".join(f"{cpu[g]:.2f}" for g in groups)
            lines.append(f"| {fig.label} | {cells} | {sum(cpu.values()):.2f} |")
    return "\n".join(lines)


def write_docs(table: str) -> None:
    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    section = f"{START}\n_Run of {stamp} (`make bench`):_\n\n{table}\n{END}"
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    if START in text and END in text:
        text = text[: text.index(START)] + section + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip() + "\n\n## Idempotent acceptance\n\n" + section + "\n"
    DOCS.write_text(text)


if __name__ == "__main__":
    main()
