"""Starting the project's Python processes for tests without paying for their imports each time.

A test run starts a few hundred Python processes of this virtualenv: the gunicorn and Celery
processes of every live stack, ``manage.py`` commands, ``python -c`` programs that load the
settings. Each fresh interpreter spends about half a second of CPU importing Django, Celery,
gunicorn, psycopg, pydantic and the rest before it reads a setting, on a machine of two
cores. The fork server imports those once, in a process of its own per test process, and
forks a child for each program instead, which then sets up Django from its own environment as
a fresh interpreter would (nothing that reads a setting or the environment at import is
preloaded: not the project, not prometheus-client, which picks its multiprocess mode then).

A live stack's own programs (gunicorn, the Celery workers, beat) go one step further with
``spawn(..., warm=True)``, as `make run` does: the server forks, for each environment, a
process that applies it and imports ``config.preload`` (Django set up, the project's tasks,
URLs and programs loaded, nothing connected), and that process forks the programs of that
environment. A stack's three programs then set Django up once between them, not three times
(about a second of CPU per stack on two cores); such a process ends after
``WARM_IDLE_SECONDS`` without a request. An environment whose preload fails (a test's broken
setting) starts its programs cold, as before, so they fail as they would from a shell.

``spawn`` returns a ``Forked`` handle with the part of ``subprocess.Popen`` the tests use
(``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``returncode``); ``run`` is
``subprocess.run(..., capture_output=True)``. The child is the server's: the server reaps it
and keeps its exit status for the handle to ask. A program it cannot run the same way (another
interpreter, options to the interpreter) starts with ``subprocess`` as before, and so does
everything with ``TASKDESK_TEST_FORKSERVER=0``.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
# How long a warm process (above) waits for another program of its environment: a stack's
# programs start within a second of each other, and a test that restarts one of them later
# has it started cold by a new one.
WARM_IDLE_SECONDS = 30.0
# What a warm process imports once its environment is applied: what `make run` loads before
# it forks the stack's programs.
WARM_PRELOAD = "config.preload"

# Imported by the server before it forks: only modules that read neither Django's settings nor
# the environment when they are imported (not gunicorn: its settings' defaults are read from
# the environment then, FORWARDED_ALLOW_IPS among them).
PRELOAD = (
    "django.db.models",
    "django.forms",
    "django.http",
    "django.template.defaulttags",
    "django.urls",
    "django.views.generic",
    "celery.apps.worker",
    "celery.bin.celery",
    "celery.worker",
    "celery.concurrency.asynpool",
    "celery.concurrency.solo",
    "kombu.transport.redis",
    "psycopg",
    "pydantic",
    "jsonschema",
    "jsonschema_rs",
    "jwt",
    "authlib.oauth2.rfc6749",
    "urllib3",
    "httpx",
    "yaml",
)


def enabled() -> bool:
    return os.environ.get("TASKDESK_TEST_FORKSERVER", "1") != "0"


def runnable(args: Sequence[str]) -> bool:
    """Whether ARGS is a program the server runs as a fresh interpreter would: this
    virtualenv's python with ``-c``, ``-m`` or a script, or one of its console scripts."""
    if not args:
        return False
    program = str(args[0])
    if program == sys.executable:
        return len(args) > 1 and (args[1] in ("-c", "-m") or not str(args[1]).startswith("-"))
    path = Path(program)
    if path.parent != BIN or not path.is_file():
        return False
    with path.open("rb") as script:
        first = script.readline().strip()
    return first in (f"#!{sys.executable}".encode(), f"#!{BIN / 'python3'}".encode())


# --- the client side (in the test process) -------------------------------------------------


class _Server:
    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="taskdesk-forkserver-"))
        self.path = str(self.folder / "socket")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver", self.path],
            cwd=Path(__file__).resolve().parent.parent,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while not os.path.exists(self.path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the test fork server did not start")
            time.sleep(0.01)
        self.lock = threading.Lock()
        atexit.register(self.close)

    def ask(self, request: dict[str, Any], fds: Sequence[int] = ()) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.connect(self.path)
            socket.send_fds(sock, [json.dumps(request).encode()], list(fds))
            answer = sock.recv(1 << 16)
        reply: dict[str, Any] = json.loads(answer)
        if "error" in reply:
            raise OSError(reply["error"])
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            self.folder.rmdir()


_server: _Server | None = None
_server_lock = threading.Lock()


def _the_server() -> _Server:
    global _server
    with _server_lock:
        if _server is None or _server.proc.poll() is not None:
            _server = _Server()
        return _server


class Forked(subprocess.Popen[bytes]):
    """A process the fork server started: ``subprocess.Popen``'s handle, asked of the server
    (which is its parent) rather than of this process."""

    def __init__(self, pid: int, args: Sequence[str]) -> None:  # no Popen.__init__: no spawn
        self.pid = pid
        self.args = list(args)
        self.returncode: Any = None
        self.stdin = self.stdout = self.stderr = None
        self._pidfd = os.pidfd_open(pid)

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._pidfd], [], [], 0)[0]:
            self._collect()
        return self.returncode  # type: ignore[no-any-return]

    def _collect(self) -> None:
        for _attempt in range(500):  # the server reaps it within its next look (20 ms)
            code = _the_server().ask({"op": "status", "pid": self.pid})["code"]
            if code is not None:
                self.returncode = code
                os.close(self._pidfd)
                return
            time.sleep(0.005)
        raise RuntimeError(f"the fork server has no exit status for {self.pid}")

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._collect()
        return self.returncode  # type: ignore[no-any-return]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def __del__(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        self.wait()


