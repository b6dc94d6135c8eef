"""Gunicorn settings for `make run` (HOST, PORT, WEB_WORKERS, WEB_THREADS from the environment)."""

from __future__ import annotations

import multiprocessing
import os

_host = os.environ.get("HOST", "127.0.0.1")
# Honcho gives every process its own PORT; TASKDESK_PORT keeps the one the user chose.
_port = os.environ.get("TASKDESK_PORT") or os.environ.get("PORT", "8000")
bind = [f"{_host}:{_port}"]
workers = int(os.environ.get("WEB_WORKERS") or multiprocessing.cpu_count() * 2 + 1)
# Threads keep a streaming (SSE) response from blocking a whole worker process.
worker_class = "gthread"
threads = int(os.environ.get("WEB_THREADS") or 4)
timeout = 120
graceful_timeout = 10
keepalive = 5
accesslog = os.environ.get("WEB_ACCESS_LOG") or None
errorlog = "-"
loglevel = os.environ.get("LOG_LEVEL", "info").lower()
proc_name = "taskdesk-web"
