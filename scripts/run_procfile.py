"""`make run`'s supervisor: start every line of the Procfile, relay their output with the
name of each, and stop them all together.

    python scripts/run_procfile.py [-f Procfile] [--port 8000] [--stop-seconds 10]

- Each line runs under ``/bin/sh -c`` (Procfile lines use shell syntax and end in ``exec``)
  in a session of its own, with ``PORT`` set to the chosen port.
- Output: every line a process writes, as ``HH:MM:SS name.1  | text``; the supervisor's own
  lines (started, stopping, stopped) come as ``system``.
- Stop: on SIGINT (Ctrl-C), SIGTERM or SIGHUP, or as soon as any process ends by itself,
  each process still running gets one SIGTERM, and only its leader does: gunicorn's master
  and each Celery worker's main process then stop their own children in order (a Celery
  worker finishes the jobs its pool processes are running, its warm shutdown). Whatever is
  left of a process group after ``--stop-seconds`` is killed with SIGKILL; a second Ctrl-C
  kills at once. A process also gets SIGTERM if the supervisor itself is killed (Linux).
- Exit status: 0 after a requested stop, 1 when a process ended by itself (its ``stopped``
  line names it with its exit code, negative for a signal).
- ``--preload MODULE`` (`make run` gives ``config.preload``): the supervisor imports MODULE,
  then starts each line of the form ``exec PROGRAM ARGS`` whose PROGRAM is a console script
  of its own Python environment (gunicorn, celery) as a fork of itself that calls the
  program's entry point, rather than a new interpreter: what MODULE loaded is shared by all
  of them. The arguments are the shell's expansion of the line; the process gets its own
  session, its command line as its title, and the same environment. Other lines, and all of
  them when MODULE fails to import, run under the shell as above.

It is written here rather than taken from a Procfile runner because the runners at hand
(honcho) send SIGTERM to each process's whole group: the Celery pool processes then die in
the middle of the legs they are running (``WorkerLostError`` on every Ctrl-C) instead of
being stopped by their worker; and none of them starts its processes from a loaded parent.
Without ``--preload`` it uses only the standard library.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import importlib.metadata
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

_LINE = re.compile(r"^([A-Za-z0-9_-]+):\s*(\S.*)$")
_PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class ProcfileError(Exception):
    pass


def read_procfile(path: Path) -> list[tuple[str, str]]:
    """The (name, command) of every line of the Procfile at PATH, in order. Blank lines and
    ``#`` comments are skipped; anything else that is not ``name: command`` is an error."""
    entries: list[tuple[str, str]] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        found = _LINE.match(text)
        if found is None:
            raise ProcfileError(f"{path}:{number}: not a 'name: command' line: {line!r}")
        name, command = found.groups()
        if any(name == seen for seen, _ in entries):
            raise ProcfileError(f"{path}:{number}: {name!r} is defined twice")
        entries.append((name, command))
    if not entries:
        raise ProcfileError(f"{path}: no process to run")
    return entries


class Forked:
    """A process forked from the supervisor to run a program's entry point: what the
    supervisor uses of ``subprocess.Popen`` (pid, stdout, poll, returncode)."""

    def __init__(self, pid: int, stdout: IO[bytes]) -> None:
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)  # -N for signal N
        return self.returncode


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes] | Forked
    partial: bytes = b""

    @property
    def running(self) -> bool:
        """Not seen to end yet (``Supervisor._reap`` polls it)."""
        return self.proc.returncode is None


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the supervisor dies (Linux only), so that a
    killed supervisor does not leave the stack running on its own."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def program_argv(command: str, env: dict[str, str]) -> list[str] | None:
    """The argument list of a Procfile COMMAND of the form ``exec PROGRAM ARGS``, as the
    shell expands it in ENV (variables, ``$(...)``, quotes); None for any other command,
    or one the shell cannot expand."""
    if not command.startswith("exec "):
        return None
    script = f"set -- {command[len('exec ') :]}\nprintf '%s\\0' \"$@\""
    done = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, check=False)
    if done.returncode != 0 or not done.stdout:
        return None
    return [arg.decode() for arg in done.stdout.split(b"\0")[:-1]]


