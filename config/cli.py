"""The ``taskdesk`` command: each process of the Procfile, and Django's commands.

``taskdesk serve``, ``worker``, ``control`` and ``beat`` replace themselves (exec) with the
process the Procfile starts under that name, with the same options; what follows the
command's name is added after them (``taskdesk worker -n worker2@%h --concurrency 4``).
``taskdesk migrate``, ``bootstrap`` and ``manage ...`` are ``manage.py``'s commands. Every
one of them defaults ``DJANGO_SETTINGS_MODULE`` to this package's settings, so an installed
Taskdesk needs nothing named but its environment variables (docs/deploy.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

# This package: `config` in the repository, `taskdesk` once installed from the wheel (setup.py).
PACKAGE = __name__.rpartition(".")[0]
FOLDER = Path(__file__).resolve().parent


def _celery(*args: str) -> list[str]:
    """``celery -A PACKAGE [--quiet] ARGS --loglevel LOG_LEVEL``, as the Procfile has it."""
    quiet = ["--quiet"] if os.environ.get("LOG_FORMAT") == "json" else []
    level = os.environ.get("LOG_LEVEL") or "INFO"
    return [sys.executable, "-m", "celery", "-A", PACKAGE, *quiet, *args, "--loglevel", level]


def serve_command() -> list[str]:
    return [
        sys.executable,
        "-m",
        "gunicorn",
        f"{PACKAGE}.wsgi",
        "-c",
        str(FOLDER / "gunicorn.conf.py"),
    ]


def worker_command() -> list[str]:
    return [*_celery("worker", "--pool", "prefork", "--queues", "celery"), "-n", "worker@%h"]


def _schedule() -> str:
    return str(Path(os.environ.get("TASKDESK_VAR_DIR") or "var") / "celerybeat-schedule")


def control_command() -> list[str]:
    control = ("worker", "--pool", "solo", "--queues", "control", "--embed-beat", "-s", _schedule())
    return [*_celery(*control), "-n", "control@%h"]


def beat_command() -> list[str]:
    return [*_celery("beat"), "-s", _schedule()]


PROCESSES: dict[str, tuple[Callable[[], list[str]], str]] = {
    "serve": (serve_command, f"the web server: gunicorn {PACKAGE}.wsgi with its gunicorn.conf.py"),
    "worker": (worker_command, "a leg worker (Celery, the `celery` queue, node worker@HOST)"),
    "control": (
        control_command,
        "the control worker (the `control` queue, one job at a time) with beat in a thread",
    ),
    "beat": (beat_command, "beat alone, for a control worker started with --no-embed-beat"),
}
COMMANDS = {
    "migrate": "manage.py migrate: the database's tables, once per release",
    "bootstrap": "manage.py bootstrap: a demo operator and client, and the client's token",
    "manage": "any manage.py command (`taskdesk manage help` lists them)",
}


def manage(argv: Sequence[str]) -> None:
    """Run Django's command line ARGV (``[program, command, ...]``), as manage.py does."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", f"{PACKAGE}.settings")
    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    from .env import one_line

    try:
        execute_from_command_line(list(argv))
    except ImproperlyConfigured as error:
        if apps.ready:  # raised by the command itself: its traceback says where
            raise
        # Loading the settings or setting the apps up failed: a malformed setting, which
        # ends the command with one line naming it (config/env.py).
        raise SystemExit(one_line(error)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="taskdesk",
        description="Taskdesk: a server for long-running MCP tool calls. Arguments after a "
        "command go to the program it runs (gunicorn, celery, manage.py).",
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name, (_, text) in PROCESSES.items():
        commands.add_parser(name, help=text)
    for name, text in COMMANDS.items():
        commands.add_parser(name, help=text)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in {*PROCESSES, *COMMANDS}:
        parser = _parser()
        if args and args[0] not in {"-h", "--help"}:
            parser.error(f"unknown command {args[0]!r}")
        parser.print_help()
        raise SystemExit(0 if args else 2)
    name, rest = args[0], args[1:]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", f"{PACKAGE}.settings")
    if name in PROCESSES:
        command = [*PROCESSES[name][0](), *rest]
        sys.stdout.flush()
        os.execv(command[0], command)
    if name == "manage":
        manage(["taskdesk", *rest])
    else:
        manage(["taskdesk", name, *rest])


if __name__ == "__main__":
    main()
