"""Gunicorn settings for `make run` (HOST, PORT, WEB_WORKERS, WEB_THREADS from the environment)."""

from __future__ import annotations

import gc
import importlib
import multiprocessing
import os
import queue
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings

# gunicorn loads this file by its path, outside any package. Its package is the folder it is
# in: `config` in the repository, `taskdesk` once installed from the wheel (setup.py), found
# from the folder above it.
_PACKAGE = Path(__file__).resolve().parent
if str(_PACKAGE.parent) not in sys.path:
    sys.path.append(str(_PACKAGE.parent))
_env = importlib.import_module(f"{_PACKAGE.name}.env")
_web_worker = importlib.import_module(f"{_PACKAGE.name}.web_worker")
env_int, load_settings = _env.env_int, _env.load_settings
settings_errors_end_the_process = _env.settings_errors_end_the_process
header_timeout, read_buffer_bytes = _web_worker.header_timeout, _web_worker.read_buffer_bytes
reading_per_address = _web_worker.reading_per_address

# The master loads Django's settings before it starts a web process: a malformed setting
# ends gunicorn here with one line naming it (config/env.py), rather than every web process
# failing to boot with a traceback.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", f"{_PACKAGE.name}.settings")
load_settings()

# TASKDESK_PORT wins over PORT (config/settings.py): Procfile runners may give every process
# a PORT of its own, and `make run` passes the one the user chose as TASKDESK_PORT.
bind = [f"{settings.HOST}:{settings.PORT}"]
with settings_errors_end_the_process():
    # One process per core (at least two): the work is CPU-bound (the GIL), and on the same
    # cores the Celery worker, PostgreSQL and Redis want their share; more processes only
    # cost memory (about 60 MiB each). Measured on 2 cores: docs/benchmarks.md.
    workers = env_int("WEB_WORKERS", max(2, multiprocessing.cpu_count()), minimum=1)
    header_timeout()  # read by each web process's worker (below); checked here, once
    read_buffer_bytes()  # likewise
    reading_per_address()
# The master sets up Django and imports the project once (config/wsgi.py) and each web process
# is a fork of it: none repeats the set-up (about a second of CPU per process on two cores),
# and share the imported code's memory until they write to it. Nothing is connected at import
# (the database, the broker and Redis connect at first use in each process), and the
# metrics' files follow the process id after the fork (prometheus-client checks it).
preload_app = True
# Threads keep a streaming (SSE) response from blocking a whole worker process. Of these,
# TASKDESK_RESERVED_THREADS (2) are never taken by held work (streams, synchronous runs,
# waits: tasks_app/mcp/limits.py), so quick requests always find one (config/settings.py).
threads = settings.WEB_THREADS
# The worker is gthread's, but it reads each request in its poller and hands a thread only
# whole requests: a client whose headers are not complete within
# TASKDESK_HEADER_TIMEOUT_SECONDS (10) is dropped instead of holding a thread, and what a
# process holds of requests it is reading is bounded by TASKDESK_READ_BUFFER_BYTES (32 MiB),
# and the connections of one address it reads at once by TASKDESK_READING_PER_ADDRESS (64)
# (config/web_worker.py).
worker_class = f"{_PACKAGE.name}.web_worker.HeaderTimeoutWorker"
# Each web process listens on a socket of its own (SO_REUSEPORT) and the kernel spreads new
# connections over them. On one shared socket the process that woke first took a client's
# keep-alive connection for as long as it lasted, so a few processes held most connections and
# were bound to one core each (their GIL) while the others idled (docs/benchmarks.md).
reuse_port = True
timeout = 120
graceful_timeout = 10
keepalive = 5
accesslog = os.environ.get("WEB_ACCESS_LOG") or None
errorlog = "-"
loglevel = settings.LOG_LEVEL.lower()
proc_name = "taskdesk-web"
# gunicorn's control socket (for `gunicornc`) lives with this instance's other state. Its
# default, ~/.gunicorn/gunicorn.ctl, is one path for every gunicorn of the user: a second
# server took it over from the first, and the first to stop removed it. The folder is
# config.settings.VAR_DIR, made here if need be (importing the settings makes no folder).
settings.VAR_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
control_socket = str(settings.VAR_DIR / "gunicorn.ctl")

