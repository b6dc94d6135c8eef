"""The folders a Taskdesk process writes, made when the apps are set up (TasksAppConfig.ready)
rather than when the settings are imported: importing the settings writes nothing.

VAR_DIR (owner-only when made here), the static files' root (whitenoise warns at start-up when
it is missing), the embedded broker's queue, prometheus-client's multiprocess folder, and the
SQLite database (made empty and owner-only: it holds session keys and password hashes). A
folder that cannot be made (a read-only filesystem where a deployment mounts none) is logged
and left: what needs it fails then, with its own error, and a web process that needs none of
them (PostgreSQL, Redis, a mounted metrics folder) starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def prepare(settings: Any) -> list[str]:
    """Make the folders SETTINGS name; return what could not be made (and log it)."""
    problems = []
    folders = [(Path(settings.VAR_DIR), 0o700), (Path(settings.STATIC_ROOT), 0o777)]
    queue = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("data_folder_in")
    if queue:
        folders.append((Path(queue), 0o777))
    folders.append((Path(settings.PROMETHEUS_MULTIPROC_DIR), 0o777))
    database = settings.DATABASES["default"]
    sqlite = database["ENGINE"] == f"{settings.SETTINGS_PACKAGE}.sqlite"
    name = str(database["NAME"])
    if sqlite and not name.startswith((":", "file:")):
        folders.append((Path(name).parent, 0o777))
    for folder, mode in folders:
        try:
            folder.mkdir(mode=mode, parents=True, exist_ok=True)
        except OSError as exc:
            problems.append(f"{folder}: {exc.strerror or exc}")
    if sqlite and not name.startswith((":", "file:")):
        try:
            private_sqlite(Path(name))
        except OSError as exc:
            problems.append(f"{name}: {exc.strerror or exc}")
    for problem in problems:
        log.warning("cannot make %s", problem)
    return problems


def private_sqlite(path: Path) -> None:
    """Make the SQLite database at PATH owner-only (0600), creating it empty if need be. SQLite
    gives its -wal and -shm files the database's mode; ones an earlier version left readable
    are narrowed too."""
    with contextlib.suppress(FileExistsError):  # an existing one is not opened here
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        with contextlib.suppress(FileNotFoundError, PermissionError):  # another owner's: as is
            if file.stat().st_mode & 0o077:
                file.chmod(0o600)
