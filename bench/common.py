"""What the benchmarks share: the processes and the database they start and stop."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
DOCS = ROOT / "docs" / "benchmarks.md"
POSTGRES = os.environ.get("BENCH_POSTGRES", "postgres://postgres@127.0.0.1:5432").rstrip("/")


def say(message: str) -> None:
    print(f"bench: {message}", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def database(prefix: str) -> Iterator[str]:
    """A new PostgreSQL database for one run, dropped afterwards; yields its DSN."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    with psycopg.connect(f"{POSTGRES}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{POSTGRES}/{name}"
    finally:
        with psycopg.connect(f"{POSTGRES}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def process(
    args: list[str], *, env: dict[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ARGS in its own process group for the block; stop the whole group after it."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def stack_env(
    dsn: str, workdir: Path, *, web_port: int, redis_port: int, toolsets: str, log_level: str
) -> dict[str, str]:
    """The environment of the processes a benchmark starts: its own database, Redis and var
    folder, and the production configuration rather than a developer's overrides."""
    env = {
        **os.environ,
        "DATABASE_URL": dsn,
        "CELERY_BROKER_URL": f"redis://127.0.0.1:{redis_port}/0",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "TASKDESK_VAR_DIR": str(workdir),
        "HOST": "127.0.0.1",
        "TASKDESK_PORT": str(web_port),
        "PORT": str(web_port),
        "TASKDESK_TOOLSETS": toolsets,
        "LOG_LEVEL": log_level,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PYTHONUNBUFFERED": "1",
    }
    for name in ("WEB_WORKERS", "WEB_THREADS", "DEBUG"):
        env.pop(name, None)
    return env


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [str(BIN / "python"), "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"bench: manage.py {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def process_tree(pid: int) -> list[int]:
    """PID and its direct children (gunicorn's master and workers, a Celery worker and its
    pool)."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [pid, *(int(p) for p in out.stdout.split())]


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) process PID has used, 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
