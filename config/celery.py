"""The Celery application. Settings come from Django's settings under the CELERY_ prefix."""

from __future__ import annotations

import gc
import os
import time
from typing import Any

import click
from celery import Celery
from celery.signals import (
    import_modules,
    worker_before_create_process,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
)
from kombu.transport import TRANSPORT_ALIASES

from .control import EmbeddedBeat
from .env import load_settings, settings_errors_end_the_process

# "filesystem://" (the embedded default broker) means the atomic variant in config.broker.
# This package is `config` in the repository and `taskdesk` once installed (setup.py).
TRANSPORT_ALIASES["filesystem"] = f"{__package__}.broker:Transport"

os.environ.setdefault("DJANGO_SETTINGS_MODULE", f"{__package__}.settings")
# Celery's Django fixup runs Django's system checks when a worker starts. They belong to
# manage.py (`migrate` runs them at every release; ours are deploy checks), and in a worker
# their URL checks import every view, the REST framework and the OpenAPI generator, which
# no job uses: 27 MiB of each worker's memory (docs/benchmarks.md).
os.environ.setdefault("CELERY_SKIP_CHECKS", "1")


# A malformed setting ends `celery worker` and `celery beat` with one line naming it
# (config/env.py), in two steps. The settings are first read when Celery reads its own
# configuration (on_configure below: while it parses its command line). Django's apps,
# whose ready() checks TASKDESK_TOOLSETS, are set up before Celery imports the task modules
# (import_modules); Celery's Django fixup does that too, but it runs inside a signal, which
# logs an exception with its traceback and goes on. This receiver is connected before the
# app is made (the fixup connects then), so it runs first.
@import_modules.connect
def _set_up_django(sender: Any = None, **kwargs: Any) -> None:
    from django.apps import apps

    if apps.ready or apps.loading:
        return
    import django

    with settings_errors_end_the_process():
        django.setup()


app = Celery("taskdesk")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# The control worker's beat, in a thread of its own process (config/control.py).
app.user_options["worker"].add(
    click.Option(
        ["--embed-beat/--no-embed-beat"],
        default=False,
        help="Send the periodic jobs from a thread of this worker (beat without a process).",
    )
)
app.steps["worker"].add(EmbeddedBeat)


@app.on_configure.connect
def _load_settings(**kwargs: Any) -> None:
    load_settings()


@worker_init.connect
def _legs_yield_the_cpu(sender: Any = None, **kwargs: Any) -> None:
    """A leg worker runs below the web processes on a shared host (``WORKER_NICE``): under
    load, answering a call with its receipt comes before running the legs already queued,
    which keep nobody's request waiting. The control worker keeps its priority, so that the
    sweeper, deadlines and retries are not held back. Runs before the pool is forked, so
    the pool processes inherit it."""
    from django.conf import settings

    queues = set(sender.app.amqp.queues.consume_from) if sender is not None else set()
    if queues and settings.TASKDESK_CONTROL_QUEUE not in queues:
        run_below(settings.WORKER_NICE)


@worker_before_create_process.connect
def _share_what_is_loaded(**kwargs: Any) -> None:
    """Before a pool process is forked: what the main process has loaded (Django, the apps,
    the tools) moves out of the garbage collector's reach, so that the child's collections
    never write to those objects' pages and the two processes keep sharing them (copy on
    write copies a page at its first write). Measured in docs/benchmarks.md."""
    gc.collect()
    gc.freeze()


def run_below(nice: int) -> None:
    """Run this process (and the processes it forks) at ``nice``, and its session too.

    Linux with autogroup (the default where processes are not placed in CPU cgroups) shares
    the CPU between sessions first and only then between the processes of a session, so a
    nice value alone ranks a process only against its own session. `make run`'s supervisor
    starts every process in a session of its own, so the session's scheduling group takes
    the same value. Only a process that leads its session does that, so a worker started
    from a terminal leaves the terminal's other processes alone. A priority can only be
    lowered here: a process already below ``nice`` stays where it is.
    """
    if nice <= 0:
        return
    if os.getpriority(os.PRIO_PROCESS, 0) < nice:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    if os.getsid(0) != os.getpid():
        return
    for _attempt in range(5):
        try:
            with open("/proc/self/autogroup", "w") as group:
                group.write(str(nice))
            return
        except BlockingIOError:  # the kernel takes one such change per 100 ms from a user
            time.sleep(0.1)
        except OSError:  # no autogroup in this kernel, or not Linux
            return


# For the fault tests only: TASKDESK_TEST_CLOCK_SKEW_SECONDS makes every pool process of a
# worker run with its clock that many seconds off (time-machine, a development dependency),
# to show that leases never depend on a worker's clock. Never set it in production.
@worker_process_init.connect
def _skew_clock_for_tests(**kwargs: Any) -> None:
    skew = os.environ.get("TASKDESK_TEST_CLOCK_SKEW_SECONDS")
    if not skew:
        return
    import datetime

    import time_machine

    now = datetime.datetime.now(datetime.UTC)
    time_machine.travel(now + datetime.timedelta(seconds=float(skew)), tick=True).start()


@worker_process_shutdown.connect
def _mark_metrics_process_dead(pid: int | None = None, **kwargs: object) -> None:
    # A pool process that exits leaves its counters in the totals of /metrics; its live
    # gauges (none today) would leave them. A process killed outright cannot say so: its
    # files simply stay, which is right for counters.
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid(), folder)  # type: ignore[no-untyped-call]
