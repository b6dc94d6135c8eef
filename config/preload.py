"""What `make run`'s supervisor loads before it forks the stack's processes.

``scripts/run_procfile.py --preload config.preload`` imports this module once, then starts
the web server and the two Celery workers as forks of itself instead of fresh interpreters.
Every module they all load (Django and the apps, the tools, Celery, gunicorn, the database
and broker clients) is then one copy in memory for all eight processes of the stack, where
each of the three programs used to hold its own (measured in docs/benchmarks.md).

Only imports happen here: no database connection, no broker connection and no thread, since
a fork copies none of those correctly. Each program then starts as it would from its own
command line (the worker's signals, the web server's hooks), in its own process.
"""

from __future__ import annotations

import gc
import importlib

import django

from .celery import app
from .env import settings_errors_end_the_process

with settings_errors_end_the_process():
    django.setup()

# The task modules of every app (the leg and control jobs, the tools they run).
app.loader.import_default_modules()

from django.urls import get_resolver  # noqa: E402 - after django.setup()

get_resolver().url_patterns  # noqa: B018 - imports every view module, as the web's pre_fork does

# The programs' own modules: their command lines, the worker's parts and pools, the web
# server and its workers; then the application gunicorn's master loads.
for name in (
    "celery.apps.worker",
    "celery.bin.celery",
    "celery.concurrency.prefork",
    "celery.concurrency.solo",
    "celery.worker.consumer",
    "gunicorn.app.wsgiapp",
    "gunicorn.workers.gthread",
    f"{__package__}.wsgi",
):
    importlib.import_module(name)

# What is loaded stays out of the garbage collector's reach, so that no process's
# collections write to those objects' pages (gunicorn's pre_fork and the worker's
# worker_before_create_process do the same before their own forks).
gc.collect()
gc.freeze()
