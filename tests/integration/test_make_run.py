"""`make run` on a checkout whose .venv exists: healthy within 60 s, a worker consuming jobs
through the broker, and every process gone after SIGTERM to the process group."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.live import ROOT, database_url, free_port


def _group_members(pgid: int) -> list[str]:
    out = subprocess.run(
        ["ps", "-eo", "pgid=,pid=,args="], capture_output=True, text=True, check=True
    ).stdout
    return [line for line in out.splitlines() if line.split(None, 1)[0] == str(pgid)]


@pytest.mark.live
def test_make_run_serves_health_runs_jobs_and_stops_cleanly(
    transactional_db, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    env = {
        **os.environ,
        "PORT": str(port),
        "TASKDESK_VAR_DIR": str(tmp_path),
        "DJANGO_SUPERUSER_PASSWORD": "",
        "WEB_WORKERS": "2",
        "WORKER_CONCURRENCY": "1",
    }
    env.pop("TASKDESK_BROKER_DIR", None)
    if os.environ.get("DATABASE_URL"):
        env["DATABASE_URL"] = database_url()  # the migrated test database of this run
    log = open(tmp_path / "make-run.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        ["make", "run"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        started = time.monotonic()
        body = None
        while time.monotonic() - started < 60:
            assert proc.poll() is None, (tmp_path / "make-run.log").read_text()
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                if response.status_code == 200:
                    body = response.json()
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        assert body is not None, "no healthy /healthz within 60 s"

        # Beat publishes heartbeat_job every 10 s; a worker consuming it proves the broker path.
        while time.monotonic() - started < 90 and body["workers"]["heartbeat"] is None:
            time.sleep(1)
            body = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json()
        assert body["workers"]["heartbeat"] is not None, "no worker heartbeat"

        output = (tmp_path / "make-run.log").read_text()
        assert f"MCP endpoint : http://127.0.0.1:{port}/mcp" in output
        assert f"Dashboard    : http://127.0.0.1:{port}/tasks/" in output
        assert "Demo token   : tdk_" in output
        assert "Operator     : operator / " in output
        assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        log.close()
    deadline = time.monotonic() + 20
    while _group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _group_members(proc.pid) == []
