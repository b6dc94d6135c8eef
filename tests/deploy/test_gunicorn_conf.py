"""The web server's settings (config/gunicorn.conf.py), with gunicorn itself: each web process
listens on a socket of its own, and a port something already listens on is refused."""

from __future__ import annotations

import json
import logging
import os
import queue
import runpy
import signal
import socket
import stat
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.live import BIN, ROOT, free_port, wait_for


def _gunicorn(port: int, tmp_path: Path, workers: int = 2) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "TASKDESK_PORT": str(port),
        "WEB_WORKERS": str(workers),
        "TASKDESK_VAR_DIR": str(tmp_path),
    }
    return subprocess.Popen(
        [str(BIN / "gunicorn"), "config.wsgi", "-c", "config/gunicorn.conf.py"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _listening_sockets(port: int) -> set[int]:
    """Inodes of the TCP sockets listening on PORT (from /proc/net/tcp: state 0A)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], int(fields[9])
        if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
            inodes.add(inode)
    return inodes


@pytest.fixture
def stopped() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(15)


def test_each_web_process_listens_on_a_socket_of_its_own(tmp_path, stopped) -> None:
    """SO_REUSEPORT: the kernel spreads new connections over the processes, instead of the
    first one awake taking every keep-alive connection of a burst."""
    port = free_port()
    stopped.append(_gunicorn(port, tmp_path, workers=2))

    wait_for("two listening sockets", lambda: len(_listening_sockets(port)) == 2, timeout=30)
    connections = [socket.create_connection(("127.0.0.1", port)) for _ in range(16)]
    try:
        for connection in connections:
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert connection.recv(64).startswith(b"HTTP/1.1 ")
    finally:
        for connection in connections:
            connection.close()


def test_the_log_says_where_it_listens_and_the_control_socket_is_the_instances_own(
    tmp_path, stopped
) -> None:
    """gunicorn's own "Listening at:" names no socket under reuse_port, and its control
    socket's default (~/.gunicorn/gunicorn.ctl) is shared by every server of the user: two
    servers, each with its own var folder, keep a control socket each."""
    first, second = tmp_path / "first", tmp_path / "second"
    ports = free_port(), free_port()
    servers = [
        _gunicorn(port, var, workers=1) for port, var in zip(ports, (first, second), strict=True)
    ]
    stopped.extend(servers)
    for var in (first, second):
        # gunicorn sets the socket's mode just after it listens, before its loop can answer:
        # once the socket answers, the mode is final
        workers = wait_for(
            f"{var.name}'s control socket", partial(_show_workers, var), timeout=30, every=0.1
        )
        assert workers["count"] == 1, workers  # this server's one web process
        assert stat.S_IMODE((var / "gunicorn.ctl").stat().st_mode) == 0o600  # its user only
    for server in servers:
        os.killpg(server.pid, signal.SIGTERM)
    logs = [server.communicate(timeout=30)[0].decode() for server in servers]

    for port, log in zip(ports, logs, strict=True):
        assert f"Listening at: http://127.0.0.1:{port} (a socket per web process)" in log, log
    assert not any((var / "gunicorn.ctl").exists() for var in (first, second))


def test_a_port_something_already_listens_on_is_refused(tmp_path, stopped) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        web = _gunicorn(port, tmp_path)
        stopped.append(web)

        output, _ = web.communicate(timeout=30)

    assert web.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in output.decode()


class _Booting:
    """What post_worker_init sees of a web process: gunicorn's worker, as far as it is used."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.alive = True
        self.quit_by: int | None = None
        self.log = logging.getLogger("tests.gunicorn")

    def handle_quit(self, number: int, frame: object) -> None:
        self.quit_by = number


@pytest.fixture(scope="module")
def hooks() -> dict[str, object]:
    return runpy.run_path(str(ROOT / "config" / "gunicorn.conf.py"))


@pytest.mark.parametrize(
    ("received", "alive", "quit_by"),
    [
        ([signal.SIGTERM], False, None),
        ([signal.SIGCHLD, signal.SIGINT], True, signal.SIGINT),
        ([signal.SIGQUIT], True, signal.SIGQUIT),
        ([signal.SIGHUP, signal.SIGCHLD, signal.SIGTTIN], True, None),
        ([], True, None),
    ],
)
def test_a_stop_received_before_the_web_process_had_its_handlers_is_acted_on(
    hooks, received, alive, quit_by
) -> None:
    """Between the fork and gunicorn's own handlers, a signal runs the master's handler, which
    only puts it on the process's copy of the master's queue. A SIGTERM there was lost and the
    process served on after the master had stopped (make run's Ctrl-C while web processes
    were still starting waited 10 s and killed it)."""
    master = SimpleNamespace(SIG_QUEUE=queue.SimpleQueue())
    worker = _Booting()
    hooks["post_fork"](master, worker)  # type: ignore[operator]
    for number in received:  # what the master's handler does in the forked process
        master.SIG_QUEUE.put_nowait(number)

    hooks["post_worker_init"](worker)  # type: ignore[operator]

    assert (worker.alive, worker.quit_by) == (alive, quit_by)


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str, *args: object) -> None:
        self.lines.append(message % args)

    warning = info


def test_the_start_hooks_wait_for_a_busy_port_then_refuse_it_and_name_the_free_one(
    hooks, monkeypatch
) -> None:
    """In this process, what the tests with gunicorn itself (above) check from outside: a busy
    port is tried five times, a second apart, then refused; a free one is named when ready."""
    conf = hooks["on_starting"].__globals__  # type: ignore[attr-defined]
    master = SimpleNamespace(log=_Log())
    waits: list[float] = []
    monkeypatch.setattr(conf["time"], "sleep", waits.append)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        monkeypatch.setitem(conf, "bind", [busy])
        with pytest.raises(SystemExit, match=f"cannot listen on {busy}: Address already in use"):
            hooks["on_starting"](master)  # type: ignore[operator]
    assert waits == [1, 1, 1, 1]
    assert master.log.lines == [f"{busy} is in use; trying again in 1 second"] * 4

    free = f"127.0.0.1:{free_port()}"
    monkeypatch.setitem(conf, "bind", [free])
    master.log.lines.clear()
    hooks["on_starting"](master)  # type: ignore[operator]
    hooks["when_ready"](master)  # type: ignore[operator]
    assert master.log.lines == [f"Listening at: http://{free} (a socket per web process)"]


def test_a_web_process_that_ended_leaves_the_live_gauges(hooks, tmp_path, monkeypatch) -> None:
    """child_exit: the files of its live gauges go (prometheus-client's mark_process_dead), so
    /metrics stops counting it; its counters' files stay."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    (tmp_path / "gauge_livesum_4242.db").write_bytes(b"")
    (tmp_path / "counter_4242.db").write_bytes(b"")
    hooks["child_exit"](SimpleNamespace(), SimpleNamespace(pid=4242))  # type: ignore[operator]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["counter_4242.db"]


def _show_workers(var: Path) -> dict[str, object] | None:
    """What the control socket in VAR says of the server's web processes, or None while it
    does not answer yet."""
    if not (var / "gunicorn.ctl").is_socket():
        return None
    shown = subprocess.run(
        [str(BIN / "gunicornc"), "-s", str(var / "gunicorn.ctl"), "-c", "show workers", "-j"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return json.loads(shown.stdout) if shown.returncode == 0 else None
