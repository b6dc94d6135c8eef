"""`make run` with the real processes: a Ctrl-C lets each Celery worker finish the leg it is
running, a process that died stops the others with a message naming it, the start-up banner
names only URLs, files and commands that work, and an idle stack writes nothing."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tasks_app.models import Status
from tests import wire
from tests.integration.worker_helpers import leg_pid, submit
from tests.live import BIN, ROOT, LiveStack, stop_process, wait_for

# serial: it times `make run` as a user meets it (start-up, Ctrl-C letting a leg finish within
# the supervisor's ten seconds), which parallel workers beside it would slow (tests/parallel.py).
pytestmark = [pytest.mark.live, pytest.mark.slow, pytest.mark.serial]


@contextmanager
def make_run(**env: str) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """The command `make run` ends in, started in a session of its own (as a terminal's
    foreground job), once every process has said it is up."""
    stack = LiveStack()  # only for its environment: a private folder, port and broker
    stack.collect_static()
    out = stack.tmp / "run.log"
    with open(out, "wb") as log:
        supervisor = subprocess.Popen(
            [
                str(BIN / "python"),
                "scripts/run_procfile.py",
                "-f",
                "Procfile",
                "--port",
                str(stack.port),
                "--preload",
                "config.preload",
            ],
            cwd=ROOT,
            env={**stack.env, "PATH": f"{BIN}:{os.environ['PATH']}", **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            "every process to start",
            lambda: (
                all(
                    f"{n}.1 started" in (text := out.read_text())
                    for n in ("web", "worker", "control")
                )
                and text.count(" ready.") >= 2
            ),  # both Celery workers
            timeout=90,
            every=0.3,
            explain=lambda: out.read_text()[-3000:],
        )
        yield supervisor, out
    finally:
        stop_process(supervisor)


def test_ctrl_c_lets_the_worker_finish_the_leg_it_is_running(transactional_db, alice) -> None:  # type: ignore[no-untyped-def]
    with make_run() as (supervisor, out):
        task = submit(alice, "slow_echo", text="finish me", seconds=3)
        wait_for("the leg to start", lambda: leg_pid(task), timeout=30)
        interrupted = time.monotonic()
        os.killpg(supervisor.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
        supervisor.wait(30)
        took = time.monotonic() - interrupted
        text = out.read_text()

    assert supervisor.returncode == 0, text[-3000:]
    assert "SIGINT received: sending SIGTERM to web.1, worker.1, control.1" in text
    assert "worker.1  | worker: Warm shutdown" in text
    assert "WorkerLostError" not in text, text[-3000:]
    for name in ("web", "worker", "control"):
        assert f"{name}.1 stopped (rc=0)" in text, text[-3000:]
    assert took < 10
    task.refresh_from_db()
    assert task.status == Status.COMPLETED  # the leg ran to its end before the worker stopped
    assert task.leg == 1


def test_a_worker_that_dies_stops_make_run_with_a_message_naming_it(transactional_db) -> None:
    with make_run() as (supervisor, out):
        found = re.search(r"worker\.1 started \(pid=(\d+)\)", out.read_text())
        assert found is not None
        os.kill(int(found.group(1)), signal.SIGKILL)
        supervisor.wait(60)
        text = out.read_text()

    assert "worker.1 stopped (rc=-9)" in text
    assert "worker.1 ended: sending SIGTERM to web.1, control.1" in text
    assert supervisor.returncode == 1
    for name in ("web", "control"):
        assert f"{name}.1 stopped" in text, text[-3000:]


def _with_children(pid: int) -> list[int]:
    """PID and its children: a Celery worker's pool processes, gunicorn's web processes."""
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    ).stdout
    return [pid, *(int(child) for child in out.split())]


def _started_pid(text: str, name: str) -> int:
    found = re.search(rf"{name}\.1 started \(pid=(\d+)\)", text)
    assert found is not None, text[-3000:]
    return int(found.group(1))


def test_the_leg_worker_yields_the_cpu_to_the_web_processes(transactional_db) -> None:  # type: ignore[no-untyped-def]
    with make_run(WORKER_NICE="7") as (_supervisor, out):
        text = out.read_text()
        processes = {
            name: _with_children(_started_pid(text, name)) for name in ("web", "worker", "control")
        }
        nice = {
            name: {os.getpriority(os.PRIO_PROCESS, pid) for pid in pids}
            for name, pids in processes.items()
        }
        groups = {
            name: {Path(f"/proc/{pid}/autogroup").read_text().split()[-1] for pid in pids}
            for name, pids in processes.items()
            if Path(f"/proc/{pids[0]}/autogroup").exists()
        }

    assert len(processes["worker"]) == 3  # the worker and its two pool processes
    assert nice == {"web": {0}, "worker": {7}, "control": {0}}
    if not groups:
        pytest.skip("this kernel has no autogroup; the nice values above are the whole story")
    # Each process leads a session of its own, whose scheduling group takes its priority.
    assert groups == {"web": {"0"}, "worker": {"7"}, "control": {"0"}}


@contextmanager
def real_make_run(**env: str) -> Iterator[tuple[subprocess.Popen[bytes], Path, LiveStack]]:
    """`make run` itself: the Makefile's recipe (migrate, collectstatic, bootstrap,
    clear_metrics, then the supervisor), in a session of its own, once every process is up
    and the server answers. ``-o`` takes the virtualenv's install stamp as up to date: the
    test run installed it, and must not install it again under itself."""
    stack = LiveStack()  # for its environment: a private folder, port, database and broker
    out = stack.tmp / "make-run.log"
    with open(out, "wb") as log:
        make = subprocess.Popen(
            ["make", "--no-print-directory", "-o", ".venv/.installed", "run", f"PORT={stack.port}"],
            cwd=ROOT,
            env={**stack.env, "PATH": f"{BIN}:{os.environ['PATH']}", **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def up() -> bool:
        text = out.read_text()
        if make.poll() is not None:
            raise AssertionError(f"make run ended with {make.returncode}:\n{text[-3000:]}")
        if text.count(" ready.") < 2 or "control.1 started" not in text:
            return False
        try:
            return httpx.get(f"{stack.url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for("make run to be up", up, timeout=180, every=0.5, explain=lambda: out.read_text())
        yield make, out, stack
    finally:
        stop_process(make)


def _banner(text: str) -> list[str]:
    """The lines `make run` printed from "Taskdesk is starting." to its first process's."""
    lines = text.splitlines()
    start = lines.index("Taskdesk is starting.")
    end = next(i for i, line in enumerate(lines) if re.match(r"\d\d:\d\d:\d\d system ", line))
    return [line for line in lines[start:end] if line.strip()]


