"""The two implementations of ``tasks_app.db.Backend`` do the same: one scenario that runs
every operation of the protocol (``parity_scenario``) runs on a fresh SQLite database and on a
fresh PostgreSQL database, and what each operation returned and the rows left must be the same.

Each database gets a process of its own (Django chooses its backend once per process). Needs
PostgreSQL (the server of DATABASE_URL), where it creates a database of its own and drops it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tasks_app.db import Backend

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[3]

# What differs by design, per operation: standing by needs PostgreSQL's LISTEN/NOTIFY.
DIFFERENT_BY_DESIGN = {"can_stand_by", "stand_by"}


def protocol_members() -> set[str]:
    """Every operation and attribute of the protocol."""
    members = {name for name in vars(Backend) if not name.startswith("_")}
    return members | set(Backend.__annotations__)


def _python() -> list[str]:
    """How the scenario's process starts: under coverage when this run measures it (`make test
    COVERAGE=1`, CI's PostgreSQL run), so that the SQLite backend, which no other test of that
    run reaches, is counted. Its data file (``.coverage.<host>.<pid>.<random>``) is combined
    with the run's own at the end."""
    import coverage

    if coverage.Coverage.current() is None:
        return [sys.executable]
    return [sys.executable, "-m", "coverage", "run", "--parallel-mode"]


def _run(database_url: str, var_dir: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "TASKDESK_VAR_DIR": str(var_dir),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [*_python(), "-m", "tests.tasks_app.db.parity_scenario"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    import psycopg
    import psycopg.conninfo

    server = os.environ.get("DATABASE_URL", "")
    if not server.startswith("postgres"):
        pytest.skip("needs PostgreSQL (DATABASE_URL=postgres://...)")
    name = f"taskdesk_parity_{uuid.uuid4().hex[:8]}"
    admin = psycopg.conninfo.make_conninfo(server, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        postgresql_url = server.rsplit("/", 1)[0] + "/" + name
        var = tmp_path_factory.mktemp("parity")
        return {
            "sqlite": _run(f"sqlite:///{var / 'parity.sqlite3'}", var / "sqlite"),
            "postgresql": _run(postgresql_url, var / "postgresql"),
        }
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_scenario_runs_every_operation_of_the_protocol(results) -> None:  # type: ignore[no-untyped-def]
    for backend, result in results.items():
        assert set(result["returned"]) == protocol_members(), backend


@pytest.mark.parametrize("operation", sorted(protocol_members() - DIFFERENT_BY_DESIGN))
def test_both_backends_return_the_same(results, operation: str) -> None:  # type: ignore[no-untyped-def]
    assert results["sqlite"]["returned"][operation] == results["postgresql"]["returned"][operation]


def test_standing_by_is_postgresqls_alone(results) -> None:  # type: ignore[no-untyped-def]
    assert results["sqlite"]["returned"]["can_stand_by"] == [False]
    assert results["sqlite"]["returned"]["stand_by"] == ["NotImplementedError"]
    assert results["postgresql"]["returned"]["can_stand_by"] == [True]
    assert results["postgresql"]["returned"]["stand_by"] == [[[True, "parity"]]]


@pytest.mark.parametrize(
    "table",
    [
        "tasks_app_task",
        "tasks_app_taskevent",
        "tasks_app_dispatch",
        "tasks_app_journalentry",
        "tasks_app_drainer",
        "tasks_app_outboxmessage",
        "elicitations_inputrequest",
    ],
)
def test_both_backends_leave_the_same_rows(results, table: str) -> None:  # type: ignore[no-untyped-def]
    assert results["sqlite"]["rows"][table] == results["postgresql"]["rows"][table]
