"""Taskdesk as shipped, side by side with the FastMCP-tasks peer (``make bench``).

Starts Taskdesk with ``make run`` (the Procfile under scripts/run_procfile.py: gunicorn, the
leg worker, the control worker and beat) on PostgreSQL + Redis, or on the embedded SQLite +
filesystem broker with ``BENCH_STACK=embedded``, in a database and var folder of its own.
Then:

1. **CPU per task, by process.** wrk with ``lua/accept.lua`` (16 connections, 10 s) and then
   2,000 end-to-end no-op tasks (``mcp_tasks_load.py e2e``, 16 at a time), each phase with the
   CPU time of every process on the machine sampled before and after it (and, for accept,
   after the worker has drained what was accepted): web, worker main, pool processes,
   control worker, beat, the supervisor, PostgreSQL, Redis and the load generator.
2. **The side-by-side table.** ``../shared/bench/side_by_side.sh`` against the running stack,
   then against the peer, and the ratios it prints; plus the peak RSS of all Taskdesk
   processes (the peer's ``rss`` row is its two processes).
3. **Webhooks.** On PostgreSQL + Redis, accept and end to end again without and with one
   webhook endpoint (every event) on the bench client, alternately, three times each
   (``BENCH_WEBHOOK_ROUNDS``), against a local receiver (nginx) that answers at once; with
   each end-to-end round's CPU per task (control worker, PostgreSQL, web, in all), its
   ``tasks/get`` per task, and how many messages a claim of the sender took on average.

Prints both tables and writes them into docs/benchmarks.md (``BENCH_NO_DOCS=1`` leaves the
docs alone). Run it on a quiet machine: the absolute figures move with whatever else runs;
the ratio of the two back-to-back runs is the figure to trust.

Environment: BENCH_STACK (postgres | embedded | both; default postgres), BENCH_POSTGRES,
BENCH_REDIS (default redis://127.0.0.1:6379/3), BENCH_SHARED (default ../shared/bench),
BENCH_SKIP_PEER=1 (our figures only), BENCH_SKIP_WEBHOOKS=1 (no webhook phase),
BENCH_WEBHOOK_ROUNDS (how many times each, default 3), BENCH_KEEP=1
(keep the logs).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from common import DOCS, ROOT, database, free_port, process, say

SHARED = Path(os.environ.get("BENCH_SHARED", ROOT.parent / "shared" / "bench")).resolve()
CACHE = Path(os.environ.get("BENCH_CACHE", Path.home() / ".cache" / "taskdesk-bench"))
REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/3")
TOOL, TOOL_ARGS = "slow_echo", '{"text":"x","seconds":0}'
HZ = os.sysconf("SC_CLK_TCK")
START, END = "<!-- shipped-bench:start -->", "<!-- shipped-bench:end -->"

GROUPS = (
    "web",
    "worker main",
    "worker pool",
    "control worker and beat",
    "supervisor",
    "PostgreSQL",
    "Redis",
    "load generator",
)


# --- processes and their CPU ---------------------------------------------------------------


def _stat(pid: str) -> tuple[int, float] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # Its own CPU and that of its children it has reaped (PostgreSQL's backends of closed
    # connections, ended pool processes).
    return int(fields[1]), sum(int(value) for value in fields[11:15]) / HZ


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _group(cmd: str, parent_cmd: str) -> str | None:
    if "gunicorn" in cmd:
        return "web"
    if "celery" in cmd and (" beat" in cmd or "--queues control" in cmd):
        return "control worker and beat"  # beat is a thread of it, or a process beside it
    if "celery" in cmd and " worker" in cmd:
        return (
            "worker pool" if "celery" in parent_cmd and " worker" in parent_cmd else "worker main"
        )
    if "run_procfile" in cmd or cmd.startswith(("make ", "/usr/bin/make ")):
        return "supervisor"
    if cmd.startswith("postgres") or "/postgres " in cmd:
        return "PostgreSQL"
    if "redis-server" in cmd:
        return "Redis"
    return None  # the load generator: see snapshot


def snapshot() -> dict[str, float]:
    """CPU seconds used so far by each group of processes on the machine. The load
    generator runs as this process's children, which are counted once they have ended."""
    stats = {pid: s for pid in os.listdir("/proc") if pid.isdigit() and (s := _stat(pid))}
    cmds = {pid: _cmdline(pid) for pid in stats}
    cpu = dict.fromkeys(GROUPS, 0.0)
    for pid, (ppid, seconds) in stats.items():
        group = _group(cmds[pid], cmds.get(str(ppid), ""))
        if group is not None:
            cpu[group] += seconds
    times = os.times()
    cpu["load generator"] += times.children_user + times.children_system
    return cpu


