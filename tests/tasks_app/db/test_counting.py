"""tasks_app.db.counting: capped counts, and the planner's estimates read from PostgreSQL's
statistics (``column_statistics``) rather than asked for one EXPLAIN at a time."""

from __future__ import annotations

import pytest
from django.db import connection

from tasks_app.db.counting import capped_count, column_statistics, planner_estimate
from tasks_app.models import Status, Task


def tasks(client_, n: int, *, tool_name: str = "slow_echo", status: str) -> None:  # type: ignore[no-untyped-def]
    Task.objects.bulk_create(
        Task(client=client_, tool_name=tool_name, arguments={}, status=status) for _ in range(n)
    )


def analyze() -> None:
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tasks_app_task")


@pytest.mark.postgres
def test_the_statistics_give_the_planners_estimate_of_each_value(alice) -> None:  # type: ignore[no-untyped-def]
    # A skewed column: one common tool, a few middling ones, and many more tools with a task or
    # two each than the statistics keep as common values (the planner spreads what the common
    # ones leave over those).
    tasks(alice, 1500, tool_name="export_report", status=Status.COMPLETED)
    for i in range(5):
        tasks(alice, 40 + 10 * i, tool_name=f"middling_{i}", status=Status.FAILED)
    for i in range(400):
        tasks(alice, 1 + i % 2, tool_name=f"rare_{i}", status=Status.WORKING)
    analyze()

    statistics = column_statistics(Task, "tool_name")

    assert statistics is not None
    assert statistics.rows == Task.objects.count()
    assert "export_report" in statistics.shares
    assert statistics.other_share > 0  # not every value is listed: the rare ones are spread
    for tool in ["export_report", "middling_0", "middling_4", "rare_7", "rare_8", "no_such"]:
        planner = planner_estimate(Task.objects.filter(tool_name=tool))
        # The planner never says fewer than one row.
        assert abs(max(statistics.rows_with(tool), 1) - planner) <= 1, tool


@pytest.mark.postgres
def test_a_capped_count_with_a_guess_asks_no_planner(alice) -> None:  # type: ignore[no-untyped-def]
    from django.test.utils import CaptureQueriesContext

    tasks(alice, 30, status=Status.WORKING)
    working = Task.objects.filter(status=Status.WORKING)

    with CaptureQueriesContext(connection) as queries:
        over = capped_count(working, 10, guess=5_000)
        under = capped_count(working, 100, guess=3)
        wrong = capped_count(working, 10, guess=3)  # the statistics were out of date

    assert over.value == 5_000 and over.estimate  # not counted at all
    assert under.value == 30 and not under.estimate
    assert wrong.value == 11 and wrong.estimate  # more than it counted, and said so
    assert not [q for q in queries.captured_queries if q["sql"].startswith("EXPLAIN")]


def test_sqlite_has_no_statistics_and_counts_exactly(alice) -> None:  # type: ignore[no-untyped-def]
    if connection.vendor != "sqlite":
        pytest.skip("what SQLite does")
    tasks(alice, 12, status=Status.COMPLETED)

    assert column_statistics(Task, "status") is None
    counted = capped_count(Task.objects.filter(status=Status.COMPLETED), 5)
    assert counted.value == 12 and not counted.estimate