def _log_in(client: httpx.Client, username: str, password: str) -> None:
    page = client.get("/accounts/login/")
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert found is not None, page.text
    answer = client.post(
        "/accounts/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": found[1]},
    )
    assert answer.status_code == 302, answer.text
    assert answer.headers["Location"] == "/tasks/"


def test_make_run_names_what_works_and_then_keeps_quiet(transactional_db) -> None:  # type: ignore[no-untyped-def]
    with real_make_run() as (_make, out, stack):
        # Idle: no process writes a line (beat sends a job every second here, whose INFO line
        # per job is off by default: BEAT_LOG_LEVEL).
        time.sleep(3)  # the last start-up lines
        before = out.read_text().splitlines()
        time.sleep(15)
        idle = out.read_text().splitlines()[len(before) :]
        assert idle == [], "\n".join(idle)

        banner = _banner(out.read_text())
        labels = {
            line.split(" : ")[0].strip(): line.split(" : ", 1)[1]
            for line in banner[1:]
            if " : " in line
        }
        base = stack.url
        assert labels["MCP endpoint"] == f"{base}/mcp"
        assert labels["Dashboard"] == f"{base}/tasks/"
        assert labels["Inbox"] == f"{base}/inbox/"
        assert labels["Health"] == f"{base}/healthz"
        urls = set(re.findall(r"https?://[^\s']+", "\n".join(banner)))
        assert urls == {
            f"{base}/mcp",
            f"{base}/tasks/",
            f"{base}/inbox/",
            f"{base}/healthz",
            f"{base}/admin/password_change/",
        }

        # The files it names: private, and what they hold works.
        found = re.fullmatch(r"(\S+), password in (\S+)", labels["Operator"])
        assert found is not None, banner
        username, password_file = found[1], ROOT / found[2]
        token_file = ROOT / re.fullmatch(r"(\S+)   \(kept in (\S+)\)", labels["Demo token"])[2]  # type: ignore[index]
        for path in (password_file, token_file):
            assert path.parent == stack.tmp
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert labels["Demo token"].startswith(token + " ")
        password = password_file.read_text().strip()
        assert password not in out.read_text()  # only the file has it

        # The pages: answered once logged in with that password.
        with httpx.Client(base_url=base, timeout=30) as client:
            assert client.get("/healthz").status_code == 200
            for page in ("/tasks/", "/inbox/", "/admin/password_change/"):
                assert client.get(page).status_code == 302  # to a login page
            _log_in(client, username, password)
            for page in ("/tasks/", "/inbox/", "/admin/password_change/"):
                answer = client.get(page)
                assert answer.status_code == 200, (page, answer.text[:500])
            assert 'name="new_password1"' in client.get("/admin/password_change/").text

        # The Claude Code command: its URL and header reach the MCP endpoint as the demo
        # client, on either wire.
        command = shlex.split(labels["Claude Code"])
        assert command[:6] == ["claude", "mcp", "add", "--transport", "http", "taskdesk"]
        assert command[6] == f"{base}/mcp" and command[7] == "--header"
        header, _, value = command[8].partition(": ")
        assert (header, value) == ("Authorization", f"Bearer {token}")
        handshake = httpx.post(
            command[6],
            json=wire.initialize(),
            headers={header: value, "Accept": "application/json, text/event-stream"},
            timeout=30,
        )
        assert handshake.status_code == 200, handshake.text
        assert "serverInfo" in wire.json_of(handshake)["result"]
        listing = wire.request("tools/list")
        tools = httpx.post(
            command[6],
            content=json.dumps(listing),
            headers={
                **wire.headers_for(listing),
                "Content-Type": "application/json",
                header: value,
            },
            timeout=30,
        )
        assert tools.status_code == 200, tools.text
        assert {t["name"] for t in wire.result_of(tools)["tools"]} >= {"export_report"}