def rss_of(root: int) -> tuple[int, int, int, int]:
    """(peak RSS, current RSS, current PSS, process count) of ROOT and its descendants, in
    KiB. RSS counts a page shared by several processes (the code and data every forked
    worker inherits) once in each of them; PSS divides it among them."""
    parents: dict[int, list[int]] = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit() and (s := _stat(pid)):
            parents.setdefault(s[0], []).append(int(pid))
    seen, stack = [], [root]
    while stack:
        pid = stack.pop()
        seen.append(pid)
        stack.extend(parents.get(pid, []))
    if _cmdline(str(root)).startswith(("make ", "/usr/bin/make ")):
        seen.remove(root)  # `make` itself waits for the supervisor: not part of the stack
    peak = current = pss = 0
    for pid in seen:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak += int(line.split()[1])
                elif line.startswith("VmRSS:"):
                    current += int(line.split()[1])
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1])
    return peak, current, pss, len(seen)


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {group: after[group] - before[group] for group in GROUPS}


# --- the stack ---------------------------------------------------------------------------------


@contextlib.contextmanager
def make_run(stack: str, workdir: Path) -> Iterator[tuple[str, int, str, dict[str, str]]]:
    """``make run`` on its own port, database and var folder; yields (URL, pid, token, the
    stack's environment)."""
    port = free_port()
    env = {**os.environ, "PORT": str(port), "TASKDESK_VAR_DIR": str(workdir / "var")}
    # The shipped defaults, not a developer's overrides (BENCH_ENV="NAME=VALUE ..." sets some
    # on purpose, to measure another setting).
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "WEB_WORKERS", "WEB_THREADS", "LOG_LEVEL"):
        env.pop(name, None)
    env.update(item.split("=", 1) for item in os.environ.get("BENCH_ENV", "").split())
    # The webhook phase's receiver listens on loopback over plain http.
    env["TASKDESK_WEBHOOK_ALLOW_HTTP_LOOPBACK"] = "1"
    with contextlib.ExitStack() as stack_:
        if stack == "postgres":
            env["DATABASE_URL"] = stack_.enter_context(database("taskdesk_shipped"))
            env["CELERY_BROKER_URL"] = REDIS
            subprocess.run(["redis-cli", "-u", REDIS, "FLUSHDB"], check=False, capture_output=True)
        log = workdir / f"make-run-{stack}.log"
        # In its own process group, stopped with SIGTERM when the block ends.
        proc = stack_.enter_context(process(["make", "run"], env=env, log=log))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                sys.exit(f"bench: make run exited; see {workdir}/make-run-{stack}.log")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz?strict=1", timeout=2).status_code == 200:
                    break
            time.sleep(0.5)
        else:
            sys.exit("bench: make run did not become ready within 180 s")
        out = subprocess.run(
            [
                str(ROOT / ".venv/bin/python"),
                "manage.py",
                "create_client_token",
                "--client",
                f"bench-{stack}",
                "--tenant",
                "bench",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        token = out.stdout.strip().splitlines()[-1].strip()
        time.sleep(3)  # the worker and beat settle
        yield f"{url}/mcp", proc.pid, token, env


# --- phase 1: CPU per task ----------------------------------------------------------------


def lg_python() -> str:
    venv = CACHE / "lg-venv"
    if not (venv / "bin/python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin/pip"), "install", "-q", "aiohttp"], check=True)
    return str(venv / "bin/python")