def entry_point(program: str, env: dict[str, str]) -> Callable[[], object] | None:
    """The function a console script of this Python environment runs (gunicorn's, celery's),
    when PROGRAM, found on ENV's PATH, is one; None otherwise."""
    found = shutil.which(program, path=env.get("PATH"))
    # The environment's bin folder (the interpreter there is often a link to another).
    here = Path(os.path.abspath(sys.executable)).parent
    if found is None or Path(os.path.abspath(found)).parent != here:
        return None
    for script in importlib.metadata.entry_points(group="console_scripts", name=Path(found).name):
        return script.load()  # type: ignore[no-any-return]
    return None


class Supervisor:
    def __init__(
        self,
        entries: list[tuple[str, str]],
        *,
        port: int,
        stop_seconds: float,
        preloaded: bool = False,
    ) -> None:
        self.entries = entries
        self.port = port
        self.stop_seconds = stop_seconds
        self.preloaded = preloaded
        self.out = sys.stdout.buffer
        self.width = max(len("system"), *(len(f"{name}.1") for name, _ in entries))
        self.children: list[Child] = []
        self.selector = selectors.DefaultSelector()
        self.signals: list[int] = []
        self.stopping_since: float | None = None
        self.killed = False
        self.ended_by_itself: Child | None = None

    # --- output ---------------------------------------------------------------------------

    def say(self, name: str, text: bytes) -> None:
        stamp = time.strftime("%H:%M:%S").encode()
        self.out.write(b"%s %s | %s\n" % (stamp, name.ljust(self.width).encode(), text))
        self.out.flush()

    def system(self, text: str) -> None:
        self.say("system", text.encode())

    def _relay(self, child: Child, data: bytes) -> None:
        lines = (child.partial + data).split(b"\n")
        child.partial = lines.pop()
        for line in lines:
            self.say(f"{child.name}.1", line.rstrip(b"\r"))

    def _read(self, child: Child) -> None:
        assert child.proc.stdout is not None
        try:
            data = os.read(child.proc.stdout.fileno(), 65536)
        except OSError:
            data = b""
        if data:
            self._relay(child, data)
            return
        self.selector.unregister(child.proc.stdout)
        child.proc.stdout.close()
        if child.partial:
            self.say(f"{child.name}.1", child.partial)
            child.partial = b""

    # --- processes ------------------------------------------------------------------------

    def start(self) -> None:
        env = child_environment(self.port)
        for name, command in self.entries:
            argv = program_argv(command, env) if self.preloaded else None
            entry = entry_point(argv[0], env) if argv else None
            proc: subprocess.Popen[bytes] | Forked
            if argv and entry is not None:
                proc = self._fork(argv, entry)
            else:
                proc = subprocess.Popen(
                    ["/bin/sh", "-c", command],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                )
            child = Child(name, proc)
            self.children.append(child)
            assert proc.stdout is not None
            self.selector.register(proc.stdout, selectors.EVENT_READ, child)
            how = " from the preloaded supervisor" if isinstance(proc, Forked) else ""
            self.system(f"{name}.1 started (pid={proc.pid}){how}")

    def _fork(self, argv: list[str], entry: Callable[[], object]) -> Forked:
        """Start ARGV as a fork of this process that calls ENTRY (the program's console
        script function) with ARGV as its command line, its output on a pipe to us."""
        read_end, write_end = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        # A stop signal that reaches the child before it has dropped the supervisor's handlers
        # would only be noted in its copy of them, and lost: the child takes it once it has.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        pid = os.fork()
        if pid == 0:  # the child: never returns
            self._become(argv, entry, write_end)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        os.close(write_end)
        return Forked(pid, os.fdopen(read_end, "rb", buffering=0))

    def _become(self, argv: list[str], entry: Callable[[], object], out: int) -> None:
        status = 1
        try:
            os.setsid()
            if sys.platform == "linux":
                _die_with_parent()
            for signum in STOP_SIGNALS:
                signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            # What the supervisor holds open is not the program's: the other processes'
            # pipes and the selector. Only the descriptors go; the objects are never used.
            for child in self.children:
                assert child.proc.stdout is not None
                os.close(child.proc.stdout.fileno())
            os.close(self.selector.fileno())
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.close(null)
            os.close(out)
            sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
            sys.argv = list(argv)
            _set_title(" ".join(argv))
            status = _exit_status(entry())  # as its console script's sys.exit(main())
        except SystemExit as stop:
            status = _exit_status(stop.code)
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            # Never back into the supervisor's code, nor its exit handlers.
            os._exit(status)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signals.append(signum)

    def _reap(self) -> None:
        for child in self.children:
            if child.running and (code := child.proc.poll()) is not None:
                self.system(f"{child.name}.1 stopped (rc={code})")
                if self.stopping_since is None:
                    self.ended_by_itself = child
                    self._stop(f"{child.name}.1 ended")

    def _stop(self, why: str) -> None:
        self.stopping_since = time.monotonic()
        running = [child for child in self.children if child.running]
        if running:
            names = ", ".join(f"{child.name}.1" for child in running)
            self.system(f"{why}: sending SIGTERM to {names}")
        for child in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.proc.pid, signal.SIGTERM)

    def _kill_groups(self, why: str | None = None) -> None:
        """SIGKILL every process group: what is left once the leaders are gone, or all of it
        when the stop takes too long."""
        if why is not None and any(child.running for child in self.children):
            self.system(f"{why}: sending SIGKILL")
        self.killed = True
        for child in self.children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.proc.pid, signal.SIGKILL)

    def run(self) -> int:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_signal)
        self.start()
        while True:
            for key, _ in self.selector.select(timeout=0.1):
                self._read(key.data)
            if self.signals:
                received = self.signals.pop(0)
                if self.stopping_since is None:
                    self._stop(f"{signal.Signals(received).name} received")
                elif received == signal.SIGINT and not self.killed:
                    self._kill_groups("a second interrupt")
            self._reap()
            if self.stopping_since is None:
                continue
            if not any(child.running for child in self.children):
                break
            if not self.killed and time.monotonic() - self.stopping_since > self.stop_seconds:
                self._kill_groups(f"still running after {self.stop_seconds:g} s")
        self._kill_groups()  # pool processes or anything else a leader left behind
        deadline = time.monotonic() + 1.0
        while self.selector.get_map() and time.monotonic() < deadline:
            for key, _ in self.selector.select(timeout=0.1):
                self._read(key.data)
        return 1 if self.ended_by_itself is not None else 0