def spawn(
    args: Sequence[str],
    *,
    cwd: str | Path,
    env: Mapping[str, str],
    stdout: int,
    stderr: int,
    start_new_session: bool = False,
    warm: bool = False,
) -> subprocess.Popen[bytes]:
    """ARGS started with its output on the file descriptors STDOUT and STDERR (stdin empty);
    WARM: forked from a process that has set Django up in ENV (the module's docstring)."""
    if not (enabled() and runnable(args)):
        return subprocess.Popen(
            list(args), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=stdout,
            stderr=stderr, start_new_session=start_new_session,
        )  # fmt: skip
    request = {
        "op": "spawn",
        "args": [str(a) for a in args],
        "cwd": str(cwd),
        "env": dict(env),
        "session": start_new_session,
        "warm": warm,
    }
    with open(os.devnull, "rb") as devnull:
        reply = _the_server().ask(request, [devnull.fileno(), stdout, stderr])
    return Forked(reply["pid"], args)


def run(
    args: Sequence[str], *, cwd: str | Path, env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(ARGS, capture_output=True, text=True, timeout=TIMEOUT)``."""
    if not (enabled() and runnable(args)):
        return subprocess.run(
            list(args), cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=timeout,
            check=False,
        )  # fmt: skip
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        proc = spawn(args, cwd=cwd, env=env, stdout=out_w, stderr=err_w, start_new_session=True)
    finally:
        os.close(out_w)
        os.close(err_w)
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    deadline = time.monotonic() + timeout
    open_fds = [out_r, err_r]
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            for fd in (out_r, err_r):
                os.close(fd)
            raise subprocess.TimeoutExpired(list(args), timeout)
        for fd in select.select(open_fds, [], [], left)[0]:
            data = os.read(fd, 65536)
            if data:
                chunks[fd].append(data)
            else:
                open_fds.remove(fd)
                os.close(fd)
    code = proc.wait(max(1.0, deadline - time.monotonic()))
    decode = lambda fd: b"".join(chunks[fd]).decode(errors="replace")  # noqa: E731
    return subprocess.CompletedProcess(list(args), code, decode(out_r), decode(err_r))


# --- the server side ----------------------------------------------------------------------


def _serve(path: str) -> None:
    import ctypes
    import importlib

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # ends with the test process
    # The programs a warm process forks become this server's children when it lets them go
    # (_Warm), so that it reaps them and keeps their exit status as it does its own.
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)
    for name in PRELOAD:
        importlib.import_module(name)
    assert threading.active_count() == 1, "a preloaded module started a thread"
    statuses: dict[int, int] = {}
    warm: dict[str, _Warm] = {}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.bind(path + ".new")
    sock.listen(64)
    os.rename(path + ".new", path)  # the client waits for the name: it is listening now
    while True:
        ready = select.select([sock], [], [], 0.02)[0]
        _reap(statuses)
        for key, process in list(warm.items()):
            if process.idle():
                process.close()
                del warm[key]
        if not ready:
            continue
        conn, _ = sock.accept()
        with conn:
            message, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
            request = json.loads(message)
            try:
                if request["op"] == "status":
                    _reap(statuses)
                    reply: dict[str, Any] = {"code": statuses.pop(request["pid"], None)}
                else:
                    pid = _warm_spawn(warm, request, fds) if request.get("warm") else None
                    if pid is None:
                        pid = os.fork()
                        if pid == 0:
                            sock.close()
                            conn.close()
                            _become(request, fds)  # does not return
                    statuses.pop(pid, None)  # a status an earlier process of that id left
                    reply = {"pid": pid}
            except Exception as error:  # told to the client, which raises it
                reply = {"error": f"{type(error).__name__}: {error}"}
            finally:
                for fd in fds:
                    os.close(fd)
            conn.send(json.dumps(reply).encode())


class _Warm:
    """A process that has applied one environment and imported ``WARM_PRELOAD``, and forks
    that environment's programs on request (``_warm_serve``), over a socket pair."""

    def __init__(self, request: dict[str, Any]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = os.fork()
        if self.pid == 0:
            # Nothing of the server's: not its socket, not the request being answered, and not
            # the other warm processes' sockets, which would keep them from reading their end.
            _close_all_but({0, 1, 2, theirs.fileno()})
            _warm_serve(request, theirs)  # does not return
        theirs.close()
        self.sock = ours
        self.used = time.monotonic()

    def spawn(self, request: dict[str, Any], fds: list[int]) -> int | None:
        """The pid of REQUEST's program, or None when this process cannot start it (its
        preload failed, or it ended)."""
        self.used = time.monotonic()
        try:
            socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
            answer = self.sock.recv(1 << 16)
        except OSError:
            return None
        if not answer:
            return None
        reply: dict[str, Any] = json.loads(answer)
        pid = reply.get("pid")
        return pid if isinstance(pid, int) else None

    def idle(self) -> bool:
        return time.monotonic() - self.used > WARM_IDLE_SECONDS

    def close(self) -> None:
        self.sock.close()  # the process reads the end of its socket and exits


def _close_all_but(kept: set[int]) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in kept:
            with contextlib.suppress(OSError):
                os.close(fd)


def _warm_key(request: dict[str, Any]) -> str:
    return json.dumps([request["cwd"], sorted(request["env"].items())])


def _warm_spawn(warm: dict[str, _Warm], request: dict[str, Any], fds: list[int]) -> int | None:
    """Start REQUEST's program from the warm process of its environment (made first when
    there is none): its pid, or None to start it cold."""
    key = _warm_key(request)
    process = warm.get(key)
    if process is None:
        process = warm[key] = _Warm(request)
    pid = process.spawn(request, fds)
    if pid is None:  # its preload failed: this environment's programs start cold
        process.close()
        del warm[key]
    return pid


def _warm_serve(request: dict[str, Any], sock: socket.socket) -> None:
    """In a warm process: apply REQUEST's environment, import ``WARM_PRELOAD``, then fork a
    program for each request until the server closes the socket. Each program is forked by
    a short-lived child of this process, which exits at once: the program's parent is then
    the server (a subreaper), which reaps it."""
    import ctypes
    import importlib

    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        time.tzset()
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            importlib.import_module(WARM_PRELOAD)
        if threading.active_count() != 1:
            raise RuntimeError(f"{WARM_PRELOAD} started a thread")
    except BaseException:  # the server then starts this environment's programs cold
        os._exit(1)
    while True:
        try:
            message, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 3)
        except OSError:
            break
        if not message:
            break
        asked = json.loads(message)
        read_pid, write_pid = os.pipe()
        middle = os.fork()
        if middle == 0:
            sock.close()
            os.close(read_pid)
            program = os.fork()
            if program == 0:
                os.close(write_pid)
                _become(asked, fds)  # does not return
            os.write(write_pid, str(program).encode())
            os._exit(0)
        os.close(write_pid)
        for fd in fds:
            os.close(fd)
        with os.fdopen(read_pid, "rb") as answer:
            pid = int(answer.read() or 0)
        os.waitpid(middle, 0)
        sock.send(json.dumps({"pid": pid} if pid else {}).encode())
    os._exit(0)


def _reap(statuses: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        statuses[pid] = os.waitstatus_to_exitcode(status)


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become REQUEST's program, as a fresh interpreter would run it."""
    code: Any = 0
    try:
        if request["session"]:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        time.tzset()
        tempfile.tempdir = None
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", False)))
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(1, "w", False)), write_through=unbuffered
        )
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(2, "w", False)),
            errors="backslashreplace",
            line_buffering=True,
            write_through=unbuffered,
        )
        _run_program(request["args"])
    except SystemExit as exit_:
        code = exit_.code
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # as the interpreter's own exit
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(code)


def _run_program(args: list[str]) -> None:
    import runpy
    import types

    if args[0] == sys.executable and args[1] == "-c":
        sys.argv = ["-c", *args[3:]]
        sys.path[0] = ""
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(args[2], "<string>", "exec"), main.__dict__)
    elif args[0] == sys.executable and args[1] == "-m":
        sys.argv = [args[2], *args[3:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(args[2], run_name="__main__", alter_sys=True)
    else:
        script = args[1] if args[0] == sys.executable else args[0]
        rest = args[2:] if args[0] == sys.executable else args[1:]
        sys.argv = [script, *rest]
        sys.path[0] = str(Path(script).resolve().parent)
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    _serve(sys.argv[1])
