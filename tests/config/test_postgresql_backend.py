"""The PostgreSQL backend checks a kept connection only when it may have gone bad: idle for a
while, or closed by the server (config/postgresql)."""

from __future__ import annotations

import select

import pytest
from django.db import close_old_connections, connections

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each health check (Django's ``SELECT 1``) of the default connection."""
    seen: list[bool] = []
    connection = connections["default"]
    original = type(connection).is_usable

    def is_usable(self):  # type: ignore[no-untyped-def]
        seen.append(True)
        return original(self)

    monkeypatch.setattr(type(connection), "is_usable", is_usable)
    request()  # opens the connection, or checks it
    seen.clear()
    return seen


def request() -> None:
    """What Django does around a request with one query: close_old_connections at its start
    and at its end."""
    close_old_connections()
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT 2")
    close_old_connections()


def test_a_connection_used_a_moment_ago_is_not_checked_again(checks) -> None:
    connection = connections["default"]
    assert connection.settings_dict["ENGINE"] == "config.postgresql"
    assert connection.health_check_enabled

    for _ in range(3):
        request()

    assert checks == []


def test_a_connection_idle_for_a_while_is_checked_first(checks) -> None:
    connection = connections["default"]
    connection._last_sound -= connection.HEALTH_CHECK_AFTER_IDLE_SECONDS + 1  # idle since

    request()

    assert checks == [True]


@pytest.fixture
def db_task() -> str:
    return "no-such-task"


def _terminate_backend() -> int:
    """End the default connection's server process from another connection, as a server
    restart does, and wait until its goodbye has reached the socket; return its pid."""
    import psycopg

    connection = connections["default"]
    pid = connection.connection.info.backend_pid
    params = connection.get_connection_params()
    with psycopg.connect(**{**params, "autocommit": True}) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    poller = select.poll()
    poller.register(connection.connection.fileno(), select.POLLIN)
    assert poller.poll(2000)
    return pid


def test_a_connection_the_server_closed_a_moment_ago_is_checked_and_replaced(checks) -> None:
    connection = connections["default"]
    gone = _terminate_backend()

    request()  # no error: checked at the start of the request, and replaced

    assert checks == [True]
    assert connection.connection.info.backend_pid != gone


def test_a_prepared_statement_is_not_sent_on_a_connection_the_server_closed(checks) -> None:
    from tasks_app.db import prepared

    connection = connections["default"]
    gone = _terminate_backend()

    close_old_connections()  # a request starts; its first query is a prepared statement
    assert prepared.fetch_prepared("SELECT 1 + %(n)s", {"n": 1}) == (2,)

    assert checks == [True]
    assert connection.connection.info.backend_pid != gone


def test_a_connection_that_saw_an_error_is_checked(checks) -> None:
    connections["default"].errors_occurred = True

    request()

    assert checks  # Django looks at it before trusting it again


def test_a_connection_plans_its_prepared_statements_again_every_little_while(db_task) -> None:  # type: ignore[no-untyped-def]
    """A plan chosen while a table was small is not kept after it grew: fetch_prepared drops
    the connection's cached plans every PLAN_MAX_AGE_SECONDS (DISCARD PLANS), and the
    statements stay prepared."""
    from tasks_app.db import prepared

    statement = "SELECT count(*) FROM tasks_app_task WHERE id = %(id)s"
    for _ in range(8):
        assert prepared.fetch_prepared(statement, {"id": db_task}) == (0,)
    raw = connections["default"].connection
    aged = prepared._planned_at[raw] - prepared.PLAN_MAX_AGE_SECONDS - 1
    prepared._planned_at[raw] = aged

    assert prepared.fetch_prepared(statement, {"id": db_task}) == (0,)

    assert (
        prepared._planned_at[raw] > aged + prepared.PLAN_MAX_AGE_SECONDS
    )  # plans were dropped now
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements "
            "WHERE statement LIKE 'SELECT count(*) FROM tasks_app_task WHERE id = $1%%'"
        )
        assert cursor.fetchone() == (1,)  # still prepared, not prepared twice


def test_plans_are_dropped_only_when_due() -> None:
    from tasks_app.db import prepared

    class Connection:
        def __init__(self) -> None:
            self.sent: list[str] = []

        def execute(self, statement: str) -> None:
            self.sent.append(statement)

    raw = Connection()
    prepared._replan_if_due(raw)  # type: ignore[arg-type]
    prepared._replan_if_due(raw)  # type: ignore[arg-type]
    assert raw.sent == []
    prepared._planned_at[raw] -= prepared.PLAN_MAX_AGE_SECONDS  # type: ignore[index]
    prepared._replan_if_due(raw)  # type: ignore[arg-type]
    assert raw.sent == ["DISCARD PLANS"]


def test_prepared_statements_keep_one_cursor_per_connection_and_read_timestamps_in_utc() -> None:
    """fetch_prepared runs on a cursor it keeps for the connection (its adapters are made
    once), takes a new one on a new connection, and reads a timestamp as Django does: the
    same moment, in UTC."""
    from datetime import UTC, datetime

    from tasks_app.db import prepared

    connection = connections["default"]
    statement = "SELECT %(at)s::timestamptz, '2026-01-02 03:04:05.123456+05'::timestamptz"
    at = datetime(2026, 12, 4, 18, 0, 0, 250_000, tzinfo=UTC)
    first = prepared.fetch_prepared(statement, {"at": at})
    kept = connection._kept_cursor
    assert prepared.fetch_prepared(statement, {"at": at}) == first
    assert connection._kept_cursor is kept

    with connection.cursor() as cursor:
        cursor.execute("SELECT '2026-01-02 03:04:05.123456+05'::timestamptz")
        (django_read,) = cursor.fetchone()
    assert first == (at, django_read)
    assert first[1].tzinfo == django_read.tzinfo == UTC

    connection.close()
    assert prepared.fetch_prepared(statement, {"at": at}) == first
    assert connection._kept_cursor is not kept
