"""`make run`'s supervisor (scripts/run_procfile.py) with small shell Procfiles: how it reads
the Procfile, relays output, stops its processes, and reports one that ended by itself. The
live stack under it is in tests/integration/test_make_run.py."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.live import ROOT, free_port, wait_for

SCRIPT = ROOT / "scripts" / "run_procfile.py"


def _procfile(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "Procfile"
    path.write_text(text)
    return path


@contextlib.contextmanager
def _supervisor(
    procfile: Path, *args: str, port: int = 8123, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """The supervisor on PROCFILE (in a session of its own, its output in a file), and
    whatever is left of it killed when the block ends."""
    out = procfile.parent / "out.log"
    with open(out, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), "-f", str(procfile), "--port", str(port), *args],
            cwd=procfile.parent,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc, out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _module():  # type: ignore[no-untyped-def]
    """scripts/run_procfile.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_procfile", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_procfile"] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["run_procfile"]
    return module


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is not running.
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def _pids(text: str, name: str) -> int:
    found = re.search(rf"{name}\.1 +\| pid (\d+)", text)
    assert found is not None, text
    return int(found.group(1))


def test_it_reads_names_and_commands_and_refuses_what_is_not_a_procfile(tmp_path) -> None:  # type: ignore[no-untyped-def]
    module = _module()

    good = _procfile(tmp_path, "# the stack\n\nweb: exec gunicorn app\nworker:exec celery a: b\n")
    assert module.read_procfile(good) == [
        ("web", "exec gunicorn app"),
        ("worker", "exec celery a: b"),
    ]

    for text, error in [
        ("web exec gunicorn\n", "not a 'name: command' line"),
        ("web: a\nweb: b\n", "'web' is defined twice"),
        ("# nothing\n", "no process to run"),
    ]:
        with pytest.raises(module.ProcfileError, match=error):
            module.read_procfile(_procfile(tmp_path, text))

    done = subprocess.run(
        [sys.executable, str(SCRIPT), "-f", str(_procfile(tmp_path, "web exec x\n"))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "not a 'name: command' line" in done.stderr


def _read_when(out: Path, *needles: str) -> str | None:
    text = out.read_text()
    return text if all(needle in text for needle in needles) else None


def test_output_is_relayed_by_name_and_sigterm_reaches_each_leader_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # "one" starts a child in its own process group, as a Celery worker starts its pool
    # processes: the supervisor's SIGTERM must reach the leader only (which then stops its
    # child itself), never the child directly.
    procfile = _procfile(
        tmp_path,
        "one: sh -c 'trap \"echo child got TERM; exit 0\" TERM; while :; do sleep 0.1; done' "
        '& child=$!; echo "pid $$"; echo "child $child"; echo "port $PORT"; '
        "trap 'echo leader got TERM; kill -9 $child; printf last-words; exit 0' TERM; "
        "while :; do sleep 0.1; done\n"
        "two: echo \"pid $$\"; trap 'echo two got TERM; exit 0' TERM; "
        "while :; do sleep 0.1; done\n",
    )
    with _supervisor(procfile) as (proc, out):
        text = wait_for(
            "both processes to start",
            lambda: _read_when(out, "two.1  | pid", "one.1  | child"),
            timeout=10,
            every=0.05,
        )
        found = re.search(r"one\.1 +\| child (\d+)", text)
        assert found is not None
        child = int(found.group(1))
        assert "one.1  | port 8123" in text
        assert re.search(r"^\d\d:\d\d:\d\d system \| one\.1 started \(pid=\d+\)$", text, re.M)

        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(10)
        text = out.read_text()
    assert proc.returncode == 0
    assert "system | SIGTERM received: sending SIGTERM to one.1, two.1" in text
    assert "one.1  | leader got TERM" in text
    assert "child got TERM" not in text
    assert "two.1  | two got TERM" in text
    assert "one.1  | last-words" in text  # a last line without its newline is not lost
    assert "one.1 stopped (rc=0)" in text and "two.1 stopped (rc=0)" in text
    assert not _alive(child)


def test_a_process_that_ends_by_itself_stops_the_others_and_the_exit_status_says_so(
    tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    procfile = _procfile(
        tmp_path,
        "steady: trap 'exit 0' TERM; while :; do sleep 0.1; done\n"
        "short: sleep 0.5; echo going; exit 3\n",
    )
    with _supervisor(procfile) as (proc, out):
        proc.wait(10)
    text = out.read_text()
    assert proc.returncode == 1
    assert "short.1  | going" in text
    assert "system   | short.1 stopped (rc=3)" in text
    assert "short.1 ended: sending SIGTERM to steady.1" in text
    assert "steady.1 stopped (rc=0)" in text


def test_a_process_that_ignores_sigterm_is_killed_after_the_stop_time(tmp_path) -> None:  # type: ignore[no-untyped-def]
    procfile = _procfile(
        tmp_path, 'stubborn: trap "" TERM; echo "pid $$"; while :; do sleep 0.1; done\n'
    )
    with _supervisor(procfile, "--stop-seconds", "0.5") as (proc, out):
        wait_for("it to start", lambda: "| pid" in out.read_text(), timeout=10, every=0.05)
        started = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(10)
        took = time.monotonic() - started
    text = out.read_text()
    assert proc.returncode == 0  # a requested stop
    assert "still running after 0.5 s: sending SIGKILL" in text
    assert "stubborn.1 stopped (rc=-9)" in text
    assert took < 5
    assert not _alive(_pids(text, "stubborn"))


def test_a_killed_supervisor_takes_its_processes_with_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    procfile = _procfile(tmp_path, 'lone: echo "pid $$"; exec sleep 60\n')
    with _supervisor(procfile) as (proc, out):
        wait_for("it to start", lambda: "| pid" in out.read_text(), timeout=10, every=0.05)
        pid = _pids(out.read_text(), "lone")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(5)
        wait_for("the process to get SIGTERM", lambda: not _alive(pid), timeout=5, every=0.05)


def test_a_second_ctrl_c_kills_at_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    procfile = _procfile(
        tmp_path, 'stubborn: trap "" TERM; echo "pid $$"; while :; do sleep 0.1; done\n'
    )
    with _supervisor(procfile) as (proc, out):  # the default stop time, 10 s
        wait_for("it to start", lambda: "| pid" in out.read_text(), timeout=10, every=0.05)
        started = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        wait_for("the SIGTERM", lambda: "sending SIGTERM" in out.read_text(), timeout=5, every=0.05)
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(10)
        took = time.monotonic() - started
    text = out.read_text()
    assert "a second interrupt: sending SIGKILL" in text
    assert "stubborn.1 stopped (rc=-9)" in text
    assert took < 5  # not the 10 s the processes get after the first one
    assert not _alive(_pids(text, "stubborn"))


def test_sighup_stops_the_processes_like_sigterm(tmp_path) -> None:  # type: ignore[no-untyped-def]
    procfile = _procfile(
        tmp_path,
        "calm: echo \"pid $$\"; trap 'echo got TERM; exit 0' TERM; while :; do sleep 0.1; done\n",
    )
    with _supervisor(procfile) as (proc, out):
        wait_for("it to start", lambda: "| pid" in out.read_text(), timeout=10, every=0.05)
        os.kill(proc.pid, signal.SIGHUP)  # the terminal went away
        proc.wait(10)
    text = out.read_text()
    assert proc.returncode == 0
    assert "SIGHUP received: sending SIGTERM to calm.1" in text
    assert "calm.1 | got TERM" in text
    assert "calm.1 stopped (rc=0)" in text


# --- --preload: the Python programs as forks of a loaded supervisor ----------------------------

VENV_PATH = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def test_a_line_is_expanded_by_the_shell_and_only_console_scripts_of_this_environment_fork() -> (
    None
):
    module = _module()
    env = {**VENV_PATH, "LOG_FORMAT": "json"}
    env.pop("LOG_LEVEL", None)

    line = (
        'exec celery -A config $([ "$LOG_FORMAT" = json ] && echo --quiet) worker '
        '--loglevel ${LOG_LEVEL:-INFO} -n "a b@%h"'
    )
    assert module.program_argv(line, env) == [
        "celery", "-A", "config", "--quiet", "worker", "--loglevel", "INFO", "-n", "a b@%h"
    ]  # fmt: skip
    assert module.program_argv("echo hi; exec sleep 1", env) is None  # not `exec PROGRAM`
    assert module.program_argv("exec sleep $(", env) is None  # the shell refuses it

    assert callable(module.entry_point("gunicorn", env))
    assert module.entry_point("sleep", env) is None  # not a Python program
    assert module.entry_point("gunicorn", {"PATH": "/usr/bin:/bin"}) is None  # another one's


def _smaps(pid: int) -> dict[str, int]:
    """/proc/PID/smaps_rollup in KiB."""
    lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
    return {key: int(value.split()[0]) for key, value in (line.split(":", 1) for line in lines)}


def test_with_preload_a_python_program_is_a_fork_that_shares_what_the_supervisor_loaded(
    tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    # 48 MiB written by the supervisor before it forks: a fresh interpreter has none of it.
    (tmp_path / "loaded.py").write_text("BLOB = b'\\x01' * (48 << 20)\n")
    (tmp_path / "hello.py").write_text(
        "import loaded\n\n"
        "def app(environ, start_response):\n"
        "    start_response('200 OK', [('Content-Type', 'text/plain')])\n"
        "    return [b'hello %d' % len(loaded.BLOB)]\n"
    )
    procfile = _procfile(
        tmp_path,
        "web: exec gunicorn --bind 127.0.0.1:$PORT --workers 1 hello:app\n"
        'shell: echo "pid $$"; exec sleep 60\n',
    )
    with _supervisor(procfile, "--preload", "loaded", port=port, env=VENV_PATH) as (proc, out):
        text = wait_for(
            "gunicorn to answer",
            lambda: _read_when(out, "Booting worker", "shell.1 | pid"),
            timeout=30,
            every=0.05,
            explain=lambda: out.read_text(),
        )
        found = re.search(r"web\.1 started \(pid=(\d+)\) from the preloaded supervisor", text)
        assert found is not None, text
        web = int(found.group(1))
        assert re.search(r"shell\.1 started \(pid=\d+\)$", text, re.M)  # under the shell
        shell = _pids(text, "shell")

        answer = wait_for(
            "an answer",
            lambda: httpx.get(f"http://127.0.0.1:{port}/", timeout=5),
            timeout=10,
        )
        assert answer.text == f"hello {48 << 20}"
        # The fork's gunicorn master and its worker still share the supervisor's pages.
        assert _smaps(web)["Shared_Dirty"] > 40 * 1024
        assert _smaps(shell)["Shared_Dirty"] < 8 * 1024
        assert Path(f"/proc/{web}/cmdline").read_bytes().startswith(b"gunicorn: master")
        assert Path(f"/proc/{web}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(proc.pid)

        os.kill(proc.pid, signal.SIGINT)
        proc.wait(15)
        text = out.read_text()
    assert proc.returncode == 0
    assert "web.1 stopped (rc=0)" in text  # gunicorn's own graceful stop
    assert "Shutting down: Master" in text


def test_a_preload_that_fails_is_said_and_every_line_runs_under_the_shell(tmp_path) -> None:  # type: ignore[no-untyped-def]
    procfile = _procfile(tmp_path, "web: exec gunicorn --version\n")
    with _supervisor(procfile, "--preload", "no_such_module", env=VENV_PATH) as (proc, out):
        proc.wait(30)
    text = out.read_text()
    assert (
        "run_procfile: --preload no_such_module failed (ModuleNotFoundError: No module named "
        "'no_such_module'); each process loads on its own"
    ) in text
    assert re.search(r"web\.1 started \(pid=\d+\)$", text, re.M)
    assert re.search(r"web\.1 +\| gunicorn \(version", text)
    assert proc.returncode == 1  # a process ended by itself


def test_ctrl_c_while_the_supervisor_loads_starts_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "slow.py").write_text("import time\nprint('loading', flush=True)\ntime.sleep(30)\n")
    procfile = _procfile(tmp_path, "web: exec gunicorn --version\n")
    with _supervisor(procfile, "--preload", "slow", env=VENV_PATH) as (proc, out):
        wait_for("the load to begin", lambda: "loading" in out.read_text(), timeout=10)
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(10)
    text = out.read_text()
    assert proc.returncode == 130
    assert "run_procfile: interrupted while loading; nothing was started" in text
    assert "started" not in text.replace("nothing was started", "")


def test_a_forked_program_that_exits_with_a_message_has_it_relayed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # As the web's own configuration ends gunicorn on a busy port (config/gunicorn.conf.py).
    (tmp_path / "loaded.py").write_text("")
    (tmp_path / "conf.py").write_text(
        "def on_starting(server):\n"
        "    raise SystemExit('web: cannot listen on 127.0.0.1:1: Address already in use')\n"
    )
    procfile = _procfile(tmp_path, "web: exec gunicorn -c conf.py loaded:app\n")
    with _supervisor(procfile, "--preload", "loaded", env=VENV_PATH) as (proc, out):
        proc.wait(30)
    text = out.read_text()
    assert "web.1 started" in text and "from the preloaded supervisor" in text
    assert "web.1  | web: cannot listen on 127.0.0.1:1: Address already in use" in text
    assert "web.1 stopped (rc=1)" in text
    assert proc.returncode == 1
