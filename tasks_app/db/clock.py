"""The database's clock, as SQL: every lease expiry is set and compared on it, never on a
worker's clock. This is the only place it is written; the statements of each backend embed
its expressions, and the few writes made through the ORM compare with ``SQLITE_NOW`` too.

PostgreSQL's is the time of the statement, not of its transaction (``now()``), even inside
one. SQLite's has the text form Django stores a time in, so that the two compare as text.
"""

from __future__ import annotations

SQLITE_NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
POSTGRESQL_NOW = "statement_timestamp()"


def sqlite_later(seconds: str) -> str:
    """The database's time plus the seconds (a number) of the parameter named SECONDS."""
    return f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('%%f seconds', %({seconds})s))"


def postgresql_later(seconds: str) -> str:
    """The database's time plus the seconds (a number) of the parameter named SECONDS."""
    return f"(statement_timestamp() + make_interval(secs => %({seconds})s))"
