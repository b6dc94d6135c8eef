"""Real server and worker processes for integration tests.

``LiveStack`` starts gunicorn (several processes), a Celery worker (prefork) and, when asked,
Celery beat, all pointed at the test database pytest-django created and at the broker of this
run (the embedded filesystem broker under a fresh folder, or ``CELERY_BROKER_URL``). Tests
that use it need committed data: use the ``transactional_db`` fixture.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def database_url() -> str:
    """A DATABASE_URL for the test database of this run (created by pytest-django)."""
    from django.db import connection

    cfg = connection.settings_dict
    if cfg["ENGINE"] == "django.db.backends.sqlite3":
        return f"sqlite:///{Path(cfg['NAME']).resolve()}"
    user = cfg.get("USER") or ""
    password = f":{cfg['PASSWORD']}" if cfg.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    return (
        f"postgres://{auth}{cfg.get('HOST') or '127.0.0.1'}:{cfg.get('PORT') or 5432}/{cfg['NAME']}"
    )


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
        self.tmp = Path(tempfile.mkdtemp(prefix="taskdesk-live-"))
        broker = os.environ.get("CELERY_BROKER_URL", "")
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "SECRET_KEY": settings.SECRET_KEY,
            "TASKDESK_VAR_DIR": str(self.tmp),
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
            **(env or {}),
        }
        self.worker_concurrency = worker_concurrency
        self.want_beat = beat
        self.want_worker = worker
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- processes ---------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def start(self, *, wait: bool = True) -> LiveStack:
        self.collect_static()
        self._spawn("web", [str(BIN / "gunicorn"), "config.wsgi", "-c", "config/gunicorn.conf.py"])
        if self.want_worker:
            self.start_worker()
        if self.want_beat:
            self.start_beat()
        if wait:
            self.wait_healthy()
        return self

    def collect_static(self) -> None:
        """Collect static files into this stack's folder, as `make run` does: the manifest
        storage of production settings cannot name a file it has not collected."""
        subprocess.run(
            [str(BIN / "python"), "manage.py", "collectstatic", "--noinput", "-v0"],
            cwd=ROOT,
            env=self.env,
            check=True,
        )

    def start_worker(self, concurrency: int | None = None) -> subprocess.Popen[bytes]:
        return self._spawn(
            "worker",
            [
                str(BIN / "celery"),
                "-A",
                "config",
                "worker",
                "--pool",
                "prefork",
                "--concurrency",
                str(concurrency or self.worker_concurrency),
                "--loglevel",
                "INFO",
                "-n",
                f"worker-{self.port}@%h",
                "--without-mingle",
                "--without-gossip",
            ],
        )

    def start_beat(self) -> subprocess.Popen[bytes]:
        return self._spawn(
            "beat",
            [
                str(BIN / "celery"),
                "-A",
                "config",
                "beat",
                "--loglevel",
                "INFO",
                "-s",
                str(self.tmp / "celerybeat-schedule"),
            ],
        )

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def pool_pids(self) -> list[int]:
        """PIDs of the Celery worker's pool processes (children of the worker main process)."""
        worker = self.procs["worker"]
        out = subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(worker.pid)],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        return [int(pid) for pid in out.split()]

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_healthy(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {proc.returncode}:\n{self.log(name)[-3000:]}"
                    )
            try:
                last = httpx.get(f"{self.url}/healthz", timeout=2)
                if last.status_code == 200:
                    return
            except httpx.HTTPError as exc:
                last = exc
            time.sleep(0.2)
        raise RuntimeError(
            f"server not healthy after {timeout}s: {last}\n{self.log('web')[-3000:]}"
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


@contextlib.contextmanager
def live_stack(**kwargs: Any) -> Iterator[LiveStack]:
    stack = LiveStack(**kwargs)
    try:
        yield stack.start()
    finally:
        stack.close()
