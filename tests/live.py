"""Real processes for integration tests: starting them, waiting for them, stopping them.

``LiveStack`` starts gunicorn (several processes), a Celery worker (prefork) for legs and,
when asked, the control worker with beat in a thread of it (as the Procfile does), all
pointed at the test database pytest-django created and at the broker of this
run (the embedded filesystem broker under a fresh folder, or ``CELERY_BROKER_URL``). Tests
that use it need committed data: use the ``transactional_db`` fixture. ``RedisServer`` runs a
throwaway redis-server on a port of its own. ``FaultProxy`` stands between a client and the
server and loses, holds or refuses chosen answers. ``wait_for`` polls until another process has
done something. Which services a run can reach is ``tests.services``' business.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tests import forkserver
from tests.services import port_open, redis_server_binary

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

T = TypeVar("T")

# The static files collected for the live stacks of this test run (``collect_static``).
_collected_static: Path | None = None
# This test process's folder for its stacks' files (``run_folder``).
_run_folder: Path | None = None


def run_folder() -> Path:
    """The folder under which this test process keeps its live stacks' files (each stack's var
    folder and logs, the collected static files). ``end_run`` removes it after a session that
    passed and keeps it, for the logs, after one that failed."""
    global _run_folder
    if _run_folder is None:
        _run_folder = Path(tempfile.mkdtemp(prefix="taskdesk-tests-"))
    return _run_folder


def end_run(*, passed: bool) -> Path | None:
    """At the end of the session: remove the run folder if the session PASSED; return the
    folder kept otherwise (None when no stack ran)."""
    global _run_folder, _collected_static
    folder, _run_folder, _collected_static = _run_folder, None, None
    if folder is None:
        return None
    if passed:
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return folder


# Each test process takes its ports from a block of its own below the ephemeral range (which
# starts at 32768): ports the kernel handed out for binding to port 0 came back to another
# xdist worker a moment later, and a web server listens with SO_REUSEPORT, so two workers'
# stacks started together could share a port and answer each other's requests. Two runs at
# once on one machine need blocks apart too: TASKDESK_TEST_PORTS moves a run's first block
# (CI's RabbitMQ tests run beside the serial pass of another run, and the two had picked the
# same ports: one stack's requests reached the other's, whose database knew no such token).
_PORTS_FROM = int(os.environ.get("TASKDESK_TEST_PORTS") or 10_000)
_PORTS_PER_PROCESS = 2_000
_next_port = 0


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on, from this test process's own block."""
    global _next_port
    # 0 for a process outside xdist (the serial pass beside the workers), n + 1 for worker gwn.
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw-1").removeprefix("gw")) + 1
    first = _PORTS_FROM + index * _PORTS_PER_PROCESS
    for _ in range(_PORTS_PER_PROCESS):
        port = first + _next_port
        _next_port = (_next_port + 1) % _PORTS_PER_PROCESS
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}-{first + _PORTS_PER_PROCESS - 1}")


def wait_for(
    what: str,
    check: Callable[[], T | None],
    timeout: float,
    every: float = 0.02,
    explain: Callable[[], str] | None = None,
) -> T:
    """Call CHECK every EVERY seconds until it returns something true, and return that; after
    TIMEOUT seconds fail, naming WHAT (and adding what EXPLAIN says)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{detail}")
        time.sleep(every)


def live_children(pid: int) -> list[int]:
    """The child processes of PID that are not zombies, read from /proc: the waits poll this
    every 20 ms, and a file read costs less than starting a ``ps`` each time. Every thread's
    list: a pool may be forked from a thread other than the main one."""
    children: list[int] = []
    for listing in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):  # the thread or the process has just ended
            children += [int(child) for child in listing.read_text().split()]
    return sorted(child for child in set(children) if _state(child) not in ("Z", None))


def _state(pid: int) -> str | None:
    """The state letter of PID (``R``, ``S``, ``Z``...), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]  # after the command name, which may hold spaces


