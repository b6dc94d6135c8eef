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

It is written here rather than taken from a Procfile runner because the runners at hand
(honcho) send SIGTERM to each process's whole group: the Celery pool processes then die in
the middle of the legs they are running (``WorkerLostError`` on every Ctrl-C) instead of
being stopped by their worker. It uses only the standard library, so it is one small
process beside the ones it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

_LINE = re.compile(r"^([A-Za-z0-9_-]+):\s*(\S.*)$")
_PR_SET_PDEATHSIG = 1


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


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
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


class Supervisor:
    def __init__(
        self,
        entries: list[tuple[str, str]],
        *,
        port: int,
        stop_seconds: float,
    ) -> None:
        self.entries = entries
        self.port = port
        self.stop_seconds = stop_seconds
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
        env = {**os.environ, "PORT": str(self.port), "PYTHONUNBUFFERED": "1"}
        for name, command in self.entries:
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
            self.system(f"{name}.1 started (pid={proc.pid})")

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
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
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
    args = parser.parse_args(argv)
    try:
        entries = read_procfile(args.procfile)
    except (OSError, ProcfileError) as exc:
        print(f"run_procfile: {exc}", file=sys.stderr)
        return 2
    return Supervisor(entries, port=args.port, stop_seconds=args.stop_seconds).run()


if __name__ == "__main__":
    sys.exit(main())
