"""On SQLite, writers take turns on a lock file beside the database (config/sqlite): a
transaction holds the turn from its start to its commit or rollback, a write outside one holds
it for that statement, and reads never take it."""

from __future__ import annotations

import fcntl
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections, transaction
from django.db.utils import ConnectionHandler


def added(monkeypatch: pytest.MonkeyPatch, alias: str, name: str) -> Any:
    """A connection of the backend named ALIAS among Django's, to the database NAME."""
    configured = ConnectionHandler({"default": {"ENGINE": "config.sqlite", "NAME": name}})
    monkeypatch.setitem(connections.settings, alias, configured.settings["default"])
    return connections[alias]


@pytest.fixture
def database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, django_db_blocker: Any
) -> Iterator[Any]:
    """A connection of the backend to a database of its own, with a table."""
    with django_db_blocker.unblock():
        connection = added(monkeypatch, "own", str(tmp_path / "own.sqlite3"))
        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE item (n integer)")
        yield connection
        connection.close()
        del connections["own"]


def turn_is_free(connection: Any) -> bool:
    """Whether another holder could take the writers' turn now (a file of its own)."""
    fd = os.open(f"{connection.settings_dict['NAME']}-writer", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # gives back what it took
    return True


@pytest.fixture
def held_turn(database: Any) -> Iterator[int]:
    """The writers' turn, held by another holder until the test gives it back."""
    fd = os.open(f"{database.settings_dict['NAME']}-writer", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield fd
    os.close(fd)


def test_a_transaction_holds_the_turn_until_it_commits(database) -> None:  # type: ignore[no-untyped-def]
    assert turn_is_free(database)
    with transaction.atomic(using="own"):
        with database.cursor() as cursor:
            cursor.execute("INSERT INTO item VALUES (1)")
        assert not turn_is_free(database)
    assert turn_is_free(database)


def test_a_rolled_back_transaction_gives_the_turn_back(database) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RuntimeError), transaction.atomic(using="own"):
        with database.cursor() as cursor:
            cursor.execute("INSERT INTO item VALUES (1)")
        raise RuntimeError("undone")
    assert turn_is_free(database)
    with database.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM item")
        assert cursor.fetchone() == (0,)


def test_a_write_outside_a_transaction_waits_for_the_turn(database, held_turn) -> None:  # type: ignore[no-untyped-def]
    written = threading.Event()

    def write() -> None:
        with database.cursor() as cursor:
            cursor.execute("INSERT INTO item VALUES (2)")
        written.set()

    database.inc_thread_sharing()
    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert not written.wait(0.3)  # waiting for the turn, not for SQLite's busy handler
        fcntl.flock(held_turn, fcntl.LOCK_UN)
        started = time.monotonic()
        assert written.wait(5)
        assert time.monotonic() - started < 0.5
    finally:
        fcntl.flock(held_turn, fcntl.LOCK_UN)
        writer.join(5)
        database.dec_thread_sharing()
    assert turn_is_free(database)


def test_reads_do_not_take_a_turn(database, held_turn) -> None:  # type: ignore[no-untyped-def]
    with database.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM item")
        assert cursor.fetchone() == (0,)
        cursor.execute("\n  select 1 UNION ALL SELECT 2")
        cursor.execute("PRAGMA journal_mode")


def test_closing_the_connection_gives_the_turn_back(database) -> None:  # type: ignore[no-untyped-def]
    transaction.atomic(using="own").__enter__()
    assert not turn_is_free(database)
    database.close()
    assert turn_is_free(database)


def test_closing_gives_the_turn_back_while_a_forked_process_has_the_file(database) -> None:  # type: ignore[no-untyped-def]
    transaction.atomic(using="own").__enter__()
    child = os.fork()
    if child == 0:  # holds the inherited descriptors until it is killed
        time.sleep(30)
        os._exit(0)
    try:
        database.close()
        assert turn_is_free(database)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_an_in_memory_database_takes_no_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, django_db_blocker: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    with django_db_blocker.unblock():
        connection = added(monkeypatch, "memory", ":memory:")
        with transaction.atomic(using="memory"), connection.cursor() as cursor:
            cursor.execute("CREATE TABLE item (n integer)")
            cursor.execute("INSERT INTO item VALUES (1)")
        connection.close()
        del connections["memory"]
    assert list(tmp_path.iterdir()) == []  # no lock file, here or as ":memory:-writer"