def stop_process(
    proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 15
) -> None:
    """Send SIG to the process group of PROC (started with ``start_new_session``) and wait for
    it to end; SIGKILL the group if it is still there after TIMEOUT seconds."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def database_url() -> str:
    """A DATABASE_URL for the test database of this run (created by pytest-django)."""
    from django.db import connection

    cfg = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(cfg['NAME']).resolve()}"
    user = cfg.get("USER") or ""
    password = f":{cfg['PASSWORD']}" if cfg.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    return (
        f"postgres://{auth}{cfg.get('HOST') or '127.0.0.1'}:{cfg.get('PORT') or 5432}/{cfg['NAME']}"
    )


# The stacks' TASKDESK_METRICS_TOKEN, and the headers that send it: monitoring's view of
# /metrics and of /healthz and /readyz (anonymous callers get only their status).
METRICS_TOKEN = "live-metrics-token"
MONITOR_HEADERS = {"Authorization": f"Bearer {METRICS_TOKEN}"}


class LiveStack:
    def __init__(
        self,
        *,
        env: dict[str, str] | None = None,
        web_workers: int = 2,
        worker_concurrency: int = 2,
        beat: bool = True,
        worker: bool = True,
    ) -> None:
        from django.conf import settings

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.mcp_url = f"{self.url}/mcp"
        self.tmp = Path(tempfile.mkdtemp(prefix="live-", dir=run_folder()))
        broker = os.environ.get("CELERY_BROKER_URL", "")
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "SECRET_KEY": settings.SECRET_KEY,
            "TASKDESK_VAR_DIR": str(self.tmp),
            # This stack's own metrics folder (the test process exports its own).
            "PROMETHEUS_MULTIPROC_DIR": str(self.tmp / "prometheus"),
            # The same embedded broker folder as this test process, so work it dispatches
            # (through transitions called in-process) reaches the live worker too.
            "TASKDESK_BROKER_DIR": str(settings.BROKER_DIR),
            "CELERY_BROKER_URL": broker or "filesystem://",
            "HOST": "127.0.0.1",
            "TASKDESK_PORT": str(self.port),
            "PORT": str(self.port),
            "WEB_WORKERS": str(web_workers),
            "TASKDESK_TOOLSETS": "demo,conformance",
            "TASKDESK_SWEEP_SECONDS": "1",
            "TASKDESK_DISPATCH_GRACE_SECONDS": "1",
            "TASKDESK_LEASE_SECONDS": "5",
            "TASKDESK_DEMO_EXPORT_SECONDS": "0.5",
            "TASKDESK_EXPORT_DIR": str(self.tmp / "exports"),
            "LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
            # For /metrics and the details of /healthz and /readyz (``monitor_headers``).
            "TASKDESK_METRICS_TOKEN": METRICS_TOKEN,
            # Keys of its own in the shared cache: a stack never counts an earlier stack's
            # held work or serves its /metrics gauges (kept up to
            # TASKDESK_METRICS_DATABASE_SECONDS), whichever test of this process ran it.
            "TASKDESK_CACHE_PREFIX": f"live-{uuid.uuid4().hex[:12]}",
            **(env or {}),
        }
        self.worker_concurrency = worker_concurrency
        self.want_beat = beat
        self.want_worker = worker
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        # Where each log begins for the test using the stack (``log``): past what earlier
        # tests of a kept stack (``kept_stack``) wrote.
        self.log_start: dict[str, int] = {}

    # -- processes ---------------------------------------------------------------------

    def _spawn(
        self, name: str, args: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with open(self.tmp / f"{name}.log", "ab") as log:
            proc = forkserver.spawn(
                args,
                cwd=ROOT,
                env={**self.env, **(env or {})},
                stdout=log.fileno(),
                stderr=log.fileno(),
                start_new_session=True,
                warm=True,  # the stack's programs share one set-up of Django (tests/forkserver.py)
            )
        self.procs[name] = proc
        return proc

    def start(self, *, wait: bool = True) -> LiveStack:
        if _kept is not None and _kept[1] is not self:
            close_kept_stack()  # it would take this stack's jobs from the shared broker
        self.collect_static()
        self.clear_metrics()
        self.start_web()
        if self.want_worker:
            self.start_worker()
        if self.want_beat:
            self.start_control()
        if wait:
            self.wait_healthy()
        return self

    def clear_metrics(self) -> None:
        """Empty the metrics folder before the processes start, as `make run` does."""
        shutil.rmtree(self.env["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)

    def _celery(self, *args: str) -> list[str]:
        quiet = ["--quiet"] if self.env.get("LOG_FORMAT") == "json" else []  # no banner
        return [str(BIN / "celery"), "-A", "config", *quiet, *args]

    def collect_static(self) -> None:
        """Give this stack collected static files, as `make run` does: the manifest storage
        of production settings cannot name a file it has not collected. They are collected
        once per test run (they do not change during it) and linked into each stack."""
        global _collected_static
        if _collected_static is None:
            folder = Path(tempfile.mkdtemp(prefix="static-", dir=run_folder()))
            subprocess.run(
                [str(BIN / "python"), "manage.py", "collectstatic", "--noinput", "-v0"],
                cwd=ROOT,
                env={**self.env, "TASKDESK_VAR_DIR": str(folder)},
                check=True,
            )
            _collected_static = folder / "staticfiles"
        link = self.tmp / "staticfiles"
        if not link.exists():
            link.symlink_to(_collected_static, target_is_directory=True)

    def start_web(self, name: str = "web", port: int | None = None) -> subprocess.Popen[bytes]:
        """Start a web server (gunicorn) as NAME, on PORT (default: the stack's own)."""
        env = None if port is None else {"PORT": str(port), "TASKDESK_PORT": str(port)}
        gunicorn = [str(BIN / "gunicorn"), "config.wsgi", "-c", "config/gunicorn.conf.py"]
        return self._spawn(name, gunicorn, env)

    def start_worker(
        self,
        concurrency: int | None = None,
        *,
        name: str = "worker",
        env: dict[str, str] | None = None,
        queue: str = "celery",
    ) -> subprocess.Popen[bytes]:
        """Start a Celery worker process as NAME (its log is NAME.log) consuming QUEUE, with
        ENV added to the stack's environment."""
        return self._spawn(
            name,
            self._celery(
                "worker",
                "--pool",
                "prefork",
                "--concurrency",
                str(concurrency or self.worker_concurrency),
                "--queues",
                queue,
                "--loglevel",
                self.env.get("LOG_LEVEL", "INFO"),
                "-n",
                f"{name}-{self.port}@%h",
                "--without-mingle",
                "--without-gossip",
            ),
            env,
        )

    def start_control(self, *, embed_beat: bool = True) -> subprocess.Popen[bytes]:
        """The worker of the control queue (sweeper, heartbeat, deadlines, purge), one process
        that runs its jobs itself and, unless not EMBED_BEAT, sends them from beat's thread,
        as the Procfile's."""
        return self._spawn(
            "control",
            self._celery(
                "worker",
                "--pool",
                "solo",
                "--queues",
                "control",
                "--embed-beat" if embed_beat else "--no-embed-beat",
                "-s",
                str(self.tmp / "celerybeat-schedule"),
                "--loglevel",
                self.env.get("LOG_LEVEL", "INFO"),
                "-n",
                f"control-{self.port}@%h",
                "--without-mingle",
                "--without-gossip",
            ),
        )

    def start_beat(self) -> subprocess.Popen[bytes]:
        """Beat as a process of its own (``taskdesk beat``), beside a control worker started
        without its own."""
        schedule = str(self.tmp / "celerybeat-schedule")
        return self._spawn("beat", self._celery("beat", "--loglevel", "INFO", "-s", schedule))

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            stop_process(proc, sig, timeout)

    def close(self, *, graceful: bool = True) -> None:
        """Stop every process of the stack: all are told at once, then each is waited for.

        Only each group's leader (gunicorn's master, a Celery worker's main process) gets
        SIGTERM, as a supervisor sends it: it stops its own children. Signalled directly, a
        pool process can die before its main process has begun its warm shutdown, which
        the main process then reports as a lost child. Whatever of a group is still there
        after the wait is killed.

        Not GRACEFUL (the end of a test that did not stop the stack itself): every group is
        killed at once. A worker's warm shutdown takes about 3 s even when idle (its pool
        processes wait for the main process to read their last results), and a test that
        does not look at the shutdown has no use for it; the tests of stopping stop the
        stack themselves, or run ``make run``."""
        procs = [self.procs.pop(name) for name in list(self.procs)]
        if not graceful:
            for proc in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            for proc in procs:
                proc.wait(10)
            return
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                stop_process(proc, signal.SIGKILL, 5)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # anything the leader left behind

    def pool_pids(self, name: str = "worker") -> list[int]:
        """PIDs of the pool processes of Celery worker NAME (children of its main process).
        A killed one that its parent has not reaped yet (a zombie) is not counted."""
        return live_children(self.procs[name].pid)

    def log(self, name: str) -> str:
        """What process NAME has logged since the current test took the stack."""
        path = self.tmp / f"{name}.log"
        if not path.exists():
            return ""
        with path.open("rb") as log:
            log.seek(self.log_start.get(name, 0))
            return log.read().decode(errors="replace")

    def hand_over(self) -> None:
        """Ready a running stack for the next test (``kept_stack``): its logs begin here, and
        the held-work leases its processes no longer hold are dropped, as ``start`` does."""
        for name in self.procs:
            path = self.tmp / f"{name}.log"
            self.log_start[name] = path.stat().st_size if path.exists() else 0
        forget_held_slots(
            self.env["TASKDESK_CACHE_PREFIX"],
            in_test_database=self.env["DATABASE_URL"] == database_url(),
        )

    def left_as_found(self, pids: dict[str, int]) -> bool:
        """Whether the test that held the stack left it as it found it (PIDS, by name): the
        same processes, all running, and no leg running in its worker (a leg of a task the
        test's database flush removes would hold a pool process into the next test)."""
        from tasks_app.models import Task

        if {name: proc.pid for name, proc in self.procs.items()} != pids:
            return False
        if any(proc.poll() is not None for proc in self.procs.values()):
            return False
        return not Task.objects.exclude(lease_owner="").exists()

    def wait_healthy(self, timeout: float = 60) -> None:
        last: Any = None

        def healthy() -> bool:
            nonlocal last
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {proc.returncode}:\n{self.log(name)[-3000:]}"
                    )
            try:
                last = httpx.get(f"{self.url}/healthz", headers=MONITOR_HEADERS, timeout=2)
            except httpx.HTTPError as exc:
                last = exc
                return False
            return bool(last.status_code == 200)

        wait_for(
            "a healthy server",
            healthy,
            timeout,
            every=0.2,
            explain=lambda: f"last answer: {last}\n{self.log('web')[-3000:]}",
        )

    # -- HTTP helpers ------------------------------------------------------------------

    def post(
        self,
        body: Any,
        *,
        token: str | None = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
        timeout: float = 30,
    ) -> httpx.Response:
        hdrs = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if token:
            hdrs["Authorization"] = f"Bearer {token}"
        hdrs.update(headers or {})
        if raw is None:
            import json

            raw = json.dumps(body).encode()
        return httpx.post(self.mcp_url, content=raw, headers=hdrs, timeout=timeout)