def load(*args: str) -> dict[str, Any]:
    """Run the load generator (ARGS: its command and options); return its figures.

    A drain's sentinel task refused because the client is at its limit of active tasks (an
    accept phase on a fast machine can leave more than TASKDESK_MAX_ACTIVE_TASKS_PER_CLIENT
    waiting) is sent again after the answer's retryAfterMs, as a client would, for up to ten
    minutes."""
    deadline = time.monotonic() + 600
    while True:
        out = subprocess.run(
            [lg_python(), str(SHARED / "mcp_tasks_load.py"), *args], capture_output=True, text=True
        )
        lines = out.stdout.strip().splitlines()
        if out.returncode == 0 and lines:
            return json.loads(lines[-1])  # type: ignore[no-any-return]
        limited = re.search(r"active_task_limit.*?retryAfterMs\W+(\d+)", out.stdout)
        if args[0] != "drain" or limited is None or time.monotonic() > deadline:
            sys.exit(f"bench: mcp_tasks_load.py {args[0]} failed:\n{out.stdout}\n{out.stderr}")
        time.sleep(int(limited.group(1)) / 1000)


def cpu_per_task(url: str, token: str) -> dict[str, Any]:
    auth = f"Bearer {token}"
    env = {**os.environ, "BENCH_TOOL": TOOL, "BENCH_ARGS": TOOL_ARGS, "BENCH_AUTH": auth}
    common = ["--tool", TOOL, "--args", TOOL_ARGS, "--timeout", "300"]
    os.environ["BENCH_AUTH"] = auth  # mcp_tasks_load.py reads it
    load("e2e", url, *common, "--n", "200", "--conc", "16")  # warm-up
    before = snapshot()
    wrk = subprocess.run(
        ["wrk", "-t2", "-c16", "-d10s", "--timeout", "10s", "-s", "accept.lua", url],
        cwd=SHARED / "lua",
        env=env,
        capture_output=True,
        text=True,
    )
    mid = snapshot()
    load("drain", url, *common)
    after = snapshot()
    figures = json.loads(wrk.stdout.split("BENCH_JSON ", 1)[1].splitlines()[0])
    accepted = round(figures["ok_rps"] * figures["duration_s"])
    e2e_before = snapshot()
    e2e = load("e2e", url, *common, "--n", "2000", "--conc", "16", "--mode", "phased")
    e2e_after = snapshot()
    return {
        "accepted": accepted,
        "accept_rps": figures["ok_rps"],
        "accept": delta(before, mid),
        "drain": delta(mid, after),
        "e2e_tasks": e2e.get("completed", 2000),
        "e2e_rate": e2e["tasks_per_s"],
        "e2e": delta(e2e_before, e2e_after),
    }


def cpu_table(cpu: dict[str, Any]) -> str:
    rows = [
        "| process | accept: ms per accepted task | accept + drain | end to end: ms per task |",
        "| --- | ---: | ---: | ---: |",
    ]
    accepted, tasks = cpu["accepted"], cpu["e2e_tasks"]
    totals = [0.0, 0.0, 0.0]
    for group in GROUPS:
        a = cpu["accept"][group] * 1000 / accepted
        ad = (cpu["accept"][group] + cpu["drain"][group]) * 1000 / accepted
        e = cpu["e2e"][group] * 1000 / tasks
        totals = [totals[0] + a, totals[1] + ad, totals[2] + e]
        rows.append(f"| {group} | {a:.2f} | {ad:.2f} | {e:.2f} |")
    rows.append(f"| **total** | **{totals[0]:.2f}** | **{totals[1]:.2f}** | **{totals[2]:.2f}** |")
    rows.append("")
    rows.append(
        f"Accept: {cpu['accepted']} tasks in 10 s ({cpu['accept_rps']:.0f}/s), the worker "
        f'running them meanwhile; "accept + drain" adds what the stack spent until the '
        f"last of them had run. End to end: {tasks} tasks at {cpu['e2e_rate']:.0f} tasks/s. "
        "Two cores give 2,000 ms of CPU per second, so a total of T ms per task bounds the "
        "rate at 2000 / T."
    )
    return "\n".join(rows)