# LOG_FORMAT=json: gunicorn's own lines (start-up, worker boots, the access log) as JSON too.
if settings.LOG_FORMAT == "json":
    _json_handler = {
        "class": "logging.StreamHandler",
        "formatter": "json",
        "filters": ["context"],
        "stream": "ext://sys.stderr",
    }
    logconfig_dict = {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": "tasks_app.logcontext.ContextFilter"}},
        "formatters": {"json": {"()": "tasks_app.logcontext.JsonFormatter"}},
        "handlers": {"console": _json_handler},
        "loggers": {
            "gunicorn.error": {
                "handlers": ["console"],
                "level": loglevel.upper(),
                "propagate": False,
            },
            "gunicorn.access": {"handlers": ["console"], "level": "INFO", "propagate": False},
        },
    }


def on_starting(server: Any) -> None:
    """Refuse a port that something already listens on: with SO_REUSEPORT a second server
    of the same user would otherwise share it, each taking part of the connections. Tried
    five times a second apart, as gunicorn does its own binds (a server stopping frees it)."""
    for attempt in range(5):
        busy = [(address, error) for address in bind if (error := _bind_error(address))]
        if not busy:
            return
        if attempt < 4:
            server.log.warning("%s is in use; trying again in 1 second", busy[0][0])
            time.sleep(1)
    address, error = busy[0]
    raise SystemExit(
        f"taskdesk-web: cannot listen on {address}: {error} "
        "(another server on this port? set PORT to another one)"
    )


def when_ready(server: Any) -> None:
    """Say where the server listens: with reuse_port each web process binds its own socket,
    so gunicorn's own "Listening at:" line, written before they start, names none."""
    addresses = ", ".join(f"http://{address}" for address in bind)
    server.log.info("Listening at: %s (a socket per web process)", addresses)


def _bind_error(address: str) -> str | None:
    host, _, port = address.rpartition(":")
    for family, kind, proto, _name, sockaddr in socket.getaddrinfo(
        host.strip("[]"), int(port), type=socket.SOCK_STREAM
    ):
        with socket.socket(family, kind, proto) as probe:
            # As gunicorn's own sockets: connections closing in TIME_WAIT do not count.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as error:
                return error.strerror or str(error)
    return None


def pre_fork(server: Any, worker: Any) -> None:
    """Before a web process is forked from the master: every view module is imported (the
    URL patterns resolved), and what the master holds moves out of the garbage collector's
    reach (gc.freeze), so that the web processes' collections never write to those objects'
    pages and all of them keep sharing one copy (docs/benchmarks.md)."""
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - imports every view module once, here
    gc.collect()
    gc.freeze()


def post_fork(server: Any, worker: Any) -> None:
    """In a web process just forked, keep the master's signal queue as the process copied it.

    Until gunicorn gives the process handlers of its own (the worker's init_process), a signal
    it receives runs the master's handler, which only puts it on that queue: the process's
    own copy, which nothing reads. A stop sent in that window was lost: a Ctrl-C or a SIGTERM
    while the master was still starting its processes left one serving until it was killed
    (make run's supervisor waited 10 s, then sent SIGKILL). post_worker_init reads the copy."""
    worker.signals_before_init = server.SIG_QUEUE


def post_worker_init(worker: Any) -> None:
    """Act on the stop signals that reached this web process before it had its own handlers
    (post_fork), now that it has them: SIGTERM stops it gracefully, SIGINT and SIGQUIT at once,
    as they would have. Other signals on the copied queue were the master's, and are left to
    it (a stop of the master's own stops this process too)."""
    pending = getattr(worker, "signals_before_init", None)
    worker.signals_before_init = None
    while pending is not None:
        try:
            number = pending.get_nowait()
        except queue.Empty:
            return
        if number == signal.SIGTERM:
            worker.log.info("Stopping (pid: %s): SIGTERM received while starting", worker.pid)
            worker.alive = False
        elif number in (signal.SIGINT, signal.SIGQUIT):
            worker.handle_quit(number, None)


def child_exit(server: Any, worker: Any) -> None:
    """Tell prometheus-client a web worker process is gone (its live gauges leave /metrics;
    its counters stay in the totals)."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid, folder)  # type: ignore[no-untyped-call]