DATABASE_CACHE = "django.core.cache.backends.db.DatabaseCache"


def forget_held_slots(prefix: str, *, in_test_database: bool = True) -> None:
    """Drop the per-client held-work leases (tasks_app/mcp/client_slots.py) that a kept
    stack's earlier tests left in the shared cache under the stack's key PREFIX. Processes
    those tests killed would keep theirs until LEASE_SECONDS ran out, and the next test's
    clients may reuse the same primary keys (the database was flushed) and would find their
    slots taken meanwhile.

    The database cache's table is no model's, so a test's flush of the database leaves it full
    (IN_TEST_DATABASE: the stack's database cache is the test database's, not a database
    of its own, whose table is new)."""
    from django.core.cache import cache
    from django.db import connection

    import config.settings as shipped

    pattern = f"{prefix}:*:held:*"
    client = getattr(getattr(cache, "_cache", None), "get_client", None)
    if client is not None:
        redis = client(write=True)
        for key in redis.scan_iter(match=pattern):
            redis.delete(key)
    elif in_test_database and shipped.CACHES["default"]["BACKEND"] == DATABASE_CACHE:
        table = connection.ops.quote_name(shipped.CACHE_TABLE)
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {table} WHERE cache_key LIKE %s",
                [pattern.replace("*", "%")],
            )


