"""Build Taskdesk's wheel, install it alone in a new virtualenv, and run a task through it.

From a folder outside the repository, with only the wheel and its dependencies installed (no
development extras; the versions of constraints.txt): `taskdesk migrate`, `collectstatic`,
`bootstrap` (whose demo token is kept in TASKDESK_VAR_DIR), then `taskdesk serve`, `worker`
and `control` against PostgreSQL (a database of its own, made and dropped here) and Redis (a
database number of its own, emptied before and after). A `tools/call` of the demo
`slow_echo` as a task (the 2026-07-28 wire, the demo token) must complete, polled with
`tasks/get`, and the dashboard's sign-in page must serve its stylesheet as text/css.

Run from the project's root: ``.venv/bin/python scripts/wheel_smoke.py`` (`.ci/run` does).
Exit 1, with every process's output, on any failure; the processes, the database and the
folder are removed either way. WHEEL_SMOKE_DATABASE_URL and WHEEL_SMOKE_BROKER_URL choose
the services (postgres://postgres@127.0.0.1:5432/taskdesk_wheel, redis://127.0.0.1:6379/13).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urljoin, urlsplit

ROOT = Path(__file__).resolve().parent.parent
# What the wheel is built from (setup.py names the packages): copied out of the checkout,
# so that the build's folders (build/, *.egg-info) are not left in it.
SOURCES = ["pyproject.toml", "setup.py", "README.md", "LICENSE", "config", "tasks_app"]
SOURCES += ["elicitations", "templates", "static"]
DATABASE_URL = os.environ.get(
    "WHEEL_SMOKE_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/taskdesk_wheel"
)
BROKER_URL = os.environ.get("WHEEL_SMOKE_BROKER_URL", "redis://127.0.0.1:6379/13")
VERSION = "2026-07-28"
STARTED = time.monotonic()


class Failed(Exception):
    pass


def say(text: str) -> None:
    print(f"[wheel smoke {time.monotonic() - STARTED:5.1f} s] {text}", flush=True)


def run(args: list[str], **kwargs: Any) -> str:
    say("$ " + " ".join(str(a) for a in args))
    done = subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)
    if done.returncode != 0:
        raise Failed(f"{args[0]} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    out: str = done.stdout
    return out


def build_wheel(folder: Path) -> Path:
    source = folder / "source"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, source / name)
    dist = folder / "dist"
    run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(source)]
    )
    (wheel,) = dist.glob("taskdesk-*.whl")
    return wheel


def install(folder: Path, wheel: Path) -> Path:
    venv = folder / "venv"
    run(["python3", "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    run([*pip, "-c", str(ROOT / "constraints.txt"), str(wheel)])
    return venv / "bin"


def _database(statement: str) -> None:
    parts = urlsplit(DATABASE_URL)
    admin = parts._replace(path="/postgres").geturl()
    run(["psql", admin, "-v", "ON_ERROR_STOP=1", "-qc", statement])


def _flush_broker() -> None:
    parts = urlsplit(BROKER_URL)
    number = parts.path.strip("/") or "0"
    host, port = parts.hostname or "127.0.0.1", str(parts.port or 6379)
    run(["redis-cli", "-h", host, "-p", port, "-n", number, "flushdb"])


@contextlib.contextmanager
def services() -> Iterator[None]:
    name = urlsplit(DATABASE_URL).path.strip("/")
    _database(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    _database(f'CREATE DATABASE "{name}"')
    _flush_broker()
    try:
        yield
    finally:
        with contextlib.suppress(Failed):
            _database(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        with contextlib.suppress(Failed):
            _flush_broker()


class Processes:
    """The started processes, each in a session of its own, stopped with their children."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, args: list[str], **kwargs: Any) -> None:
        say("$ " + " ".join(args) + " &")
        with open(self.folder / f"{name}.log", "wb") as log:
            self.started[name] = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kwargs
            )

    def check_alive(self) -> None:
        for name, process in self.started.items():
            if process.poll() is not None:
                raise Failed(f"taskdesk {name} exited {process.returncode}")

    def stop(self) -> None:
        for process in self.started.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in self.started.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # what is left of its session
            process.wait()

    def logs(self) -> str:
        return "\n".join(
            f"--- taskdesk {name}\n{(self.folder / f'{name}.log').read_text(errors='replace')}"
            for name in self.started
        )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(what: str, check: Callable[[], Any], processes: Processes, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        processes.check_alive()
        try:
            value = check()
        except (OSError, urllib.error.URLError, ValueError) as error:
            last, value = error, None
        if value:
            return value
        time.sleep(0.2)
    raise Failed(f"timed out after {timeout} s waiting for {what} (last error: {last})")


def get(url: str) -> tuple[int, str, bytes, str]:
    """Status, Content-Type, body and final URL of a GET (redirects followed)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.headers["Content-Type"], response.read(), response.url


def mcp(url: str, token: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientInfo": {"name": "wheel-smoke", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": {"io.modelcontextprotocol/tasks": {}}
        },
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    name = params.get("name") or params.get("taskId")
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": method,
        "Mcp-Name": str(name),
        "Authorization": f"Bearer {token}",
    }
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
        if response.headers["Content-Type"].startswith("text/event-stream"):
            data = [line[5:] for line in text.splitlines() if line.startswith("data:")]
            text = [d for d in data if d.strip()][-1]
    answer: dict[str, Any] = json.loads(text)
    if "result" not in answer:
        raise Failed(f"{method} answered {answer}")
    result: dict[str, Any] = answer["result"]
    return result


def smoke(folder: Path, processes: Processes) -> None:
    wheel = build_wheel(folder)
    say(f"built {wheel.name}")
    bin_dir = install(folder, wheel)
    taskdesk = str(bin_dir / "taskdesk")
    work = folder / "work"  # outside the repository: nothing of the checkout is importable
    work.mkdir()
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTHON"))},
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DATABASE_URL": DATABASE_URL,
        "CELERY_BROKER_URL": BROKER_URL,
        "TASKDESK_VAR_DIR": str(folder / "var"),
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "TASKDESK_PORT": str(port),
        "WEB_WORKERS": "1",
        "LOG_LEVEL": "WARNING",
    }
    where = run([str(bin_dir / "python"), "-c", "import tasks_app, taskdesk; print(tasks_app.__file__, taskdesk.__file__)"], cwd=work, env=env)  # fmt: skip
    if str(ROOT) in where:
        raise Failed(f"the installed packages come from the checkout: {where}")
    run([taskdesk, "migrate", "--noinput", "-v0"], cwd=work, env=env)
    run([taskdesk, "manage", "collectstatic", "--noinput", "-v0"], cwd=work, env=env)
    run([taskdesk, "bootstrap"], cwd=work, env=env)
    token = (folder / "var" / "demo_token").read_text().strip()
    for name in ("serve", "worker", "control"):
        processes.start(name, [taskdesk, name], cwd=work, env=env)
    base = f"http://127.0.0.1:{port}"
    wait_for(
        "taskdesk serve to answer /livez", lambda: get(f"{base}/livez")[0] == 200, processes, 30
    )
    receipt = mcp(f"{base}/mcp", token, "tools/call", {"name": "slow_echo", "arguments": {"text": "from the wheel", "seconds": 0}})  # fmt: skip
    if receipt.get("resultType") != "task":
        raise Failed(f"tools/call answered no task: {receipt}")
    task_id = receipt["taskId"]
    say(f"task {task_id} accepted")

    def ended() -> dict[str, Any] | None:
        got = mcp(f"{base}/mcp", token, "tasks/get", {"taskId": task_id})
        return got if got["status"] in {"completed", "failed", "cancelled"} else None

    final = wait_for(f"task {task_id} to end", ended, processes, 30)
    if final["status"] != "completed" or "from the wheel" not in json.dumps(final.get("result")):
        raise Failed(f"the task ended so: {final}")
    say(f"task {task_id} completed")
    status, _, page, page_url = get(f"{base}/tasks/")
    found = re.search(rb'<link[^>]*rel="stylesheet"[^>]*href="([^"]+)"', page)
    if status != 200 or not found:
        raise Failed(f"{page_url} answered {status} with no stylesheet link:\n{page[:2000]!r}")
    css_url = urljoin(page_url, found.group(1).decode())
    status, content_type, css, _ = get(css_url)
    if status != 200 or not content_type.startswith("text/css") or not css:
        raise Failed(f"{css_url} answered {status} {content_type} ({len(css)} bytes)")
    say(f"{page_url} links {css_url}: {status} {content_type}, {len(css)} bytes")


def main() -> int:
    folder = Path(tempfile.mkdtemp(prefix="taskdesk-wheel-smoke-"))
    processes = Processes(folder)

    def stopped(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(f"wheel smoke: stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGHUP, stopped)
    try:
        with services():
            try:
                smoke(folder, processes)
            finally:
                processes.stop()
    except (Failed, subprocess.SubprocessError, OSError, ValueError, KeyError) as error:
        print(processes.logs(), file=sys.stderr)
        print(f"WHEEL SMOKE FAILED: {error}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    say("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