def _exit_status(code: object) -> int:
    """The status ``sys.exit(CODE)`` ends an interpreter with, saying CODE on stderr when it is
    a message (gunicorn's "cannot listen on ...", a setting's one-line error)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr, flush=True)
    return 1


def child_environment(port: int) -> dict[str, str]:
    return {**os.environ, "PORT": str(port), "PYTHONUNBUFFERED": "1"}


def _set_title(title: str) -> None:
    """The forked process's command line as ``ps`` shows it (setproctitle), rather than
    the supervisor's."""
    with contextlib.suppress(ImportError):
        from setproctitle import setproctitle

        setproctitle(title)


def preload(module: str, port: int) -> bool:
    """Import MODULE in the environment the processes get; False (said on stderr) when it
    fails, and the processes then start under the shell."""
    # setproctitle finds this process's command line from where the environment starts, so
    # it must look (at its first call) before the environment changes: putenv can move it.
    with contextlib.suppress(ImportError):
        from setproctitle import getproctitle

        getproctitle()
    os.environ.update(child_environment(port))
    if os.getcwd() not in sys.path:  # imported from the working directory, as gunicorn and
        sys.path.insert(0, os.getcwd())  # celery import their applications
    try:
        importlib.import_module(module)
    except KeyboardInterrupt:
        raise  # Ctrl-C while loading: nothing to start
    except BaseException as exc:
        print(
            f"run_procfile: --preload {module} failed ({type(exc).__name__}: {exc}); "
            "each process loads on its own",
            file=sys.stderr,
            flush=True,
        )
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-f", "--procfile", type=Path, default=Path("Procfile"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT") or 8000))
    parser.add_argument(
        "--stop-seconds",
        type=float,
        default=10.0,
        help="how long the processes get to stop before SIGKILL",
    )
    parser.add_argument(
        "--preload",
        metavar="MODULE",
        help="import MODULE, then start the Python programs of `exec` lines as forks of this "
        "process, sharing what it loaded",
    )
    args = parser.parse_args(argv)
    try:
        entries = read_procfile(args.procfile)
    except (OSError, ProcfileError) as exc:
        print(f"run_procfile: {exc}", file=sys.stderr)
        return 2
    try:
        preloaded = bool(args.preload) and preload(args.preload, args.port)
    except KeyboardInterrupt:
        print("run_procfile: interrupted while loading; nothing was started", file=sys.stderr)
        return 130
    supervisor = Supervisor(
        entries, port=args.port, stop_seconds=args.stop_seconds, preloaded=preloaded
    )
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