@contextlib.contextmanager
def live_stack(**kwargs: Any) -> Iterator[LiveStack]:
    stack = LiveStack(**kwargs)
    try:
        yield stack.start()
    finally:
        stack.close(graceful=False)


# The stack ``kept_stack`` keeps running between tests of this process, with what it was
# asked for.
_kept: tuple[str, LiveStack] | None = None


@contextlib.contextmanager
def kept_stack(**kwargs: Any) -> Iterator[LiveStack]:
    """A live stack (``LiveStack(**KWARGS)``) that outlives the test: the next test of this
    process that asks for the same one gets it running, instead of starting four Python
    processes again (about 5 s of CPU a stack). For tests that use a stack as it is (the
    ``live`` and ``stack`` fixtures): a test that stops, kills or adds a process, or leaves
    a leg running, makes it start afresh for the next. The test database is flushed between
    tests as always: the processes keep their connections and find the new test's rows.
    ``close_kept_stack`` ends it before the test database goes."""
    global _kept
    key = repr(sorted(kwargs.items()))
    if _kept is not None and _kept[0] != key:
        close_kept_stack()
    if _kept is None:
        stack = LiveStack(**kwargs).start()
        _kept = (key, stack)
    else:
        stack = _kept[1]
        stack.hand_over()
    pids = {name: proc.pid for name, proc in stack.procs.items()}
    kept = False
    try:
        yield stack
        kept = stack.left_as_found(pids)
    finally:
        if not kept:
            close_kept_stack()


