"""The data migration that gives every pending question a deadline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = ("elicitations", "0001_initial")
AFTER = ("elicitations", "0002_default_deadlines")
UPGRADED = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


def migrate(target: tuple[str, str]) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.migrate([target])
    return executor


@pytest.fixture(autouse=True)
def _latest_afterwards():  # type: ignore[no-untyped-def]
    """Leave the database at the latest migrations for the tests that run after these."""
    yield
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_pending_questions_without_a_deadline_get_the_default_from_the_upgrade(
    task, settings
) -> None:
    settings.TASKDESK_QUESTION_DEADLINE_SECONDS = 3600
    old = migrate(BEFORE).loader.project_state([BEFORE]).apps
    requests = old.get_model("elicitations", "InputRequest")
    fields = {"task_id": task.pk, "ask_key": "q", "message": "?"}
    requests.objects.create(key="a", **fields)
    requests.objects.create(key="b", status="answered", **fields)
    own = datetime(2030, 1, 1, tzinfo=UTC)
    requests.objects.create(key="c", deadline=own, **fields)

    with time_machine.travel(UPGRADED, tick=False):
        migrate(AFTER)

    deadlines = dict(requests.objects.values_list("key", "deadline"))
    assert deadlines == {"a": UPGRADED + timedelta(hours=1), "b": None, "c": own}
