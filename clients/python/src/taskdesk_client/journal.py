"""The local journal: every submission's key, written down before its first byte is sent.

One SQLite file holds one row per submission: the key, the endpoint, the tool and its
arguments, and once the server has answered, the receipt (the task id) or the refusal. A row
without either is a submission whose outcome this machine does not know yet; ``resume``
resends it with its own key, and the server's idempotency turns that into the same task.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

SCHEMA = """
CREATE TABLE IF NOT EXISTS submissions (
    key TEXT NOT NULL,
    url TEXT NOT NULL,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    created_at REAL NOT NULL,
    task_id TEXT,
    receipt TEXT,
    error TEXT,
    settled_at REAL,
    PRIMARY KEY (url, key)
)
"""


def default_path() -> Path:
    """``journal.sqlite3`` in the user's data directory (``~/.local/share/taskdesk`` on Linux)."""
    return Path(platformdirs.user_data_dir("taskdesk", appauthor=False)) / "journal.sqlite3"


@dataclass(frozen=True)
class Entry:
    key: str
    url: str
    tool: str
    arguments: dict[str, Any]
    created_at: float
    task_id: str | None
    receipt: dict[str, Any] | None
    error: dict[str, Any] | None

    @property
    def settled(self) -> bool:
        return self.receipt is not None or self.error is not None


class KeyReused(ValueError):
    """A key already journaled for another tool or other arguments."""


class Journal:
    def __init__(self, path: str | Path | None = None) -> None:
        """The journal in the SQLite file PATH (``~`` is the user's home directory), created
        with its folders if missing; without PATH, ``default_path()``."""
        self.path = Path(path).expanduser() if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute(SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        # One short connection per operation: several processes may share the file, and a
        # committed row is on disk (synchronous=FULL) before the call returns.
        with closing(sqlite3.connect(self.path, timeout=30, isolation_level=None)) as db:
            db.execute("PRAGMA synchronous=FULL")
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def record(self, *, key: str, url: str, tool: str, arguments: dict[str, Any]) -> Entry:
        """Write the submission down (or find it, when this key was journaled before for the
        same call) and return its entry. A key journaled for another call raises KeyReused."""
        encoded = json.dumps(arguments, sort_keys=True, separators=(",", ":"))
        with self._connect() as db:
            row = db.execute(_SELECT + " WHERE url = ? AND key = ?", (url, key)).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO submissions (key, url, tool, arguments, created_at)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (key, url, tool, encoded, time.time()),
                )
                row = db.execute(_SELECT + " WHERE url = ? AND key = ?", (url, key)).fetchone()
        entry = _entry(row)
        if entry.tool != tool or entry.arguments != json.loads(encoded):
            raise KeyReused(
                f"Key {key!r} is already journaled for another call ({entry.tool} with "
                f"{json.dumps(entry.arguments, sort_keys=True)}); a new call needs a new key."
            )
        return entry

    def settle(
        self,
        *,
        key: str,
        url: str,
        receipt: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        task_id = receipt.get("taskId") if receipt is not None else None
        with self._connect() as db:
            db.execute(
                "UPDATE submissions SET receipt = ?, task_id = ?, error = ?, settled_at = ?"
                " WHERE url = ? AND key = ?",
                (
                    json.dumps(receipt) if receipt is not None else None,
                    task_id if isinstance(task_id, str) else None,
                    json.dumps(error) if error is not None else None,
                    time.time(),
                    url,
                    key,
                ),
            )

    def get(self, url: str, key: str) -> Entry | None:
        with self._connect() as db:
            row = db.execute(_SELECT + " WHERE url = ? AND key = ?", (url, key)).fetchone()
        return _entry(row) if row is not None else None

    def unsettled(self, url: str | None = None) -> list[Entry]:
        """Submissions without a receipt or a refusal, oldest first (all endpoints when URL is
        None)."""
        query = _SELECT + " WHERE receipt IS NULL AND error IS NULL"
        params: tuple[str, ...] = ()
        if url is not None:
            query += " AND url = ?"
            params = (url,)
        with self._connect() as db:
            rows = db.execute(query + " ORDER BY created_at", params).fetchall()
        return [_entry(row) for row in rows]

    def entries(self) -> list[Entry]:
        with self._connect() as db:
            rows = db.execute(_SELECT + " ORDER BY created_at").fetchall()
        return [_entry(row) for row in rows]


_SELECT = "SELECT key, url, tool, arguments, created_at, task_id, receipt, error FROM submissions"


def _entry(row: tuple[Any, ...]) -> Entry:
    key, url, tool, arguments, created_at, task_id, receipt, error = row
    return Entry(
        key=key,
        url=url,
        tool=tool,
        arguments=json.loads(arguments),
        created_at=created_at,
        task_id=task_id,
        receipt=json.loads(receipt) if receipt is not None else None,
        error=json.loads(error) if error is not None else None,
    )