def close_kept_stack() -> None:
    global _kept
    if _kept is not None:
        _kept[1].close(graceful=False)
        _kept = None


def kill(stack: LiveStack, pid: int) -> None:
    """SIGKILL PID, a pool process of STACK's worker."""
    assert pid in stack.pool_pids(), f"{pid} is not a pool process of the live worker"
    os.kill(pid, signal.SIGKILL)


def pool_restored(stack: LiveStack, size: int = 2, timeout: float = 30) -> list[int]:
    """Wait until STACK's worker has SIZE pool processes again; return their PIDs."""
    return wait_for(
        f"{size} pool processes",
        lambda: p if len(p := stack.pool_pids()) == size else None,
        timeout,
        explain=lambda: (
            f"pool processes now: {stack.pool_pids()}; worker exit status: "
            f"{stack.procs['worker'].poll()}\n{stack.log('worker')[-3000:]}"
        ),
    )


class RedisServer:
    """A redis-server of its own on PORT that keeps nothing on disk: started again, it is empty."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = redis_server_binary()
        assert binary is not None
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for("redis-server to listen", self.reachable, timeout=10, every=0.05)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout=10)
        self.proc = None
        assert not self.reachable()

    def reachable(self) -> bool:
        return port_open("127.0.0.1", self.port, timeout=0.2)


class FaultProxy:
    """An HTTP proxy in front of UPSTREAM (a live stack's ``mcp_url``) that misbehaves on
    purpose, for the requests whose ``Mcp-Method`` header a script names.

    ``script(method, actions)`` takes the actions of the next requests of METHOD, in order:
    ``"pass"`` forwards and returns the answer; ``"drop"`` forwards, then closes the
    connection without answering (the acknowledgement is lost); ``"hold"`` forwards, then
    never answers; ``"503"`` answers 503 with ``Retry-After`` without forwarding;
    ``"forward-503"`` forwards, then answers 503 instead. Requests past the script pass.
    ``seen`` lists ``(method, headers, action)`` of every request; ``on_request(method,
    headers)`` runs as each arrives, before it is forwarded."""

    def __init__(self, upstream: str, *, retry_after: int = 1) -> None:
        import http.server
        import threading

        self.upstream = upstream
        self.retry_after = retry_after
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.seen: list[tuple[str, dict[str, str], str]] = []
        self.on_request: Callable[[str, dict[str, str]], None] | None = None
        self._scripts: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                method = self.headers.get("Mcp-Method", "")
                with proxy._lock:
                    queue = proxy._scripts.get(method) or []
                    action = queue.pop(0) if queue else "pass"
                    proxy.seen.append((method, headers, action))
                if proxy.on_request is not None:
                    proxy.on_request(method, headers)
                if action == "503":
                    self._answer(503, b"busy", {"Retry-After": str(proxy.retry_after)})
                    return
                answer = httpx.post(proxy.upstream, content=body, headers=headers, timeout=60)
                if action == "drop":
                    self.close_connection = True
                    return
                if action == "hold":
                    proxy._closing.wait(120)
                    self.close_connection = True
                    return
                if action == "forward-503":
                    self._answer(503, b"busy", {"Retry-After": str(proxy.retry_after)})
                    return
                kept = {
                    k: v
                    for k, v in answer.headers.items()
                    if k.lower() not in ("content-length", "transfer-encoding", "connection")
                }
                self._answer(answer.status_code, answer.content, kept)

            def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def script(self, method: str, actions: list[str]) -> None:
        with self._lock:
            self._scripts[method] = list(actions)

    def requests(self, method: str) -> list[tuple[dict[str, str], str]]:
        with self._lock:
            return [(headers, action) for m, headers, action in self.seen if m == method]

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def postgres_bin() -> Path | None:
    """The folder of the newest installed PostgreSQL's server programs (Debian's layout)."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return found[-1].parent if found else None


