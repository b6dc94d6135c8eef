"""config.preload, what `make run`'s supervisor imports before it forks the stack's processes
(their sharing is shown with real processes in tests/deploy/test_run_procfile.py)."""

from __future__ import annotations

import gc
import importlib
import sys

from django.db import connections


def test_it_loads_the_programs_and_the_application_without_a_connection_and_freezes_it() -> None:
    opened_before = {alias for alias in connections if connections[alias].connection is not None}
    sys.modules.pop("config.preload", None)
    gc.unfreeze()
    try:
        importlib.import_module("config.preload")
        frozen = gc.get_freeze_count()
    finally:
        gc.unfreeze()  # this test process keeps collecting what it loaded

    assert frozen > 10_000  # everything loaded so far, out of the collector's reach
    for name in (
        "config.wsgi",
        "tasks_app.tasks",  # the leg and control jobs
        "celery.concurrency.prefork",
        "celery.concurrency.solo",
        "gunicorn.app.wsgiapp",
        "gunicorn.workers.gthread",
    ):
        assert name in sys.modules, name
    # A fork must not inherit a database connection: the import opens none.
    opened = {alias for alias in connections if connections[alias].connection is not None}
    assert opened <= opened_before
