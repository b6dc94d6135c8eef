"""Django's SQLite backend, with the processes that write taking turns instead of sleeping.

SQLite has one write lock per database. A writer that finds it taken is not queued: SQLite's
busy handler sleeps and tries again, 1 ms at first and then up to 100 ms between tries, and
whoever tries first after the holder commits takes the lock. Under load (a web process
accepting calls while the worker's legs claim and end their tasks) a writer could lose many
tries in a row: accepted calls waited over a second at the 99th percentile while the lock sat
free between tries.

Here every write goes through an exclusive ``flock`` on a file beside the database (the
database's name with ``-writer``), taken before SQLite's lock and given back when the
transaction ends: a transaction (``BEGIN IMMEDIATE``, the settings' ``transaction_mode``)
takes it at its start and gives it back at its commit or rollback, and a write sent outside a
transaction (autocommit) takes it for that one statement. A writer waiting for its turn sleeps
in the kernel and wakes as soon as the holder gives the turn back, so the lock passes from
one writer to the next without a gap. Each connection opens the file itself, so threads of
one process take turns as processes do, and a killed holder's turn is given back by the
kernel. Readers never take a turn (WAL lets them read beside the writer). SQLite's own busy
handler still covers writers that do not take turns, such as the ``sqlite3`` shell.

An in-memory database has no file beside it, and no other process to share it with: there
writers do not take turns.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Any

from django.db.backends.sqlite3 import base

# Statements that never write: everything else sent outside a transaction takes a turn
# (another statement that writes nothing only waits for a turn it did not need).
_READS = ("SELECT", "PRAGMA", "EXPLAIN")
_NO_TURN = contextlib.nullcontext()


class WriteTurn:
    """One connection's hold on the database's writer lock file."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.held = False

    def take(self) -> None:
        if not self.held:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            self.held = True

    def give_back(self) -> None:
        if self.held:
            self.held = False
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def __enter__(self) -> None:
        self.take()

    def __exit__(self, *exc_info: object) -> None:
        self.give_back()

    def close(self) -> None:
        # Given back first: closing this descriptor alone would not, while a process forked
        # meanwhile (a pool process, a gunicorn worker) still has the file open.
        self.give_back()
        os.close(self._fd)


class Cursor(base.SQLiteCursorWrapper):
    """Django's cursor; a write outside a transaction takes the connection's turn for itself."""

    turn: WriteTurn | None = None

    def execute(self, query: str, params: Any = None) -> Any:
        with self._turn_for(query):
            return super().execute(query, params)

    def executemany(self, query: str, param_list: Any) -> Any:
        with self._turn_for(query):
            return super().executemany(query, param_list)

    def _turn_for(self, query: str) -> contextlib.AbstractContextManager[Any]:
        """The turn QUERY takes for itself: none for a read, or inside a transaction's turn."""
        turn = self.turn
        if (
            turn is None
            or turn.held
            or self.connection.in_transaction
            or query.lstrip(" \n\t(")[:7].upper().startswith(_READS)
        ):
            return _NO_TURN
        return turn


class DatabaseWrapper(base.DatabaseWrapper):
    _turn: WriteTurn | None = None

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        connection = super().get_new_connection(conn_params)
        if self._turn is not None:  # the last connection's, if it was not closed
            self._turn.close()
            self._turn = None
        if not self.is_in_memory_db():
            self._turn = WriteTurn(f"{self.settings_dict['NAME']}-writer")
        return connection

    def create_cursor(self, name: str | None = None) -> Any:
        cursor = self.connection.cursor(factory=Cursor)
        cursor.turn = self._turn
        return cursor

    # Django's private hooks (not in django-stubs, hence the ignores): a transaction's start,
    # its commit and rollback, and closing the connection.

    def _start_transaction_under_autocommit(self) -> None:
        if self._turn is not None:
            self._turn.take()
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]
        except BaseException:
            self._give_back_after_transaction()
            raise

    def _commit(self) -> None:
        try:
            super()._commit()  # type: ignore[misc]
        finally:
            self._give_back_after_transaction()

    def _rollback(self) -> None:
        try:
            super()._rollback()  # type: ignore[misc]
        finally:
            self._give_back_after_transaction()

    def _give_back_after_transaction(self) -> None:
        in_transaction = self.connection is not None and self.connection.in_transaction
        if self._turn is not None and not in_transaction:
            self._turn.give_back()

    def _close(self) -> None:
        try:
            super()._close()  # type: ignore[misc]
        finally:
            if self._turn is not None:
                self._turn.close()
                self._turn = None