class PostgresCluster:
    """A PostgreSQL cluster of its own for a fault test to stop and start: ``initdb`` in a
    temporary folder, its own port on loopback, its socket in that folder, no fsync. Run as
    the ``postgres`` user when this process is root (initdb refuses root)."""

    def __init__(self, port: int) -> None:
        binary = postgres_bin()
        assert binary is not None, "PostgreSQL's server programs are not installed"
        self.bin = binary
        self.port = port
        self.root = Path(tempfile.mkdtemp(prefix="taskdesk-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.user = "postgres"
        if os.geteuid() == 0:
            import shutil

            shutil.chown(self.root, user="postgres", group="postgres")
        self._run("initdb", "-D", str(self.data), "-U", self.user, "-A", "trust", "--no-sync")

    def url(self, name: str) -> str:
        return f"postgres://{self.user}@127.0.0.1:{self.port}/{name}"

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.bin / program), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{program} failed: {done.stdout}{done.stderr}"

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")

    def stop(self) -> None:
        """A fast shutdown: every connection is cut, as in a restart or a failover."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def running(self) -> bool:
        return port_open("127.0.0.1", self.port, timeout=0.2)

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def close(self) -> None:
        if self.running():
            self.stop()
        import shutil

        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def postgres_cluster() -> Iterator[PostgresCluster]:
    cluster = PostgresCluster(free_port())
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


def manage(env: dict[str, str], *args: str) -> str:
    """Run ``manage.py ARGS`` with ENV (e.g. a stack's, or another DATABASE_URL); return its
    standard output."""
    done = forkserver.run([str(BIN / "python"), "manage.py", *args], cwd=ROOT, env=env, timeout=120)
    done.check_returncode()
    return done.stdout