# --- phase 2: side by side -------------------------------------------------------------------


def side_by_side(url: str, token: str, pid: int, out: Path, *, peer: bool) -> list[dict[str, Any]]:
    """Run ``side_by_side.sh`` (or, without PEER, only its half against us) and return the
    rows of its results.jsonl."""
    env = {**os.environ, "TARGET_PIDS": str(pid)}
    if peer:
        script = [str(SHARED / "side_by_side.sh"), url, token, str(out)]
    else:
        env.update(BENCH_AUTH=f"Bearer {token}", TOOL=TOOL, TOOL_ARGS=TOOL_ARGS)
        env.update(LG_PYTHON=lg_python(), REPEATS=os.environ.get("REPEATS", "2"))
        script = [str(SHARED / "bench_target.sh"), url, "taskdesk", str(out)]
    done = subprocess.run(script, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench: {script[0]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


# The figures side_by_side.sh prints, as (title, figure, key, higher is better).
FIGURES = [
    ("accept, req/s", "accept", "ok_rps", True),
    ("accept p99, ms", "accept", "p99_ms", False),
    ("accept, 1 connection, p50 ms", "accept_c1", "p50_ms", False),
    ("tasks/get, req/s", "get", "ok_rps", True),
    ("tasks/get p99, ms", "get", "p99_ms", False),
    ("tasks/get, 1 connection, p50 ms", "get_c1", "p50_ms", False),
    ("end to end, tasks/s", "e2e", "tasks_per_s", True),
    ("closed loop p50, ms", "e2e_closed", "lat_p50_ms", False),
    ("closed loop p99, ms", "e2e_closed", "lat_p99_ms", False),
]


def _median(rows: list[dict[str, Any]], label: str, figure: str, key: str) -> float | None:
    values = [
        r[key] for r in rows
        if r.get("figure") == figure and label in r.get("label", "") and isinstance(r.get(key), int | float)
    ]  # fmt: skip
    return statistics.median(values) if values else None


def ratio_table(rows: list[dict[str, Any]]) -> str:
    """Medians of the repeats, ours beside the peer's (the median of each figure, as
    side_by_side.sh prints them), with the ratio: ours / peer for rates, peer / ours for
    latencies, so above 1 is better for Taskdesk either way."""
    peer = any("redis-x2" in r.get("label", "") for r in rows)
    head = (
        "| figure | Taskdesk | peer | ratio |\n| --- | ---: | ---: | ---: |"
        if peer
        else ("| figure | Taskdesk |\n| --- | ---: |")
    )
    lines = [head]
    for title, figure, key, higher in FIGURES:
        ours = _median(rows, "taskdesk", figure, key)
        if ours is None:
            continue
        if not peer:
            lines.append(f"| {title} | {ours:.1f} |")
            continue
        theirs = _median(rows, "redis-x2", figure, key)
        if theirs is None:
            lines.append(f"| {title} | {ours:.1f} | - | - |")
            continue
        ratio = ours / theirs if higher else theirs / ours
        lines.append(f"| {title} | {ours:.1f} | {theirs:.1f} | {ratio:.2f} |")
    return "\n".join(lines)


def rss_line(rows: list[dict[str, Any]], ours: tuple[int, int, int, int]) -> str:
    peer = [r for r in rows if r.get("figure") == "rss" and r.get("label") != "taskdesk"]
    peak, current, pss, count = ours
    peer_kb = peer[-1]["hwm_kb"] if peer else 0
    peer_text = f"; the peer's two processes: {peer_kb / 1024:.0f} MiB" if peer else ""
    ratio = (
        f" Taskdesk's PSS is {pss / peer_kb:.2f} times the peer's peak RSS (goal: at most "
        "1.5 with at most 8 processes)."
        if peer_kb
        else ""
    )
    return (
        f"Peak RSS of all Taskdesk processes (sum of VmHWM over {count} processes, the "
        f"supervisor and what it runs, read after the run): {peak / 1024:.0f} MiB{peer_text}. "
        f"After the run they held {current / 1024:.0f} MiB of RSS and {pss / 1024:.0f} MiB of "
        f"PSS (shared pages counted once).{ratio}"
    )


def machine_line() -> str:
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (
        f"{os.cpu_count()}-core machine ({model}, Linux {platform.release()}, Python "
        f"{platform.python_version()}, load average {os.getloadavg()[0]:.2f} at the start)"
    )


def write_docs(text: str) -> None:
    docs = DOCS.read_text()
    block = f"{START}\n{text}\n{END}"
    if START in docs and END in docs:
        head, rest = docs.split(START, 1)
        docs = head + block + rest.split(END, 1)[1]
    else:
        docs = docs.replace("# Benchmarks\n", f"# Benchmarks\n\n{block}\n", 1)
    DOCS.write_text(docs)


# --- phase 3: the same stack with a webhook endpoint on its client ---------------------------

WEBHOOK_EVENTS = ("task.completed", "task.failed", "task.cancelled", "task.input_required",
                  "effect.unknown")  # fmt: skip


_NGINX = """
daemon off;
worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/error.log;
events {{ worker_connections 256; }}
http {{
    log_format status '$status';
    access_log {folder}/access.log status;
    client_body_temp_path {folder}/body;
    proxy_temp_path {folder}/proxy;
    fastcgi_temp_path {folder}/fastcgi;
    uwsgi_temp_path {folder}/uwsgi;
    scgi_temp_path {folder}/scgi;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port};
        location / {{ return 204; }}
    }}
}}
"""


class Receiver:
    """The webhook receiver: nginx answering every POST with 204 at once and keeping the
    connection alive, as a receiver behind any common server does. A receiver runs on
    another machine; nginx costs this one about as little as a receiver can, so what is
    measured is Taskdesk's side of the deliveries. Its access log (one line of four bytes a
    request) counts them."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.log = folder / "access.log"

    @contextlib.contextmanager
    def running(self) -> Iterator[Receiver]:
        self.folder.mkdir(parents=True, exist_ok=True)
        config = self.folder / "nginx.conf"
        config.write_text(_NGINX.format(folder=self.folder, port=self.port))
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        with process([nginx, "-c", str(config), "-p", str(self.folder)], env=dict(os.environ),
                     log=self.folder / "nginx.log"):  # fmt: skip
            deadline = time.monotonic() + 10
            while not _listening(self.port):
                if time.monotonic() > deadline:
                    sys.exit(f"bench: nginx did not start; see {self.folder}/nginx.log")
                time.sleep(0.05)
            yield self

    def received(self) -> int:
        return self.log.stat().st_size // 4 if self.log.exists() else 0


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


def _manage(env: dict[str, str], *args: str) -> str:
    out = subprocess.run([str(ROOT / ".venv/bin/python"), "manage.py", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    return out.stdout


def _wait_for_deliveries(receiver: Receiver, expected: int) -> None:
    """Until RECEIVER has 99 % of EXPECTED deliveries (at most two minutes)."""
    deadline = time.monotonic() + 120
    while receiver.received() < expected * 0.99 and time.monotonic() < deadline:
        time.sleep(0.2)


# What the webhook phase reports of each end-to-end round's CPU (ms per task), by group.
_COST_GROUPS = ("control worker and beat", "PostgreSQL", "web", "total")


def with_webhooks(
    url: str, token: str, env: dict[str, str], client: str, folder: Path
) -> dict[str, Any]:
    """Accept (wrk, 10 s) and end to end (2,000 tasks) without and with one webhook endpoint
    (every event) on the client, alternately, ``BENCH_WEBHOOK_ROUNDS`` (3) times each; the
    endpoint is a local receiver that answers 204 at once (``Receiver``, in FOLDER), so what
    is measured is Taskdesk's side of the deliveries. End to end starts once the accept
    phase's tasks are delivered: it competes with the deliveries of its own tasks, not with
    ten seconds of accepted tasks' deliveries left over."""
    with Receiver(folder).running() as receiver:
        return _alternately(receiver, url, token, env, client)


def _alternately(
    receiver: Receiver, url: str, token: str, env: dict[str, str], client: str
) -> dict[str, Any]:
    hook = receiver.url
    _manage(env, "add_webhook", "--client", client, "--url", hook, "--events", *WEBHOOK_EVENTS)
    auth = f"Bearer {token}"
    wrk_env = {**os.environ, "BENCH_TOOL": TOOL, "BENCH_ARGS": TOOL_ARGS, "BENCH_AUTH": auth}
    os.environ["BENCH_AUTH"] = auth  # mcp_tasks_load.py reads it
    common = ["--tool", TOOL, "--args", TOOL_ARGS, "--timeout", "300"]
    figures: dict[str, dict[str, list[float]]] = {
        "without": {"accept": [], "e2e": [], "gets": [], **{g: [] for g in _COST_GROUPS}},
        "with": {"accept": [], "e2e": [], "gets": [], **{g: [] for g in _COST_GROUPS}},
    }
    rounds = int(os.environ.get("BENCH_WEBHOOK_ROUNDS", "3"))
    for label in ("without", "with") * rounds:
        enabled = "True" if label == "with" else "False"
        _manage(env, "shell", "-c", "from tasks_app.models import WebhookEndpoint; "
                f"WebhookEndpoint.objects.update(enabled={enabled})")  # fmt: skip
        before = receiver.received()
        wrk = subprocess.run(
            ["wrk", "-t2", "-c16", "-d10s", "--timeout", "10s", "-s", "accept.lua", url],
            cwd=SHARED / "lua", env=wrk_env, capture_output=True, text=True,
        )  # fmt: skip
        accept = json.loads(wrk.stdout.split("BENCH_JSON ", 1)[1].splitlines()[0])
        load("drain", url, *common)
        accepted = round(accept["ok_rps"] * accept["duration_s"])
        if label == "with":  # end to end competes with its own tasks' deliveries only
            _wait_for_deliveries(receiver, before + accepted)
        before_e2e = snapshot()
        e2e = load("e2e", url, *common, "--n", "2000", "--conc", "16", "--mode", "phased")
        spent = delta(before_e2e, snapshot())
        figures[label]["accept"].append(accept["ok_rps"])
        figures[label]["e2e"].append(e2e["tasks_per_s"])
        figures[label]["gets"].append(e2e.get("gets", 2000) / 2000)
        for group in _COST_GROUPS:  # CPU ms per end-to-end task
            figures[label][group].append(
                sum(spent.values()) / 2 if group == "total" else spent[group] / 2
            )
        if label == "with":  # and the next round starts with nothing left to deliver
            _wait_for_deliveries(receiver, before + accepted + 2000)
        say(f"{label} webhooks: accept {accept['ok_rps']:.0f} req/s, "
            f"end to end {e2e['tasks_per_s']:.0f} tasks/s")  # fmt: skip
    claims = _manage(env, "shell", "-c", "from tasks_app.models import OutboxMessage; "
                     "sent = OutboxMessage.objects.filter(delivered_at__isnull=False); "
                     "print(sent.count(), sent.values('delivered_at').distinct().count())")  # fmt: skip
    sent, taken = (int(n) for n in claims.strip().splitlines()[-1].split())
    return {"figures": figures, "delivered": receiver.received(), "per_claim": sent / max(taken, 1)}


def webhook_table(result: dict[str, Any]) -> str:
    figures = result["figures"]
    lines = ["| figure | without webhooks | with a webhook endpoint | with / without |",
             "| --- | ---: | ---: | ---: |"]  # fmt: skip
    for key, title in (("accept", "accept, req/s"), ("e2e", "end to end, tasks/s")):
        off = statistics.median(figures["without"][key])
        on = statistics.median(figures["with"][key])
        lines.append(f"| {title} | {off:.1f} | {on:.1f} | {on / off:.2f} |")
    # How an end-to-end task's cost moved (older results have no such figures).
    costs = [("gets", "`tasks/get` per end-to-end task")] + [
        (group, f"end to end, CPU ms per task: {group}") for group in _COST_GROUPS
    ]
    for key, title in costs:
        if figures["without"].get(key) and figures["with"].get(key):
            off = statistics.median(figures["without"][key])
            on = statistics.median(figures["with"][key])
            lines.append(f"| {title} | {off:.2f} | {on:.2f} | {on / off:.2f} |")
    return "\n".join(lines)


def run(stack: str, workdir: Path) -> str:
    label = "PostgreSQL + Redis" if stack == "postgres" else "SQLite + the embedded broker"
    # The peer runs on Redis: it is measured beside the PostgreSQL + Redis stack only.
    peer = stack == "postgres" and os.environ.get("BENCH_SKIP_PEER") != "1"
    say(f"make run on {label}")
    hooks: dict[str, Any] | None = None
    with make_run(stack, workdir) as (url, pid, token, env):
        say("CPU per task, by process")
        cpu = cpu_per_task(url, token)
        say("side by side with the peer" if peer else "the side-by-side figures (ours only)")
        rows = side_by_side(url, token, pid, workdir / f"side-by-side-{stack}", peer=peer)
        rss = rss_of(pid)
        if stack == "postgres" and os.environ.get("BENCH_SKIP_WEBHOOKS") != "1":
            say("without and with a webhook endpoint on the client")
            hooks = with_webhooks(url, token, env, f"bench-{stack}", workdir / "receiver")
    ratios = ratio_table(rows)
    table = cpu_table(cpu)
    ratio_note = (
        "Ratios are Taskdesk / peer for rates and peer / Taskdesk for latencies: above 1, "
        "Taskdesk is ahead. "
        if peer
        else "The peer runs on Redis, so it is measured beside the PostgreSQL + Redis stack only. "
    )
    section = (
        f"### `make run` on {label}\n\n{ratios}\n\n{ratio_note}{rss_line(rows, rss)}\n\n"
        f"CPU per task by process (ms):\n\n{table}"
    )
    if hooks is not None:
        section += (
            "\n\nWith a webhook endpoint (every event) on the client, against a local receiver "
            "(nginx) that answers at once; without and with alternately, "
            f"{len(hooks['figures']['with']['e2e'])} times each, the median of "
            f"each ({hooks['delivered']:,} deliveries received, "
            f"{hooks['per_claim']:.0f} messages a claim on average; "
            "target: within 10 %):\n\n"
            f"{webhook_table(hooks)}"
        )
    print(section, flush=True)
    return section


def main() -> None:
    choice = os.environ.get("BENCH_STACK", "postgres")
    stacks = ["postgres", "embedded"] if choice == "both" else [choice]
    workdir = Path(tempfile.mkdtemp(prefix="taskdesk-shipped-"))
    started = datetime.now(UTC).strftime("%Y-%m-%d")
    parts = [
        f"_Run of {started} (`make bench`, bench/shipped.py), on this {machine_line()}:_",
        "",
    ]
    try:
        for stack in stacks:
            parts.append(run(stack, workdir))
            parts.append("")
    finally:
        if os.environ.get("BENCH_KEEP") != "1":
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            say(f"logs kept in {workdir}")
    text = "\n".join(parts).rstrip()
    if os.environ.get("BENCH_NO_DOCS") != "1":
        write_docs(text)
        say(f"wrote {DOCS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
