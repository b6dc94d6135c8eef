"""The var folder and the SQLite database are the owner's alone: the database holds session
keys and password hashes, like the secret key beside it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.config.test_settings import run


def manage(var: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``manage.py ARGS`` with VAR as TASKDESK_VAR_DIR and the secret key generated there."""
    no_key = {"SECRET_KEY": "", "SECRET_KEY_FILE": ""}
    return run([sys.executable, "manage.py", *args], no_key, var, timeout=300)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_fresh_var_folder_and_its_database_are_owner_only_after_migrate(tmp_path) -> None:  # type: ignore[no-untyped-def]
    var = tmp_path / "var"
    umask = os.umask(0o022)  # the usual one, which made them 0755 and 0644
    try:
        migrated = manage(var, "migrate", "--noinput")
        # Another process writes (the WAL stays while a connection is open): still owner-only.
        shell = manage(
            var,
            "shell",
            "-c",
            "from django.db import connection; c = connection.cursor(); "
            "c.execute('CREATE TABLE probe (x)'); import os, stat; "
            "print(oct(stat.S_IMODE(os.stat(connection.settings_dict['NAME'] + '-wal').st_mode)))",
        )
    finally:
        os.umask(umask)

    assert migrated.returncode == 0, migrated.stderr
    assert shell.returncode == 0, shell.stderr
    assert mode(var) == 0o700
    assert mode(var / "secret_key") == 0o600
    assert mode(var / "taskdesk.sqlite3") == 0o600
    assert shell.stdout.split()[-1] == "0o600"  # the WAL, as SQLite made it
    assert mode(var / "taskdesk.sqlite3-writer") == 0o600  # the writers' turns (config/sqlite)
    for leftover in (var / "taskdesk.sqlite3-wal", var / "taskdesk.sqlite3-shm"):
        if leftover.exists():
            assert mode(leftover) == 0o600


def test_a_database_an_earlier_version_left_readable_is_narrowed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    var = tmp_path / "var"
    var.mkdir()
    assert manage(var, "migrate", "--noinput").returncode == 0
    database = var / "taskdesk.sqlite3"
    database.chmod(0o644)

    assert manage(var, "check").returncode == 0

    assert mode(database) == 0o600
